"""Batched image augmentation on tensors, on whatever device the batch lives (no per-sample PIL path).

:class:`BatchTransform` turns a datamodule's raw batches into training and evaluation inputs; its deterministic part,
:class:`InputNormalization`, is what a trained model carries to take raw inputs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor, nn


def crop(x: Tensor, padding: int, dy: Tensor, dx: Tensor) -> Tensor:
    """Pad each image by ``padding`` zeros and take the window at row ``dy[i]``, column ``dx[i]`` of the padded one."""
    if padding <= 0:
        return x
    b, _, h, w = x.shape
    padded = torch.nn.functional.pad(x, (padding, padding, padding, padding))
    rows = (dy[:, None] + torch.arange(h, device=x.device)[None, :])[:, None, :, None]  # [B,1,H,1]
    cols = (dx[:, None] + torch.arange(w, device=x.device)[None, :])[:, None, None, :]  # [B,1,1,W]
    batch = torch.arange(b, device=x.device)[:, None, None, None]
    channels = torch.arange(x.shape[1], device=x.device)[None, :, None, None]
    return padded[batch, channels, rows, cols]


def random_crop(x: Tensor, padding: int, generator: torch.Generator | None = None) -> Tensor:
    """Pad each image by ``padding`` zeros and crop a random window of the original size (torchvision's RandomCrop)."""
    if padding <= 0:
        return x
    b = x.shape[0]
    dy = torch.randint(0, 2 * padding + 1, (b,), device=x.device, generator=generator)
    dx = torch.randint(0, 2 * padding + 1, (b,), device=x.device, generator=generator)
    return crop(x, padding, dy, dx)


def hflip(x: Tensor, flip: Tensor) -> Tensor:
    """Mirror left-right the images where ``flip`` is true."""
    return torch.where(flip[:, None, None, None], x.flip(-1), x)


def random_hflip(x: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Mirror each image left-right with probability 1/2."""
    return hflip(x, torch.rand(x.shape[0], device=x.device, generator=generator) < 0.5)


def cut(x: Tensor, size: int, cy: Tensor, cx: Tensor) -> Tensor:
    """Zero a ``size`` x ``size`` square centred at pixel (``cy[i]``, ``cx[i]``) of each image."""
    if size <= 0:
        return x
    _, _, h, w = x.shape
    ys = torch.arange(h, device=x.device)[None, :]
    xs = torch.arange(w, device=x.device)[None, :]
    in_y = (ys >= (cy[:, None] - size // 2)) & (ys < (cy[:, None] - size // 2 + size))  # [B,H]
    in_x = (xs >= (cx[:, None] - size // 2)) & (xs < (cx[:, None] - size // 2 + size))  # [B,W]
    mask = in_y[:, None, :, None] & in_x[:, None, None, :]
    return x.masked_fill(mask, 0.0)


def cutout(x: Tensor, size: int, generator: torch.Generator | None = None) -> Tensor:
    """Zero a ``size`` x ``size`` square centred at a random pixel of each image (DeVries & Taylor, 2017)."""
    if size <= 0:
        return x
    b, _, h, w = x.shape
    cy = torch.randint(0, h, (b,), device=x.device, generator=generator)
    cx = torch.randint(0, w, (b,), device=x.device, generator=generator)
    return cut(x, size, cy, cx)


class BatchTransform:
    """uint8 → float in [0, 1] (other dtypes → float as they are) → (train only) crop/flip → normalise → Cutout.

    Args:
        mean: per-channel (images) or per-feature (feature vectors) mean, on the scale after the uint8 → [0, 1]
            conversion; one value for any other input; ``None``: no normalisation.
        std: standard deviations, shaped as ``mean``.
        crop_padding: random-crop padding in pixels (0 disables).
        hflip: random horizontal flips.
        cutout_size: Cutout square side in pixels (0 disables).
        image: whether each input is an image ``[C, H, W]``; augmentation needs images.

    Raises:
        ValueError: augmentation asked for inputs that are not images.
    """

    def __init__(
        self,
        mean: Sequence[float] | None,
        std: Sequence[float] | None,
        crop_padding: int = 0,
        hflip: bool = False,
        cutout_size: int = 0,
        image: bool = True,
    ) -> None:
        self.crop_padding = crop_padding
        self.hflip = hflip
        self.cutout_size = cutout_size
        if self.augments and not image:
            raise ValueError(
                "augmentation (crop_padding, hflip, cutout) needs image inputs [C, H, W]; "
                "turn it off for feature vectors or other inputs"
            )
        self.mean: Tensor | None = None
        self.std: Tensor | None = None
        if mean is not None and std is not None:
            shape = (1, -1, 1, 1) if image else (1, -1) if len(mean) > 1 else ()
            self.mean = torch.tensor(list(mean), dtype=torch.float32).view(shape)
            self.std = torch.tensor(list(std), dtype=torch.float32).view(shape)

    @property
    def augments(self) -> bool:
        """Whether training batches are randomly transformed."""
        return self.crop_padding > 0 or self.hflip or self.cutout_size > 0

    def __call__(self, x: Tensor, train: bool, generator: torch.Generator | None = None) -> Tensor:
        """Transform a raw batch (uint8 or float) into a normalised float32 one (``generator``: see :meth:`draw`)."""
        choices = self.draw(x.shape[0], x.shape[-2:], x.device, generator) if train and self.augments else None
        return self.apply(x, choices)

    def draw(
        self, batch: int, size: Sequence[int], device: torch.device | str, generator: torch.Generator | None = None
    ) -> dict[str, Tensor]:
        """The random choices of a training batch of ``batch`` images of ``size`` (H, W), in ``__call__``'s order.

        Drawn from torch's global generator on ``device``, or from ``generator`` on its own device and then moved;
        several batches' choices, concatenated, :meth:`apply` to their concatenated images (the batched engine: one
        transform for a step of many clients).
        """
        where = device if generator is None else generator.device
        out: dict[str, Tensor] = {}
        if self.crop_padding > 0:
            side = 2 * self.crop_padding + 1
            out["dy"] = torch.randint(0, side, (batch,), device=where, generator=generator)
            out["dx"] = torch.randint(0, side, (batch,), device=where, generator=generator)
        if self.hflip:
            out["flip"] = torch.rand(batch, device=where, generator=generator) < 0.5
        if self.cutout_size > 0:
            out["cy"] = torch.randint(0, int(size[0]), (batch,), device=where, generator=generator)
            out["cx"] = torch.randint(0, int(size[1]), (batch,), device=where, generator=generator)
        return {k: v.to(device) for k, v in out.items()} if generator is not None else out

    def apply(self, x: Tensor, choices: dict[str, Tensor] | None = None) -> Tensor:
        """The transform with the given random ``choices`` (:meth:`draw`; ``None``: an evaluation batch)."""
        out = x.float().div_(255.0) if x.dtype == torch.uint8 else x.float()
        if choices is not None and "dy" in choices:
            out = crop(out, self.crop_padding, choices["dy"], choices["dx"])
        if choices is not None and "flip" in choices:
            out = hflip(out, choices["flip"])
        if self.mean is not None and self.std is not None:
            if self.mean.device != x.device:
                self.mean, self.std = self.mean.to(x.device), self.std.to(x.device)
            out = (out - self.mean) / self.std
        if choices is not None and "cy" in choices:
            out = cut(out, self.cutout_size, choices["cy"], choices["cx"])
        return out


class InputNormalization(nn.Module):
    """A model's input normalisation: raw inputs (as stored, e.g. uint8 images) → what its network was trained on.

    The deterministic part of :class:`BatchTransform` as a module: uint8 → float in [0, 1] (other dtypes → float as
    they are), then ``(x - mean) / std``, with the same arithmetic, so that a trained model carries it (``FedAvg``
    holds one, filled from the datamodule at fit start and saved in its checkpoints). ``mean`` and ``std`` are
    non-persistent buffers: they move and export with the module but stay out of ``state_dict()``, which the
    federation averages and loads into every client. Without statistics it only converts to float.

    Args:
        mean: the mean, shaped to broadcast against a batch (``[1, C, 1, 1]`` for images, ``[1, D]`` for feature
            vectors), on the scale after the uint8 → [0, 1] conversion; ``None``: no standardisation.
        std: the standard deviations, shaped as ``mean``.

    >>> norm = InputNormalization(torch.tensor([0.5]), torch.tensor([0.25]))
    >>> norm(torch.tensor([[0, 255]], dtype=torch.uint8))
    tensor([[-2.,  2.]])
    """

    def __init__(self, mean: Tensor | None = None, std: Tensor | None = None) -> None:
        super().__init__()
        self.register_buffer("mean", None, persistent=False)
        self.register_buffer("std", None, persistent=False)
        self.set_stats(mean, std)

    def set_stats(self, mean: Tensor | None, std: Tensor | None, device: torch.device | str | None = None) -> None:
        """Use ``mean`` and ``std`` (copied as float32 to ``device``, default: where they are), or none."""
        if (mean is None) != (std is None):
            raise ValueError("give both mean and std, or neither")
        self.mean = None if mean is None else mean.detach().to(device=device, dtype=torch.float32, copy=True)
        self.std = None if std is None else std.detach().to(device=device, dtype=torch.float32, copy=True)

    def copy_from(self, transform: BatchTransform, device: torch.device | str | None = None) -> None:
        """Take the normalisation of a datamodule's :class:`BatchTransform` (its augmentation is not part of it)."""
        self.set_stats(transform.mean, transform.std, device)

    def stats(self) -> dict[str, Tensor | None]:
        """``mean`` and ``std`` on the CPU (``None`` without statistics), as checkpoints store them."""
        return {k: None if v is None else v.detach().cpu() for k, v in (("mean", self.mean), ("std", self.std))}

    def forward(self, x: Tensor) -> Tensor:
        """A raw batch as the network's input: float, standardised."""
        out = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
        mean, std = self.mean, self.std
        if mean is not None and std is not None:
            out = (out - mean) / std
        return out


def input_stats(chunks: Iterable[Tensor], image: bool) -> tuple[list[float], list[float]]:
    """Mean and (population) standard deviation of the inputs, per channel (images), per feature (vectors) or overall.

    uint8 inputs are measured on the [0, 1] scale they are trained on (summed on their integer scale, exactly in
    float64, and divided by 255 at the end), other dtypes on their own scale; a zero standard deviation becomes 1.
    The one definition for the built-in datasets and a user's data.

    >>> mean, std = input_stats([torch.tensor([[[[0, 255]]]], dtype=torch.uint8)], image=True)
    >>> mean, std
    ([0.5], [0.5])
    """
    total = total_sq = None
    count = 0
    uint8 = False
    for x in chunks:
        uint8 = x.dtype == torch.uint8
        part = x.to(torch.float64)
        dims = (0, 2, 3) if image else (0,) if part.ndim == 2 else tuple(range(part.ndim))
        s, sq = part.sum(dim=dims), part.square().sum(dim=dims)
        total = s if total is None else total + s
        total_sq = sq if total_sq is None else total_sq + sq
        count += part.numel() // max(1, s.numel())
    if total is None or total_sq is None or count == 0:
        raise ValueError("no training inputs to compute normalisation statistics from")
    mean = total / count
    std = (total_sq / count - mean.square()).clamp_min(0).sqrt()
    if uint8:
        mean, std = mean / 255.0, std / 255.0
    std = torch.where(std > 0, std, torch.ones_like(std))
    return mean.reshape(-1).tolist(), std.reshape(-1).tolist()
