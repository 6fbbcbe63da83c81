"""The three examples in examples/, each on tiny data."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import read_summary
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))


def test_tabular_mlp_federated_within_five_points_of_central(tmp_path):
    from tabular_mlp import main

    result = main(rounds=4, local_epochs=2, out=str(tmp_path))
    assert result["central"] > 0.9
    assert result["federated"] >= result["central"] - 0.05
    assert read_summary(tmp_path)["dataset"] == "breast_cancer"


def _write_image_folder(root: Path, per_class: tuple[int, int], size: tuple[int, int]) -> None:
    """Three classes of non-square PNGs told apart by a coloured patch's colour and place."""
    rng = np.random.default_rng(0)
    colours = [(220, 40, 40), (40, 200, 40), (40, 40, 220)]
    h, w = size
    for split, n in zip(("train", "test"), per_class, strict=True):
        for c, colour in enumerate(colours):
            folder = root / split / f"class_{c}"
            folder.mkdir(parents=True)
            for i in range(n):
                img = rng.integers(0, 90, (h, w, 3), dtype=np.uint8)
                img[h // 6 : h // 2, c * w // 4 : c * w // 4 + w // 3] = colour
                Image.fromarray(img).save(folder / f"{i}.png")


def test_image_folder_with_a_torchvision_model(tmp_path):
    from image_folder import main

    _write_image_folder(tmp_path / "shapes", per_class=(12, 4), size=(20, 28))
    accuracy = main(
        str(tmp_path / "shapes"), size=(20, 28), rounds=2, num_clients=3, local_epochs=1, out=str(tmp_path / "run")
    )
    summary = read_summary(tmp_path / "run")
    assert summary["dataset"] == "shapes" and summary["model"] == "torchvision.models.resnet.ResNet"
    assert summary["status"] == "completed" and 0 <= accuracy <= 1


def test_image_folder_refuses_a_test_tree_missing_a_class_and_a_missing_folder(tmp_path):
    from image_folder import main

    root = tmp_path / "shapes"
    _write_image_folder(root, per_class=(4, 2), size=(8, 8))
    shutil.rmtree(root / "test" / "class_1")  # class_2's test images would be labelled 1
    with pytest.raises(ValueError, match=r"test data's classes differ .*missing 'class_1'"):
        main(str(root), size=(8, 8), rounds=1, out=str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()
    with pytest.raises(FileNotFoundError, match=r"nowhere.train is not a folder"):
        main(str(tmp_path / "nowhere"), out=str(tmp_path / "run"))


def test_own_module_as_fedavg_and_with_ntd_loss(tmp_path):
    from own_module import main

    result = main(rounds=3, out=str(tmp_path))
    assert result["fedavg"] > 0.5 and result["fedntd"] > 0.5
