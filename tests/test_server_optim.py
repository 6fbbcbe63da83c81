"""Server optimizers: FedAvg / FedAvgM arithmetic, Reddi et al.'s Algorithm 2, entry handling, checkpoints."""

import io
import math

import pytest
import torch

from fl_lightning.core.server_optim import (
    SERVER_OPTIMIZERS,
    FedAdagrad,
    FedAdam,
    FedYogi,
    ServerOptimizer,
    ServerSGD,
)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The float32 tensor's bit pattern, so that -0.0 and +0.0 (and NaN payloads) differ."""
    return t.contiguous().view(torch.int32)


def _legacy_fedavgm(w_g, new, buffers, lr, momentum):
    """The Federation callback's former server momentum step, verbatim."""
    out = dict(new)
    for k, w in w_g.items():
        if not torch.is_floating_point(w):
            continue
        delta = w.float() - new[k].float()
        buf = buffers.get(k)
        buf = delta if buf is None else momentum * buf.to(delta.device) + delta
        buffers[k] = buf
        out[k] = (w.float() - lr * buf).to(w.dtype)
    return out


W0 = {"a": torch.tensor([1.0, -2.0, -0.0, 0.3]), "b": torch.tensor([[0.1, 0.2], [0.3, 0.4]])}
TARGETS = [
    {"a": torch.tensor([2.0, -1.0, 0.0, 0.3]), "b": torch.tensor([[0.0, 0.25], [0.35, 0.4]])},
    {"a": torch.tensor([2.5, -1.5, 0.0, 0.7]), "b": torch.tensor([[-0.1, 0.2], [0.3, 0.45]])},
    {"a": torch.tensor([2.2, -1.2, -0.0, 0.1]), "b": torch.tensor([[0.05, 0.3], [0.3, 0.5]])},
]


# ---- ServerSGD / FedAvgM ------------------------------------------------------------------------------------------


def test_sgd_identity_returns_target_exactly():
    opt = ServerSGD()
    assert opt.is_identity
    target = {**TARGETS[0], "n": torch.tensor(7)}
    out = opt.step(W0, target)
    assert out is not target and out.keys() == target.keys()
    assert all(out[k] is target[k] for k in target)
    assert not ServerSGD(lr=0.5).is_identity and not ServerSGD(momentum=0.1).is_identity
    assert not FedAdam().is_identity


def test_sgd_server_lr_by_hand():
    w = {"x": torch.tensor([1.0, -3.0])}
    t = {"x": torch.tensor([2.0, 1.0])}
    out = ServerSGD(lr=0.5).step(w, t)
    assert torch.equal(out["x"], torch.tensor([1.5, -1.0]))  # w + 0.5·(t − w)


@pytest.mark.parametrize(("lr", "momentum"), [(1.0, 0.9), (0.7, 0.9), (0.5, 0.0), (0.7, 0.5)])
def test_fedavgm_matches_legacy_arithmetic_bit_for_bit(lr, momentum):
    opt = ServerSGD(lr=lr, momentum=momentum)
    w_new, w_old, buffers = dict(W0), dict(W0), {}
    for target in TARGETS:
        w_new = opt.step(w_new, target)
        w_old = _legacy_fedavgm(w_old, target, buffers, lr, momentum)
        for k in W0:
            assert torch.equal(_bits(w_new[k]), _bits(w_old[k])), k
            assert torch.equal(_bits(opt.state[k]["momentum_buffer"]), _bits(buffers[k])), k


@pytest.mark.parametrize(("lr", "expected"), [(1.0, [3.4, -0.6]), (0.7, [2.89, -0.81])])
def test_fedavgm_second_step_by_hand(lr, expected):
    # lr 1:   v1 = w0 − t1 = [−1, −1], w1 = [2, −1]; v2 = 0.9·v1 + (w1 − t2) = [−1.4, −0.4]; w2 = w1 − v2 = [3.4, −0.6]
    # lr 0.7: w1 = [1.7, −1.3]; v2 = 0.9·[−1, −1] + [−0.8, 0.2] = [−1.7, −0.7]; w2 = w1 + 0.7·[1.7, 0.7] = [2.89, −0.81]
    opt = ServerSGD(lr=lr, momentum=0.9)
    w = opt.step({"x": torch.tensor([1.0, -2.0])}, {"x": torch.tensor([2.0, -1.0])})
    w = opt.step(w, {"x": torch.tensor([2.5, -1.5])})
    torch.testing.assert_close(w["x"], torch.tensor(expected), rtol=0, atol=1e-6)


