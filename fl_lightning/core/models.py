"""Networks used by the papers, built by name for any image shape and class count.

Every network returns logits from ``forward`` and exposes ``features(x)`` (the penultimate representation,
which MOON's projection head and feature-level methods use) and ``feature_dim``. A user's own ``nn.Module`` needs only
``forward`` (logits); :func:`require_features` says what a method needing more is missing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import Tensor, nn

from fl_lightning.core.messages import short
from fl_lightning.core.registry import Registry

#: An image side: one int for square images, or (height, width).
ImageSize = int | tuple[int, int]


def image_hw(image_size: ImageSize | list[int]) -> tuple[int, int]:
    """(height, width) of an image size given as one side or as a pair."""
    if isinstance(image_size, int | float):
        return int(image_size), int(image_size)
    h, w = image_size
    return int(h), int(w)


def _pooled_size(size: int, convs: list[tuple[int, int]]) -> int:
    """Spatial size after a chain of (kernel, padding) stride-1 convs each followed by 2x2 max-pooling."""
    for kernel, padding in convs:
        size = (size + 2 * padding - kernel + 1) // 2
    return size


def _pooled_area(image_size: ImageSize, convs: list[tuple[int, int]]) -> tuple[int, int]:
    h, w = image_hw(image_size)
    return _pooled_size(h, convs), _pooled_size(w, convs)


class _ConvNet(nn.Module):
    """Conv feature extractor followed by a fully connected head (the small CNNs of the papers)."""

    def __init__(self, body: nn.Sequential, hidden: nn.Sequential, feature_dim: int, num_classes: int) -> None:
        super().__init__()
        self.body = body
        self.hidden = hidden
        self.feature_dim = feature_dim
        self.classifier = nn.Linear(feature_dim, num_classes)

    def features(self, x: Tensor) -> Tensor:
        """Penultimate-layer representation."""
        return self.hidden(torch.flatten(self.body(x), 1))

    def forward(self, x: Tensor) -> Tensor:
        """Class logits."""
        return self.classifier(self.features(x))


def lenet(in_channels: int, image_size: ImageSize, num_classes: int) -> nn.Module:
    """NIID-Bench / FedSSD / FedCAD CNN: conv 6@5x5 → pool → conv 16@5x5 → pool → fc 120 → fc 84 → C.

    Small inputs (digits' 8x8) get padding 2 so the two 5x5 convolutions still fit.
    """
    pad = 0 if min(image_hw(image_size)) >= 16 else 2
    rows, cols = _pooled_area(image_size, [(5, pad), (5, pad)])
    if min(rows, cols) < 1:
        h, w = image_hw(image_size)
        raise ValueError(f"lenet needs images of at least 8x8 pixels, got {h}x{w}")
    body = nn.Sequential(
        nn.Conv2d(in_channels, 6, 5, padding=pad),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5, padding=pad),
        nn.ReLU(),
        nn.MaxPool2d(2),
    )
    hidden = nn.Sequential(nn.Linear(16 * rows * cols, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU())
    return _ConvNet(body, hidden, 84, num_classes)


def cnn(in_channels: int, image_size: ImageSize, num_classes: int) -> nn.Module:
    """FedNTD / FedLMD CNN: conv 32@5x5 pad 2 → pool → conv 64@5x5 pad 2 → pool → fc 512 → C (512-d features)."""
    rows, cols = _pooled_area(image_size, [(5, 2), (5, 2)])
    body = nn.Sequential(
        nn.Conv2d(in_channels, 32, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
    )
    hidden = nn.Sequential(nn.Linear(64 * rows * cols, 512), nn.ReLU())
    return _ConvNet(body, hidden, 512, num_classes)


def tcnn(in_channels: int, image_size: ImageSize, num_classes: int) -> nn.Module:
    """FedKA t-CNN: conv 32@3x3 → pool → conv 64@3x3 → pool → fc 512 → C."""
    rows, cols = _pooled_area(image_size, [(3, 1), (3, 1)])
    body = nn.Sequential(
        nn.Conv2d(in_channels, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
    )
    hidden = nn.Sequential(nn.Linear(64 * rows * cols, 512), nn.ReLU())
    return _ConvNet(body, hidden, 512, num_classes)


class _BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x: Tensor) -> Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class _Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        out_planes = planes * self.expansion
        self.conv1 = nn.Conv2d(in_planes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out_planes, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != out_planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, out_planes, 1, stride, bias=False), nn.BatchNorm2d(out_planes)
            )

    def forward(self, x: Tensor) -> Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = torch.relu(self.bn2(self.conv2(out)))
        return torch.relu(self.bn3(self.conv3(out)) + self.shortcut(x))


class ResNet(nn.Module):
    """CIFAR-style ResNet (3x3 stem, no initial max-pool) for any channel count and image size."""

    def __init__(
        self,
        block: type[_BasicBlock] | type[_Bottleneck],
        num_blocks: list[int],
        widths: list[int],
        in_channels: int,
        num_classes: int,
    ) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()
        )
        layers: list[nn.Module] = []
        in_planes = widths[0]
        for i, (n, width) in enumerate(zip(num_blocks, widths, strict=True)):
            for j in range(n):
                stride = 2 if (i > 0 and j == 0) else 1
                layers.append(block(in_planes, width, stride))
                in_planes = width * block.expansion
        self.layers = nn.Sequential(*layers)
        self.feature_dim = in_planes
        self.classifier = nn.Linear(in_planes, num_classes)

    def features(self, x: Tensor) -> Tensor:
        """Globally pooled representation."""
        out = self.layers(self.stem(x))
        return torch.flatten(nn.functional.adaptive_avg_pool2d(out, 1), 1)

    def forward(self, x: Tensor) -> Tensor:
        """Class logits."""
        return self.classifier(self.features(x))


def resnet8(in_channels: int, image_size: ImageSize, num_classes: int) -> nn.Module:
    """ResNet-8: three stages of one basic block (16, 32, 64 channels)."""
    return ResNet(_BasicBlock, [1, 1, 1], [16, 32, 64], in_channels, num_classes)


def resnet18(in_channels: int, image_size: ImageSize, num_classes: int) -> nn.Module:
    """ResNet-18 with a CIFAR stem."""
    return ResNet(_BasicBlock, [2, 2, 2, 2], [64, 128, 256, 512], in_channels, num_classes)


def resnet50(in_channels: int, image_size: ImageSize, num_classes: int) -> nn.Module:
    """ResNet-50 with a CIFAR stem."""
    return ResNet(_Bottleneck, [3, 4, 6, 3], [64, 128, 256, 512], in_channels, num_classes)


def _builder_entry(name: str, entry: object) -> str | None:
    """What is wrong with a :data:`MODELS` entry, if anything; a built network (callable too) is refused."""
    if isinstance(entry, nn.Module):
        return (
            f"must be a builder (in_channels, image_size, num_classes), got a built {type(entry).__name__}; register "
            "a function or class that builds the network (or pass the network itself as net=)"
        )
    return None if callable(entry) else f"must be a builder (in_channels, image_size, num_classes), got {short(entry)}"


#: The networks built by name (``net="lenet"``, ``--model.net lenet``): name → builder
#: ``(in_channels, image_size, num_classes) -> nn.Module``. Add an entry to build your own by name.
MODELS: Registry[Callable[[int, ImageSize, int], nn.Module]] = Registry(
    "MODELS",
    _builder_entry,
    {"lenet": lenet, "cnn": cnn, "tcnn": tcnn, "resnet8": resnet8, "resnet18": resnet18, "resnet50": resnet50},
)


def build_model(name: str, in_channels: int, image_size: ImageSize, num_classes: int) -> nn.Module:
    """Build a network by name for ``in_channels`` x height x width inputs and ``num_classes``.

    Args:
        name: one of :data:`MODELS`.
        in_channels: image channels.
        image_size: image side (square) or (height, width).
        num_classes: classes, at least 2.

    Raises:
        ValueError: for an unknown name or impossible shapes.
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)} or pass an nn.Module")
    h, w = image_hw(image_size)
    if in_channels < 1 or min(h, w) < 1 or num_classes < 2:
        raise ValueError(
            f"model {name!r} needs in_channels >= 1, an image size >= 1 and num_classes >= 2, "
            f"got {in_channels}, {h}x{w}, {num_classes}"
        )
    return MODELS[name](in_channels, image_size, num_classes)


