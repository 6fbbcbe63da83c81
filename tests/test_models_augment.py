"""Networks for every dataset shape, and batched tensor augmentation."""

from __future__ import annotations

import pytest
import torch

from fl_lightning.core.augment import BatchTransform, cutout, random_crop, random_hflip
from fl_lightning.core.models import MODELS, build_model
from fl_lightning.data import DATASET_SHAPES


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("dataset", ["digits", "fashion_mnist", "cifar100", "tinyimagenet"])
def test_models_fit_every_dataset(name, dataset):
    channels, size, classes = DATASET_SHAPES[dataset]
    if name == "resnet50" and size > 32:
        pytest.skip("slow on a CPU and covered by the 32x32 case")
    net = build_model(name, channels, size, classes).eval()
    x = torch.randn(2, channels, size, size)
    with torch.no_grad():
        assert net(x).shape == (2, classes)
        assert net.features(x).shape == (2, net.feature_dim)


def test_paper_feature_sizes():
    assert build_model("cnn", 3, 32, 10).feature_dim == 512
    assert build_model("lenet", 1, 28, 10).feature_dim == 84


def test_unknown_model():
    with pytest.raises(ValueError, match="unknown model"):
        build_model("vgg", 3, 32, 10)


def test_random_crop_is_a_shifted_window():
    x = torch.arange(16.0).view(1, 1, 4, 4).repeat(8, 1, 1, 1)
    torch.manual_seed(0)
    out = random_crop(x, padding=1)
    assert out.shape == x.shape
    for img in out:
        # every crop is the original shifted by at most one pixel, zero-padded
        found = False
        for dy in (-1, 0, 1):
            for dx in (-1, 0, 1):
                shifted = torch.nn.functional.pad(x[0], (1, 1, 1, 1))[:, 1 + dy : 5 + dy, 1 + dx : 5 + dx]
                found |= torch.equal(img, shifted)
        assert found


def test_hflip_flips_about_half():
    torch.manual_seed(0)
    x = torch.arange(4.0).view(1, 1, 1, 4).repeat(200, 1, 1, 1)
    out = random_hflip(x)
    flipped = (out[:, 0, 0, 0] == 3).sum().item()
    assert 60 < flipped < 140
    assert torch.all((out[:, 0, 0, 0] == 0) | (out[:, 0, 0, 0] == 3))


def test_cutout_zeroes_a_square():
    torch.manual_seed(0)
    out = cutout(torch.ones(5, 1, 16, 16), size=4)
    zeros = (out == 0).sum(dim=(1, 2, 3))
    assert torch.all(zeros <= 16) and torch.all(zeros >= 4)


def test_transform_normalises_and_only_augments_training():
    t = BatchTransform(mean=[0.5], std=[0.25], crop_padding=2, hflip=True, cutout_size=3)
    x = torch.full((4, 1, 8, 8), 191, dtype=torch.uint8)
    test = t(x, train=False)
    torch.testing.assert_close(test, torch.full((4, 1, 8, 8), (191 / 255 - 0.5) / 0.25))
    torch.manual_seed(0)
    assert not torch.equal(t(x, train=True), test)
    assert BatchTransform([0.5], [0.5]).augments is False