# ---- Reddi et al., Algorithm 2 -----------------------------------------------------------------------------------


def _algorithm2(kind, w0, targets, lr, beta1, beta2, tau):
    """Algorithm 2 elementwise in Python floats; returns the weights and (m, v) after each round."""
    w = [float(x) for x in w0]
    m = [0.0] * len(w)
    v = [tau * tau] * len(w)
    history = []
    for target in targets:
        for i, t in enumerate(target):
            d = float(t) - w[i]
            m[i] = beta1 * m[i] + (1 - beta1) * d
            if kind == "adagrad":
                v[i] = v[i] + d * d
            elif kind == "adam":
                v[i] = beta2 * v[i] + (1 - beta2) * d * d
            else:
                v[i] = v[i] - (1 - beta2) * d * d * math.copysign(1.0, v[i] - d * d) * (v[i] != d * d)
            w[i] = w[i] + lr * m[i] / (math.sqrt(v[i]) + tau)
        history.append((list(w), list(m), list(v)))
    return history


ADAPTIVE = [
    ("adagrad", lambda: FedAdagrad(lr=0.1, beta1=0.0, tau=1e-3), dict(lr=0.1, beta1=0.0, beta2=None, tau=1e-3)),
    ("adagrad", lambda: FedAdagrad(lr=0.05, beta1=0.5, tau=1e-2), dict(lr=0.05, beta1=0.5, beta2=None, tau=1e-2)),
    ("adam", lambda: FedAdam(lr=0.01, beta1=0.9, beta2=0.99, tau=1e-3), dict(lr=0.01, beta1=0.9, beta2=0.99, tau=1e-3)),
    ("adam", lambda: FedAdam(lr=0.3, beta1=0.5, beta2=0.9, tau=1e-2), dict(lr=0.3, beta1=0.5, beta2=0.9, tau=1e-2)),
    ("yogi", lambda: FedYogi(lr=0.01, beta1=0.9, beta2=0.99, tau=1e-3), dict(lr=0.01, beta1=0.9, beta2=0.99, tau=1e-3)),
    ("yogi", lambda: FedYogi(lr=0.3, beta1=0.5, beta2=0.9, tau=1e-2), dict(lr=0.3, beta1=0.5, beta2=0.9, tau=1e-2)),
]