def trainable(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The module's trainable parameters (``requires_grad``) by name, in ``named_parameters()`` order.

    What a local step updates, the server optimizer steps and a method's parameter-space state (control variates,
    dual variables, Fisher) covers: a frozen parameter is none of these.
    """
    return [(name, p) for name, p in module.named_parameters() if p.requires_grad]


@contextlib.contextmanager
def in_mode(module: nn.Module, training: bool) -> Iterator[nn.Module]:
    """``module`` in training (or evaluation) mode for the block, back in its own mode after it, even on an error."""
    was_training = module.training
    module.train(training)
    try:
        yield module
    finally:
        module.train(was_training)


def require_features(net: nn.Module, method_name: str) -> None:
    """Check that ``net`` exposes ``features(x)`` and ``feature_dim`` (penultimate representation and its size).

    Raises:
        TypeError: naming the missing attribute and the method that needs it.
    """
    missing = [
        what
        for what, ok in (
            ("a features(x) method", callable(getattr(net, "features", None))),
            ("an integer feature_dim attribute", isinstance(getattr(net, "feature_dim", None), int)),
        )
        if not ok
    ]
    if missing:
        raise TypeError(
            f"{method_name} needs the network's penultimate features, but {type(net).__name__} lacks "
            f"{' and '.join(missing)}; add them to your network (features(x) -> [B, feature_dim], and forward(x) = "
            "a linear classifier of features(x)) or use a built-in network"
        )


def net_name(net: nn.Module | str) -> str:
    """What results record as the network: a built-in name, or the module's import path (``mypkg.MyNet``)."""
    if isinstance(net, str):
        return net
    cls = type(net)
    return cls.__qualname__ if cls.__module__ in ("builtins", "__main__") else f"{cls.__module__}.{cls.__qualname__}"
