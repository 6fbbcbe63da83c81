"""How the batched engine computes its stacked clients' 2-d convolutions: three lowerings of one convolution.

Under :func:`torch.func.vmap` a convolution whose input and weight both carry the client axis becomes one grouped
convolution (``groups = K``, PyTorch's batching rule). cuDNN's grouped kernels can be far slower than the same
arithmetic done otherwise (functorch#365, pytorch#70954), so the engine can compute it one of three ways
(``Federation(stacked_conv=...)``), all the same convolution up to float rounding:

- ``grouped``: ``vmap``'s rule as it is (the default);
- ``matmul``: im2col and a matrix product (:func:`conv2d_matmul`): under ``vmap`` one copy gathering the patches
  and one batched matmul over the clients, backward two batched matmuls and a scatter of the patches' gradient. The
  patches (C·kh·kw values an output pixel) are kept for the backward, several times the activations' memory;
- ``loop``: one ordinary convolution per client, forward and backward (:func:`conv2d_loop`): the sequential engine's
  kernels. Each is launched on its own, so it pays only where launches are free (a step replayed as a CUDA graph).
  It computes first derivatives only, and traces whole under ``torch.compile`` where the gradient is taken of the
  ``vmap``-ped loss (as the engine's step takes it), not where ``vmap`` runs over a gradient.

:func:`lowered_convolutions` is the context in which ``torch.nn.functional.conv2d`` (what ``nn.Conv2d`` calls) runs
lowered; other convolutions (1-d, 3-d, transposed) run as they are.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

#: ``Federation(stacked_conv=...)``: how a stacked step computes its 2-d convolutions.
STACKED_CONVS = ("grouped", "matmul", "loop")

_Pair = int | Sequence[int]


def _pair(value: _Pair) -> list[int]:
    """Two ints, as ``F.conv2d`` reads an int or a one- or two-element sequence."""
    values = [int(value)] if isinstance(value, int) else [int(v) for v in value]
    return values * 2 if len(values) == 1 else values


def _explicit_padding(
    x: Tensor, weight: Tensor, padding: _Pair | str, dilation: list[int], stride: list[int]
) -> tuple[Tensor, list[int]]:
    """``x`` and the padding as two ints: ``"same"`` and ``"valid"`` resolved, an uneven ``"same"`` padded here."""
    if not isinstance(padding, str):
        return x, _pair(padding)
    if padding == "valid":
        return x, [0, 0]
    if padding != "same":
        raise ValueError(f"conv2d padding must be 'same', 'valid' or ints, got {padding!r}")
    if any(s != 1 for s in stride):
        raise ValueError("padding='same' is not supported for strided convolutions")  # F.conv2d's refusal
    total = [d * (k - 1) for d, k in zip(dilation, weight.shape[-2:], strict=True)]
    if all(t % 2 == 0 for t in total):
        return x, [t // 2 for t in total]
    (th, tw) = total  # uneven: the extra row and column go after, as F.conv2d(padding="same") puts them
    return F.pad(x, (tw // 2, tw - tw // 2, th // 2, th - th // 2)), [0, 0]


def conv2d_matmul(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: _Pair = 1,
    padding: _Pair | str = 0,
    dilation: _Pair = 1,
    groups: int = 1,
) -> Tensor:
    """``F.conv2d`` as im2col and one matrix product a group: ``y[n, :, p] = W_g · patches(x)[n, :, p] + b``.

    Takes and returns what :func:`torch.nn.functional.conv2d` does (a batched ``[N, C, H, W]`` or unbatched
    ``[C, H, W]`` input). The patches are a strided view of the (padded) input, gathered by one copy: ``F.unfold``
    would launch a kernel per image on CUDA. Under ``vmap`` over inputs and weights the product is one batched matmul.
    """
    unbatched = x.dim() == 3
    if unbatched:
        x = x.unsqueeze(0)
    s, d = _pair(stride), _pair(dilation)
    x, p = _explicit_padding(x, weight, padding, d, s)
    if any(p):
        x = F.pad(x, (p[1], p[1], p[0], p[0]))
    n, c = x.shape[:2]
    out_channels, _, kh, kw = weight.shape
    span_h, span_w = d[0] * (kh - 1) + 1, d[1] * (kw - 1) + 1
    patches = x.unfold(2, span_h, s[0]).unfold(3, span_w, s[1])  # [N, C, Ho, Wo, span_h, span_w], a view
    if span_h != kh or span_w != kw:
        patches = patches[..., :: d[0], :: d[1]]
    ho, wo = patches.shape[2:4]
    cols = patches.reshape(n, groups, c // groups, ho, wo, kh, kw).permute(1, 2, 5, 6, 0, 3, 4)
    cols = cols.reshape(groups, (c // groups) * kh * kw, n * ho * wo)  # channel-major, as the weight's rows
    y = torch.matmul(weight.reshape(groups, out_channels // groups, -1), cols)  # [G, O/G, N·Ho·Wo]
    y = y.reshape(out_channels, n, ho, wo).transpose(0, 1)
    if bias is not None:
        y = y + bias.view(1, -1, 1, 1)
    return y.squeeze(0) if unbatched else y


def _moved(t: Tensor, dim: int | None) -> Tensor:
    return t if dim is None or dim == 0 else t.movedim(dim, 0)


def _pick(t: Tensor | None, dim: int | None, k: int) -> Tensor | None:
    return t if t is None or dim is None else t[k]


class _ConvGrad(torch.autograd.Function):
    """``(∂x, ∂w, ∂b)`` of a 2-d convolution given ``∂y``: one ``convolution_backward`` (first order only).

    ``wanted``: which of the three are needed; the others are not computed (returned as 0-d zeros).
    """

    @staticmethod
    def forward(
        g: Tensor, x: Tensor, w: Tensor, wanted: tuple[bool, bool, bool], stride: list[int], padding: list[int],
        dilation: list[int], groups: int,
    ) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
        grads = torch.ops.aten.convolution_backward(
            g, x, w, [w.shape[0]] if wanted[2] else None, stride, padding, dilation, False, [0, 0], groups,
            list(wanted),
        )  # fmt: skip
        gx, gw, gb = (t if t is not None else g.new_zeros(()) for t in grads)
        return gx, gw, gb

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        pass

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> Any:
        raise RuntimeError(
            "stacked_conv=loop computes first derivatives only: a loss that differentiates a convolution's gradient "
            "again needs stacked_conv=grouped or matmul"
        )

    @staticmethod
    def vmap(info: Any, in_dims: tuple[int | None, ...], g: Tensor, x: Tensor, w: Tensor, *conf: Any) -> Any:
        gd, xd, wd = in_dims[:3]
        g, x, w = _moved(g, gd), _moved(x, xd), _moved(w, wd)
        parts = [
            _ConvGrad.apply(_pick(g, gd, k), _pick(x, xd, k), _pick(w, wd, k), *conf) for k in range(info.batch_size)
        ]
        return tuple(torch.stack(t) for t in zip(*parts, strict=True)), (0, 0, 0)


class _LoopedConv(torch.autograd.Function):
    """A 2-d convolution whose ``vmap`` over weights runs one convolution per weight, forward and backward."""

    @staticmethod
    def forward(
        x: Tensor, w: Tensor, b: Tensor | None, stride: list[int], padding: list[int], dilation: list[int], groups: int
    ) -> Tensor:
        return F.conv2d(x, w, b, stride, padding, dilation, groups)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        x, w, b, stride, padding, dilation, groups = inputs
        ctx.save_for_backward(x, w)
        ctx.conf = (stride, padding, dilation, groups)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        x, w = ctx.saved_tensors
        wanted = tuple(bool(n) for n in ctx.needs_input_grad[:3])  # an input (the images) needs no gradient
        gx, gw, gb = _ConvGrad.apply(g, x, w, wanted, *ctx.conf)
        return (*(t if want else None for t, want in zip((gx, gw, gb), wanted, strict=True)), None, None, None, None)

    @staticmethod
    def vmap(
        info: Any, in_dims: tuple[int | None, ...], x: Tensor, w: Tensor, b: Tensor | None, *conf: Any
    ) -> tuple[Tensor, int]:
        xd, wd, bd = in_dims[:3]
        x, w = _moved(x, xd), _moved(w, wd)
        b = None if b is None else _moved(b, bd)
        if xd is not None and wd is None and bd is None:  # shared weights: the axis joins the batch, one convolution
            return _LoopedConv.apply(x.flatten(0, 1), w, b, *conf).unflatten(0, (info.batch_size, -1)), 0
        parts = [
            _LoopedConv.apply(_pick(x, xd, k), _pick(w, wd, k), _pick(b, bd, k), *conf) for k in range(info.batch_size)
        ]
        return torch.stack(parts), 0


def conv2d_loop(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: _Pair = 1,
    padding: _Pair | str = 0,
    dilation: _Pair = 1,
    groups: int = 1,
) -> Tensor:
    """``F.conv2d`` whose ``vmap`` over weights is one ordinary convolution per client, forward and backward."""
    if x.dim() == 3:  # unbatched: the backward's convolution takes batched inputs only
        return conv2d_loop(x.unsqueeze(0), weight, bias, stride, padding, dilation, groups).squeeze(0)
    s, d = _pair(stride), _pair(dilation)
    x, p = _explicit_padding(x, weight, padding, d, s)
    return _LoopedConv.apply(x, weight, bias, s, p, d, groups)


_LOWERED: dict[str, Callable[..., Tensor]] = {"matmul": conv2d_matmul, "loop": conv2d_loop}
#: The dtypes autocast casts a convolution's inputs from (a float64 one it leaves as it is).
_AUTOCAST_FROM = (torch.float32, torch.float16, torch.bfloat16)


def _conv_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Tensor, Tensor, Tensor | None, list[Any]]:
    """``F.conv2d``'s input, weight and bias however they were passed, and its further positional arguments."""
    rest = list(args)
    named = [kwargs.pop(name) if name in kwargs else rest.pop(0) for name in ("input", "weight")]
    bias = kwargs.pop("bias") if "bias" in kwargs else (rest.pop(0) if rest else None)
    return named[0], named[1], bias, rest