@pytest.mark.parametrize(("kind", "make", "hp"), ADAPTIVE)
def test_adaptive_matches_algorithm2_for_three_rounds(kind, make, hp):
    w0 = [1.0, -0.5, 0.0, 2.0]
    targets = [[1.2, -0.4, 0.5, 2.0], [1.1, -0.6, 0.45, 1.98], [1.5, -0.6, 0.2, 2.01]]
    expected = _algorithm2(kind, w0, targets, **hp)
    opt = make()
    w = {"x": torch.tensor(w0)}
    for target, (w_ref, m_ref, v_ref) in zip(targets, expected, strict=True):
        w = opt.step(w, {"x": torch.tensor(target)})
        torch.testing.assert_close(w["x"], torch.tensor(w_ref), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(opt.state["x"]["m"], torch.tensor(m_ref), rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(opt.state["x"]["v"], torch.tensor(v_ref), rtol=1e-5, atol=1e-9)


def test_fedadam_first_step_by_hand():
    # Δ = 0.2, τ = 1e-3, β1 = 0.9, β2 = 0.99: m = 0.02, v = 0.99·1e-6 + 0.01·0.04, w += lr·m/(√v + τ)
    opt = FedAdam(lr=0.01, beta1=0.9, beta2=0.99, tau=1e-3)
    out = opt.step({"x": torch.tensor([0.0])}, {"x": torch.tensor([0.2])})
    v = 0.99 * 1e-6 + 0.01 * 0.04
    assert opt.state["x"]["m"].item() == pytest.approx(0.02, rel=1e-6)
    assert opt.state["x"]["v"].item() == pytest.approx(v, rel=1e-6)
    assert out["x"].item() == pytest.approx(0.01 * 0.02 / (math.sqrt(v) + 1e-3), rel=1e-6)
    assert out["x"].item() == pytest.approx(0.0095126, rel=1e-4)


def test_fedyogi_sign_both_ways():
    opt = FedYogi(lr=0.01, beta1=0.9, beta2=0.99, tau=1e-3)
    w = opt.step({"x": torch.tensor([0.0])}, {"x": torch.tensor([1.0])})
    # v0 = τ² < Δ² = 1: sign −1, v grows by (1 − β2)·Δ²
    assert opt.state["x"]["v"].item() == pytest.approx(1e-6 + 0.01, rel=1e-6)
    # Δ = 0.01: Δ² = 1e-4 < v = 0.010001: sign +1, v shrinks by (1 − β2)·Δ² (Adam would give 0.99·v + 1e-6)
    w = opt.step(w, {"x": w["x"] + 0.01})
    assert opt.state["x"]["v"].item() == pytest.approx(0.010001 - 0.01 * 1e-4, rel=1e-5)
    assert opt.state["x"]["v"].item() != pytest.approx(0.99 * 0.010001 + 0.01 * 1e-4, rel=1e-5)


def test_fedadagrad_accumulates_squares():
    opt = FedAdagrad(lr=0.1, tau=1e-3)  # β1 = 0 by default: m = Δ
    assert opt.beta1 == 0.0
    w = opt.step({"x": torch.tensor([0.0])}, {"x": torch.tensor([0.5])})
    assert w["x"].item() == pytest.approx(0.1 * 0.5 / (math.sqrt(1e-6 + 0.25) + 1e-3), rel=1e-6)
    w2 = opt.step(w, {"x": w["x"] - 0.3})
    v = 1e-6 + 0.25 + 0.09
    assert opt.state["x"]["v"].item() == pytest.approx(v, rel=1e-5)
    assert w2["x"].item() == pytest.approx(w["x"].item() - 0.1 * 0.3 / (math.sqrt(v) + 1e-3), rel=1e-5)


# ---- which entries are stepped, dtypes, inputs ----------------------------------------------------------------------


def _model_like():
    weights = {
        "conv.weight": torch.tensor([[0.5, -0.25], [1.0, 0.0]]),
        "bn.running_mean": torch.tensor([0.1, 0.2]),
        "bn.num_batches_tracked": torch.tensor(5),
        "half": torch.tensor([1.0, 2.0], dtype=torch.float16),
        "double": torch.tensor([1.0, -1.0], dtype=torch.float64),
    }
    target = {
        "conv.weight": torch.tensor([[0.75, -0.5], [1.0, 0.25]]),
        "bn.running_mean": torch.tensor([0.3, 0.4]),
        "bn.num_batches_tracked": torch.tensor(9),
        "half": torch.tensor([1.5, 1.5], dtype=torch.float16),
        "double": torch.tensor([1.25, -1.5], dtype=torch.float64),
    }
    return weights, target


OPTIMIZERS = [
    lambda: ServerSGD(lr=0.5),
    lambda: ServerSGD(lr=0.7, momentum=0.9),
    lambda: FedAdagrad(lr=0.1),
    lambda: FedAdam(lr=0.1),
    lambda: FedYogi(lr=0.1),
]


@pytest.mark.parametrize("make", OPTIMIZERS)
def test_only_float_keys_are_stepped_and_inputs_untouched(make):
    weights, target = _model_like()
    w_copy = {k: v.clone() for k, v in weights.items()}
    t_copy = {k: v.clone() for k, v in target.items()}
    keys = ["conv.weight", "half", "double", "bn.num_batches_tracked"]  # an integer key in `keys` is still copied
    opt = make()
    out = opt.step(weights, target, keys=keys)
    assert out.keys() == target.keys()
    assert out["bn.running_mean"] is target["bn.running_mean"]
    assert out["bn.num_batches_tracked"] is target["bn.num_batches_tracked"]
    for k in ("conv.weight", "half", "double"):
        assert out[k].dtype == weights[k].dtype
        assert not torch.equal(out[k], target[k]) and not torch.equal(out[k], weights[k])
    assert set(opt.state) == {"conv.weight", "half", "double"}
    assert all(t.dtype == torch.float32 for entry in opt.state.values() for t in entry.values())
    for k in weights:
        assert torch.equal(weights[k], w_copy[k]) and torch.equal(target[k], t_copy[k])
    opt.step(out, target, keys=keys)  # state tensors are not tied to the outputs
    for k in weights:
        assert torch.equal(weights[k], w_copy[k]) and torch.equal(target[k], t_copy[k])


@pytest.mark.parametrize("make", OPTIMIZERS)
def test_default_keys_step_every_float_entry(make):
    weights, target = _model_like()
    opt = make()
    out = opt.step(weights, target)
    assert set(opt.state) == {"conv.weight", "bn.running_mean", "half", "double"}
    assert out["bn.num_batches_tracked"] is target["bn.num_batches_tracked"]
    assert not torch.equal(out["bn.running_mean"], target["bn.running_mean"])


def test_sgd_dtype_round_trip_by_hand():
    weights, target = _model_like()
    out = ServerSGD(lr=0.5).step(weights, target)
    assert out["double"].dtype == torch.float64 and out["half"].dtype == torch.float16
    assert torch.equal(out["double"], torch.tensor([1.125, -1.25], dtype=torch.float64))
    assert torch.equal(out["half"], torch.tensor([1.25, 1.75], dtype=torch.float16))


def test_missing_key_raises():
    weights, target = _model_like()
    with pytest.raises(KeyError, match="nope"):
        FedAdam().step(weights, target, keys=["conv.weight", "nope"])
    del target["half"]
    with pytest.raises(KeyError, match="half"):
        ServerSGD(lr=0.5).step(weights, target)


# ---- checkpointing ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", OPTIMIZERS)
def test_state_dict_resume_is_exact(make):
    a = make()
    w = dict(W0)
    for target in TARGETS[:2]:
        w = a.step(w, target)
    buffer = io.BytesIO()
    torch.save(a.state_dict(), buffer)
    saved = a.state_dict()
    assert saved["steps"] == 2 and saved["optimizer"] == type(a).__name__
    assert all(t.device.type == "cpu" for entry in saved["state"].values() for t in entry.values())
    buffer.seek(0)
    b = make()
    b.load_state_dict(torch.load(buffer, weights_only=True))
    assert b.steps == 2
    out_a, out_b = a.step(w, TARGETS[2]), b.step(w, TARGETS[2])
    for k in W0:
        assert torch.equal(out_a[k], out_b[k])
    # the saved dict is a snapshot, not a view of the live state
    c = make()
    c.load_state_dict(saved)
    out_c = c.step(w, TARGETS[2])
    assert all(torch.equal(out_a[k], out_c[k]) for k in W0)
    out_c2 = c.step(out_c, TARGETS[0])
    c.load_state_dict(saved)
    again = c.step(w, TARGETS[2])
    assert all(torch.equal(again[k], out_c[k]) for k in W0)
    assert not all(torch.equal(out_c2[k], out_c[k]) for k in W0)


@pytest.mark.parametrize("make", OPTIMIZERS)
def test_reset_forgets_state(make):
    a = make()
    w = a.step(W0, TARGETS[0])
    a.reset()
    assert a.state == {} and a.steps == 0
    out_a, out_fresh = a.step(w, TARGETS[1]), make().step(w, TARGETS[1])
    assert all(torch.equal(out_a[k], out_fresh[k]) for k in W0)


def test_load_rejects_other_optimizer_state():
    a = FedAdam()
    a.step(W0, TARGETS[0])
    with pytest.raises(ValueError, match="FedAdam"):
        FedYogi().load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="state"):
        FedYogi().load_state_dict({"steps": 1})


def test_sgd_continues_from_a_legacy_momentum_buffer():
    buffers = {}
    w_old = _legacy_fedavgm(dict(W0), TARGETS[0], buffers, 0.7, 0.9)
    opt = ServerSGD(lr=0.7, momentum=0.9)
    opt.load_state_dict({"state": {k: {"momentum_buffer": b} for k, b in buffers.items()}})
    out = opt.step(w_old, TARGETS[1])
    ref = _legacy_fedavgm(w_old, TARGETS[1], buffers, 0.7, 0.9)
    assert all(torch.equal(out[k], ref[k]) for k in W0)


@pytest.mark.gpu
@pytest.mark.parametrize("make", OPTIMIZERS)
def test_loaded_state_moves_to_the_weights_device(make):
    a = make()
    w = a.step(W0, TARGETS[0])
    b = make()
    b.load_state_dict(a.state_dict())
    cuda = {k: v.cuda() for k, v in w.items()}
    out = b.step(cuda, {k: v.cuda() for k, v in TARGETS[1].items()})
    ref = a.step(w, TARGETS[1])
    assert all(t.is_cuda for entry in b.state.values() for t in entry.values())
    for k in W0:
        assert out[k].is_cuda
        torch.testing.assert_close(out[k].cpu(), ref[k], rtol=1e-6, atol=1e-7)


# ---- arguments and registry ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "kwargs", "name"),
    [
        (ServerSGD, {"lr": 0.0}, "lr"),
        (ServerSGD, {"lr": -1.0}, "lr"),
        (ServerSGD, {"lr": float("nan")}, "lr"),
        (ServerSGD, {"momentum": 1.0}, "momentum"),
        (ServerSGD, {"momentum": -0.1}, "momentum"),
        (FedAdagrad, {"lr": 0.0}, "lr"),
        (FedAdagrad, {"beta1": 1.0}, "beta1"),
        (FedAdagrad, {"tau": 0.0}, "tau"),
        (FedAdam, {"beta1": -0.5}, "beta1"),
        (FedAdam, {"beta2": 1.0}, "beta2"),
        (FedAdam, {"tau": -1e-3}, "tau"),
        (FedAdam, {"lr": float("inf")}, "lr"),
        (FedYogi, {"beta2": -0.1}, "beta2"),
        (FedYogi, {"beta1": 1.5}, "beta1"),
        (FedYogi, {"tau": 0.0}, "tau"),
    ],
)
def test_bad_arguments(cls, kwargs, name):
    with pytest.raises(ValueError, match=name) as err:
        cls(**kwargs)
    assert cls.__name__ in str(err.value)


