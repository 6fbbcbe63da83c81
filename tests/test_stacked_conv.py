"""The stacked convolutions' lowerings (``Federation(stacked_conv=...)``) compute ``F.conv2d`` and its gradients.

Each lowering is checked against ``F.conv2d`` in float64 (values and gradients of input, weight and bias) over
strides, paddings, dilations, groups and an unbatched input; under ``vmap`` with per-client and shared weights, a
nested per-sample ``vmap`` and ``torch.func.grad`` inside and outside the ``vmap``; under CPU autocast; and in a
federation, where every lowering's round equals the default's.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from helpers import bare_trainer, float64, tiny_run
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap
from torch.utils._python_dispatch import TorchDispatchMode

from fl_lightning import FederatedDataModule, Federation
from fl_lightning.core.models import build_model
from fl_lightning.core.stacked_conv import STACKED_CONVS, conv2d_loop, conv2d_matmul, lowered_convolutions
from fl_lightning.methods import METHODS

LOWERED: dict[str, Callable[..., Tensor]] = {"matmul": conv2d_matmul, "loop": conv2d_loop}

# (input [N, C, H, W] or [C, H, W], out channels, kernel, conv2d's keyword arguments)
CASES: list[tuple[tuple[int, ...], int, tuple[int, int], dict[str, Any]]] = [
    ((2, 3, 9, 9), 4, (3, 3), {}),
    ((2, 3, 9, 9), 4, (5, 5), {"padding": 2}),
    ((2, 3, 10, 9), 4, (3, 2), {"stride": 2, "padding": (1, 0)}),
    ((2, 4, 9, 9), 6, (3, 3), {"dilation": 2, "padding": 1, "groups": 2}),
    ((2, 3, 8, 8), 4, (3, 3), {"padding": "same"}),
    ((2, 3, 8, 8), 4, (2, 4), {"padding": "same", "dilation": (1, 1)}),  # uneven "same": one more after
    ((2, 3, 8, 8), 4, (3, 3), {"padding": "valid"}),
    ((3, 7, 7), 2, (3, 3), {"padding": 1}),  # unbatched input
]


def _grads(conv: Callable[..., Tensor], x: Tensor, w: Tensor, b: Tensor | None, kw: dict[str, Any]) -> list[Tensor]:
    leaves = [t.detach().clone().requires_grad_() for t in (x, w, b) if t is not None]
    y = conv(*leaves[:2], leaves[2] if b is not None else None, **kw)
    r = torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y)
    return [y, *torch.autograd.grad((y * r).sum(), leaves)]


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths")  # F.conv2d's own, for case 5
@pytest.mark.parametrize("lowering", sorted(LOWERED))
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_lowerings_compute_conv2d_and_its_gradients(lowering: str, bias: bool, case: int) -> None:
    shape, out_channels, kernel, kw = CASES[case]
    gen = torch.Generator().manual_seed(case)
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    w = torch.randn(out_channels, shape[-3] // kw.get("groups", 1), *kernel, generator=gen, dtype=torch.float64)
    b = torch.randn(out_channels, generator=gen, dtype=torch.float64) if bias else None
    expected = _grads(F.conv2d, x, w, b, kw)
    got = _grads(LOWERED[lowering], x, w, b, kw)
    assert [t.shape for t in got] == [t.shape for t in expected]
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10)


def _stacked(k: int = 3, batch: int = 4, dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(k, batch, 2, 7, 7, generator=gen, dtype=dtype)
    w = torch.randn(k, 5, 2, 3, 3, generator=gen, dtype=dtype)
    b = torch.randn(k, 5, generator=gen, dtype=dtype)
    r = torch.randn(k, batch, 5, 7, 7, generator=gen, dtype=dtype)
    return x, w, b, r


def _loss(conv: Callable[..., Tensor], w: Tensor, b: Tensor, x: Tensor, r: Tensor) -> Tensor:
    return (torch.tanh(conv(x, w, b, padding=1)) * r).sum()


@pytest.mark.parametrize("lowering", sorted(LOWERED))
def test_lowerings_under_vmap_and_grad_equal_the_grouped_rule(lowering: str) -> None:
    x, w, b, r = _stacked()
    conv = LOWERED[lowering]
    # per-client weights: vmap of grad (each client's own gradient) and grad of the vmapped sum
    for transform in (
        lambda f: vmap(grad(f, argnums=(0, 1))),
        lambda f: grad(lambda *a: vmap(f)(*a).sum(), argnums=(0, 1)),
    ):
        expected = transform(functools.partial(_loss, F.conv2d))(w, b, x, r)
        got = transform(functools.partial(_loss, conv))(w, b, x, r)
        for g, e in zip(got, expected, strict=True):
            torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10)
    # shared weights (a teacher's), the inputs stacked: the gradient sums over clients
    shared = (w[0], b[0])
    expected = grad(lambda w0, b0: vmap(functools.partial(_loss, F.conv2d, w0, b0))(x, r).sum(), (0, 1))(*shared)
    got = grad(lambda w0, b0: vmap(functools.partial(_loss, conv, w0, b0))(x, r).sum(), (0, 1))(*shared)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("lowering", sorted(LOWERED))
def test_lowerings_under_a_nested_per_sample_vmap(lowering: str) -> None:
    """The padded short batch's loss: a per-sample ``vmap`` inside the clients' ``vmap``."""
    x, w, b, r = _stacked()

    def per_sample(conv: Callable[..., Tensor], wk: Tensor, bk: Tensor, xk: Tensor, rk: Tensor) -> Tensor:
        one = vmap(lambda xi, ri: _loss(conv, wk, bk, xi.unsqueeze(0), ri.unsqueeze(0)))
        return one(xk, rk).sum()

    expected = grad(lambda w, b: vmap(functools.partial(per_sample, F.conv2d))(w, b, x, r).sum(), (0, 1))(w, b)
    got = grad(lambda w, b: vmap(functools.partial(per_sample, LOWERED[lowering]))(w, b, x, r).sum(), (0, 1))(w, b)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("lowering", sorted(LOWERED))
def test_a_network_runs_its_convolutions_lowered_within_the_context(
    lowering: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    net = build_model("lenet", 1, 8, 10).double()
    params = {n: torch.stack([p.detach(), p.detach() * 0.9]) for n, p in net.named_parameters()}
    x = torch.randn(2, 4, 1, 8, 8, dtype=torch.float64)
    y = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]])

    def loss(p: dict[str, Tensor], xi: Tensor, yi: Tensor) -> Tensor:
        return F.cross_entropy(functional_call(net, p, (xi,)), yi)

    expected = vmap(grad(loss))(params, x, y)
    calls: list[str] = []
    import fl_lightning.core.stacked_conv as stacked_conv

    def counted(*args: Any, **kwargs: Any) -> Tensor:
        calls.append(lowering)
        return LOWERED[lowering](*args, **kwargs)

    monkeypatch.setitem(stacked_conv._LOWERED, lowering, counted)
    with lowered_convolutions(lowering):
        got = vmap(grad(loss))(params, x, y)
    assert len(calls) == 2  # lenet's two convolutions
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-9, atol=1e-12)
    with lowered_convolutions("grouped"):
        vmap(grad(loss))(params, x, y)
    assert len(calls) == 2  # the default runs F.conv2d as it is
    with pytest.raises(ValueError, match="stacked_conv must be one of grouped, matmul, loop, got 'fft'"):
        with lowered_convolutions("fft"):
            pass


@pytest.mark.parametrize("lowering", sorted(LOWERED))
def test_lowerings_cast_as_autocast_casts_a_convolution(lowering: str) -> None:
    """As each client's own convolution is cast (CUDA's autocast casts ``vmap``'s grouped one too; CPU's does not)."""
    x, w, b, _ = _stacked(dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = torch.stack([F.conv2d(xi, wi, bi, padding=1) for xi, wi, bi in zip(x, w, b, strict=True)])
        with lowered_convolutions(lowering):
            got = vmap(lambda xi, wi, bi: F.conv2d(xi, wi, bi, padding=1))(x, w, b)
    assert got.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected.float(), rtol=1e-2, atol=2e-2)


def test_the_loop_refuses_a_second_derivative_with_what_to_use() -> None:
    x, w, b, r = _stacked(k=2)
    with pytest.raises(RuntimeError, match="first derivatives only: .* needs stacked_conv=grouped or matmul"):
        grad(lambda w: grad(lambda w: _loss(conv2d_loop, w, b[0], x[0], r[0]))(w).sum())(w[0])


@pytest.mark.parametrize("lowering", sorted(LOWERED))
def test_lowerings_trace_as_one_graph_as_the_engine_takes_the_gradient(lowering: str) -> None:
    """The engine's step takes the gradient of the ``vmap``-ped loss (``step_capture=compile`` compiles that)."""
    torch._dynamo.reset()
    x, w, b, r = _stacked(dtype=torch.float32)

    def step(w: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
        with lowered_convolutions(lowering):
            return grad(lambda w, b: vmap(functools.partial(_loss, F.conv2d))(w, b, x, r).sum(), (0, 1))(w, b)

    expected = step(w, b)
    got = torch.compile(step, fullgraph=True, backend="eager")(w, b)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e)