class _LoweredConvolutions(TorchFunctionMode):
    def __init__(self, conv: Callable[..., Tensor]) -> None:
        super().__init__()
        self.conv = conv

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        if func is not F.conv2d:  # every other operator of the loss: passed on as it is
            return func(*args, **(kwargs or {}))
        kwargs = dict(kwargs or {})
        x, weight, bias, rest = _conv_arguments(args, kwargs)
        device = x.device.type
        if torch.is_autocast_enabled(device):  # as autocast casts a convolution's inputs
            dtype = torch.get_autocast_dtype(device)
            x, weight = (t.to(dtype) if t.dtype in _AUTOCAST_FROM else t for t in (x, weight))
            bias = bias.to(dtype) if bias is not None and bias.dtype in _AUTOCAST_FROM else bias
        return self.conv(x, weight, bias, *rest, **kwargs)


def lowered_convolutions(kind: str) -> contextlib.AbstractContextManager[Any]:
    """Within the context, ``F.conv2d`` runs as the :data:`STACKED_CONVS` lowering ``kind`` (``grouped``: as it is).

    Raises:
        ValueError: an unknown ``kind``.
    """
    if kind == "grouped":
        return contextlib.nullcontext()
    if kind not in _LOWERED:
        raise ValueError(f"stacked_conv must be one of {', '.join(STACKED_CONVS)}, got {kind!r}")
    return _LoweredConvolutions(_LOWERED[kind])