def test_lr_error_names_class_and_value():
    with pytest.raises(ValueError, match=r"FedYogi.*lr.*-0\.5"):
        FedYogi(lr=-0.5)


def test_fedadagrad_has_no_beta2():
    with pytest.raises(TypeError):
        FedAdagrad(beta2=0.9)


def test_registry_and_defaults():
    assert SERVER_OPTIMIZERS == {"sgd": ServerSGD, "fedadagrad": FedAdagrad, "fedadam": FedAdam, "fedyogi": FedYogi}
    for cls in SERVER_OPTIMIZERS.values():
        assert issubclass(cls, ServerOptimizer)
        cls()
    assert (FedAdam().lr, FedAdam().beta1, FedAdam().beta2, FedAdam().tau) == (0.01, 0.9, 0.99, 1e-3)
    assert (FedYogi().lr, FedYogi().beta1, FedYogi().beta2, FedYogi().tau) == (0.01, 0.9, 0.99, 1e-3)
    assert (FedAdagrad().lr, FedAdagrad().beta1, FedAdagrad().tau) == (0.01, 0.0, 1e-3)
    assert (ServerSGD().lr, ServerSGD().momentum) == (1.0, 0.0)
    assert repr(FedAdam(lr=0.1)) == "FedAdam(lr=0.1, beta1=0.9, beta2=0.99, tau=0.001)"


def test_a_name_in_the_registry_is_a_server_optimizer_with_its_defaults(monkeypatch):
    # Before: Federation(server_optimizer="fedadam") was accepted, then the fit failed with
    # "AttributeError: 'str' object has no attribute 'reset'"; nothing read SERVER_OPTIMIZERS.
    from fl_lightning import Federation

    assert repr(Federation(server_optimizer="fedadam").server_optimizer) == repr(FedAdam())
    assert type(Federation(server_optimizer="FedYogi").server_optimizer) is FedYogi

    class HalfStep(ServerSGD):
        def __init__(self) -> None:
            super().__init__(lr=0.5)

    monkeypatch.setitem(SERVER_OPTIMIZERS, "halfstep", HalfStep)
    assert Federation(server_optimizer="halfstep").server_optimizer.lr == 0.5
    with pytest.raises(ValueError, match="unknown server optimizer 'adam'; choose one of sgd, fedadagrad, fedadam"):
        Federation(server_optimizer="adam")
    with pytest.raises(TypeError, match="server_optimizer must be a ServerOptimizer or its name, got int"):
        Federation(server_optimizer=3)  # type: ignore[arg-type]
