"""Batched image augmentation on tensors, on whatever device the batch lives (no per-sample PIL path)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def random_crop(x: Tensor, padding: int, generator: torch.Generator | None = None) -> Tensor:
    """Pad each image by ``padding`` zeros and crop a random window of the original size (torchvision's RandomCrop)."""
    if padding <= 0:
        return x
    b, _, h, w = x.shape
    padded = torch.nn.functional.pad(x, (padding, padding, padding, padding))
    dy = torch.randint(0, 2 * padding + 1, (b,), device=x.device, generator=generator)
    dx = torch.randint(0, 2 * padding + 1, (b,), device=x.device, generator=generator)
    rows = (dy[:, None] + torch.arange(h, device=x.device)[None, :])[:, None, :, None]  # [B,1,H,1]
    cols = (dx[:, None] + torch.arange(w, device=x.device)[None, :])[:, None, None, :]  # [B,1,1,W]
    batch = torch.arange(b, device=x.device)[:, None, None, None]
    channels = torch.arange(x.shape[1], device=x.device)[None, :, None, None]
    return padded[batch, channels, rows, cols]


def random_hflip(x: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Mirror each image left-right with probability 1/2."""
    flip = torch.rand(x.shape[0], device=x.device, generator=generator) < 0.5
    return torch.where(flip[:, None, None, None], x.flip(-1), x)


def cutout(x: Tensor, size: int, generator: torch.Generator | None = None) -> Tensor:
    """Zero a ``size`` x ``size`` square centred at a random pixel of each image (DeVries & Taylor, 2017)."""
    if size <= 0:
        return x
    b, _, h, w = x.shape
    cy = torch.randint(0, h, (b,), device=x.device, generator=generator)
    cx = torch.randint(0, w, (b,), device=x.device, generator=generator)
    ys = torch.arange(h, device=x.device)[None, :]
    xs = torch.arange(w, device=x.device)[None, :]
    in_y = (ys >= (cy[:, None] - size // 2)) & (ys < (cy[:, None] - size // 2 + size))  # [B,H]
    in_x = (xs >= (cx[:, None] - size // 2)) & (xs < (cx[:, None] - size // 2 + size))  # [B,W]
    mask = in_y[:, None, :, None] & in_x[:, None, None, :]
    return x.masked_fill(mask, 0.0)


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

    def __call__(self, x: Tensor, train: bool) -> Tensor:
        """Transform a raw batch (uint8 or float) into a normalised float32 one."""
        out = x.float().div_(255.0) if x.dtype == torch.uint8 else x.float()
        if train and self.crop_padding > 0:
            out = random_crop(out, self.crop_padding)
        if train and self.hflip:
            out = random_hflip(out)
        if self.mean is not None and self.std is not None:
            if self.mean.device != x.device:
                self.mean, self.std = self.mean.to(x.device), self.std.to(x.device)
            out = (out - self.mean) / self.std
        if train and self.cutout_size > 0:
            out = cutout(out, self.cutout_size)
        return out