class _BackwardMasks(TorchDispatchMode):
    """The output masks of every ``convolution_backward`` dispatched."""

    def __init__(self) -> None:
        super().__init__()
        self.masks: list[tuple[bool, ...]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten.convolution_backward.default:
            self.masks.append(tuple(args[-1]))
        return func(*args, **(kwargs or {}))


def test_the_loop_skips_the_gradient_of_an_input_that_needs_none() -> None:
    """A network's first convolution takes the images, which need no gradient: as ``grouped`` does, ``loop`` does not
    compute one (K transposed convolutions saved)."""
    x, w, b, r = _stacked(k=2)
    with _BackwardMasks() as seen:
        grad(lambda w, b: vmap(functools.partial(_loss, conv2d_loop))(w, b, x, r).sum(), (0, 1))(w, b)
    assert seen.masks == [(False, True, True)] * 2
    with _BackwardMasks() as seen:
        grad(lambda x: vmap(functools.partial(_loss, conv2d_loop, w[0], None))(x, r).sum())(x)
    assert seen.masks == [(True, False, False)]  # shared weights: one convolution for every client


@pytest.mark.parametrize("lowering", sorted(LOWERED))
def test_lowerings_take_conv2d_calls_as_conv2d_takes_them(lowering: str) -> None:
    x, w, b, _ = _stacked(k=1)
    x, w, b = x[0], w[0], b[0]
    with lowered_convolutions(lowering):
        by_name = F.conv2d(input=x, weight=w, bias=b, padding=1)
        mixed = F.conv2d(x, weight=w, padding=(1,), stride=(1,))  # one-element sequences stand for both sides
        with pytest.raises(ValueError, match="padding='same' is not supported for strided convolutions"):
            F.conv2d(x, w, padding="same", stride=2)
    torch.testing.assert_close(by_name, F.conv2d(x, w, b, padding=1), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(mixed, F.conv2d(x, w, padding=1), rtol=1e-10, atol=1e-10)
    with torch.autocast("cpu", dtype=torch.bfloat16), lowered_convolutions(lowering):
        assert F.conv2d(x, w, b, padding=1).dtype == torch.float64  # autocast leaves float64 as it is


# ---- in a federation ---------------------------------------------------------------------------------------------


def _round(tmp_path: Path, name: str, conv: str, **fed: Any) -> tuple[Federation, nn.Module]:
    rounds = 2 if name in {"moon", "scaffold"} else 1
    data = {"holdout_per_class": 1} if name == "fedka" else None
    _, federation, model = tiny_run(
        tmp_path / conv,
        METHODS[name],
        rounds=rounds,
        data_kwargs=data,
        fed_kwargs={"engine": "batched", "stacked_conv": conv, **fed},
    )
    return federation, model


@pytest.mark.parametrize("name", ["fedavg", "fedntd", "fedlmd", "moon", "scaffold", "fedka"])
def test_a_lowered_federation_equals_the_grouped_one(tmp_path: Path, name: str) -> None:
    """Teacher forwards (FedNTD, FedLMD), a projection head (MOON), client state (SCAFFOLD), padded anchors (FedKA)."""
    grouped, grouped_model = _round(tmp_path, name, "grouped")
    for conv in LOWERED:
        lowered, lowered_model = _round(tmp_path, name, conv)
        assert lowered.engine_used == "batched" and lowered.recorder is not None
        assert lowered.recorder.info["stacked_conv"] == conv
        for key, value in grouped_model.state_dict().items():
            torch.testing.assert_close(lowered_model.state_dict()[key], value, rtol=0, atol=1e-5, msg=f"{conv}: {key}")
        for a, b in zip(lowered.history, grouped.history, strict=True):
            assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-5), conv


def test_a_batchnorm_network_lowered_with_a_static_step(tmp_path: Path) -> None:
    """ResNet-8 (strided and 1x1 convolutions, BatchNorm) through the built step and the per-step path, in float64.

    On 300 digits: the clients (32 to 81 samples) take full batches (the built step) and short ones (the per-step path).
    """
    from fl_lightning.core.datasets import load_dataset

    data = load_dataset("digits")
    subset = (data.train_x[:300], data.train_y[:300], data.test_x[:60], data.test_y[:60])
    runs = {}
    for conv in ("grouped", "matmul", "loop"):
        L.seed_everything(0, verbose=False)
        model = float64(METHODS["fedavg"])(net="resnet8", num_classes=10, in_channels=1, image_size=8, lr=0.05)
        dm = FederatedDataModule.from_tensors(*subset, num_clients=5, partition="dirichlet", alpha=1.0, batch_size=32)
        fed = Federation(rounds=1, plots=False, engine="batched", stacked_conv=conv, step_capture="static")
        bare_trainer(tmp_path / conv, fed, max_epochs=1).fit(model.double(), datamodule=dm)
        assert fed.engine_used == "batched"
        runs[conv] = model.state_dict()
    for conv in ("matmul", "loop"):
        for key, value in runs["grouped"].items():
            torch.testing.assert_close(runs[conv][key], value, rtol=0, atol=1e-10)


def test_a_bad_stacked_conv_says_what_to_choose() -> None:
    with pytest.raises(ValueError, match="stacked_conv must be one of grouped, matmul, loop, got 'fft'"):
        Federation(stacked_conv="fft")
    assert set(STACKED_CONVS) == {"grouped", *LOWERED}


@pytest.mark.slow  # Dynamo traces a federation's step (4-6 s); the lowerings' trace alone is checked above
@pytest.mark.parametrize("conv", ["matmul", "loop"])
def test_a_lowered_step_compiles_whole_in_a_federation(
    tmp_path: Path, conv: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``step_capture=compile`` with each lowering: no graph break, no note, the ``grouped`` round's numbers."""
    import fl_lightning.engines as engines
    from fl_lightning.core.step_capture import StepCache

    torch._dynamo.reset()
    monkeypatch.setattr(engines, "StepCache", functools.partial(StepCache, compile_backend="eager"))
    compiled, compiled_model = _round(tmp_path, "fedntd", conv, step_capture="compile")
    cache = getattr(compiled.executor, "capture", None)
    assert isinstance(cache, StepCache) and cache.notes == [] and all(step.mode == "compile" for step in cache)
    _, grouped_model = _round(tmp_path / "grouped", "fedntd", "grouped")
    for key, value in grouped_model.state_dict().items():
        torch.testing.assert_close(compiled_model.state_dict()[key], value, rtol=0, atol=1e-5)


# ---- GPU -----------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("conv", ["matmul", "loop"])
def test_gpu_lowered_graph_step_matches_sequential(tmp_path: Path, conv: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Recorded as a CUDA graph, a lowered round equals the sequential one in float32 (1e-5), and trains in bf16."""
    from test_batched import _digits_fit, assert_same_federation

    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    seq = _digits_fit(tmp_path / "seq", "sequential", "32-true", rounds=1)
    lowered = _digits_fit(tmp_path / conv, "batched", "32-true", rounds=1, stacked_conv=conv)
    cache = getattr(lowered[0].executor, "capture", None)
    assert cache is not None and cache.notes == [] and all(step.graph is not None for step in cache)
    assert_same_federation(lowered, seq)
    bf16, _ = _digits_fit(tmp_path / f"{conv}-bf16", "batched", "bf16-mixed", rounds=5, stacked_conv=conv)
    cache = getattr(bf16.executor, "capture", None)
    assert cache is not None and cache.notes == [] and all(step.graph is not None for step in cache)
    assert all(math.isfinite(row["train_loss"]) for row in bf16.history)
    assert bf16.history[-1]["global_acc"] >= 0.5  # digits after 5 rounds of E = 2: it learns
