"""Bad input found by a sweep of the command line's options: refused at start-up, in one line, before the run directory.

Each case was accepted before (silently, or failing only once the run directory existed, or in a line that did not say
what to change).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fl_lightning import FedAvg
from fl_lightning.cli import EXIT_CODES, run
from fl_lightning.core.data_settings import resolve_data_settings
from fl_lightning.core.datasets import load_dataset
from fl_lightning.core.partitions import make_partitioner
from fl_lightning.experiments.compare import CompareSpec

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = str(ROOT / "configs/quickstart.yaml")
BASE = ["fit", "--config", QUICKSTART, "--data.num_clients", "3", "--federation.rounds", "1"]


@pytest.mark.parametrize(
    ("augment", "message"),
    [
        ((-1, False, 0), "crop_padding must be 0 (off) or a padding below digits's image side 8, got -1"),
        (
            (8, False, 0),
            "set it between 0 and 7 (--data.crop_padding, in Python FederatedDataModule(crop_padding=...))",
        ),
        ((0, False, -1), "cutout must be 0 (off) or a square side below digits's image side 8, got -1"),
        ((0, False, 100), "set it between 0 and 7 (--data.cutout, in Python FederatedDataModule(cutout=...))"),
    ],
)
def test_augmentation_out_of_range(augment, message):
    # Before: accepted; a negative padding or cutout, or one as large as the image, trained on blank inputs.
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve_data_settings("digits", "iid", num_clients=3, augment=augment)
    resolve_data_settings("digits", "iid", num_clients=3, augment=(2, True, 4))  # in range


@pytest.mark.parametrize(
    ("partition", "options", "match"),
    [
        ("iid", {"alpha": 0}, "Dirichlet concentration must be a positive number"),
        ("shard", {"alpha": -1.0}, "Dirichlet concentration must be a positive number"),
        ("iid", {"classes_per_client": -1}, "classes_per_client must be at least 1"),
        ("dirichlet", {"shards_per_client": 0}, "shards_per_client must be at least 1"),
    ],
)
def test_another_partitions_option_out_of_range(partition, options, match):
    # Before: an option of another partition was ignored whatever its value (--data.partition iid --data.alpha 0).
    with pytest.raises(ValueError, match=match):
        make_partitioner(partition, **options)


@pytest.mark.parametrize(
    ("partition", "options", "match"),
    [
        # Before: "min_size must be at least 0", the class's argument, not the option the user gave.
        ("dirichlet", {"min_client_size": -1}, "^min_client_size must be at least 0, got -1$"),
        ("iid", {"min_client_size": -1}, "^min_client_size must be at least 0, got -1$"),
        # Before: accepted with another partition, though digits has 10 classes.
        ("iid", {"classes_per_client": 11}, r"classes_per_client must be between 1 and 10 \(the classes\), got 11"),
        ("classes_per_client", {"classes_per_client": 11}, r"must be between 1 and 10 \(the classes\), got 11"),
    ],
)
def test_partition_options_are_refused_by_their_own_names_and_against_the_classes(partition, options, match):
    with pytest.raises(ValueError, match=match):
        resolve_data_settings("digits", partition, num_clients=3, **options)
    resolve_data_settings("digits", partition, num_clients=3, classes_per_client=10)  # in range


def test_another_partitions_option_in_range_is_still_ignored():
    assert make_partitioner("iid", alpha=0.1, shards_per_client=5).label == "iid"  # configs compose


def test_data_root_that_is_a_file(tmp_path):
    # Before: with --data.download true, "error: FileExistsError: [Errno 17] File exists" and exit 1 (failed).
    root = tmp_path / "afile"
    root.write_text("")
    with pytest.raises(
        ValueError,
        match=r"root .*afile is a file; give the folder .*\(--data.root, in Python FederatedDataModule\(root=...\)\)$",
    ):
        load_dataset("cifar10", root=str(root), download=True)


def test_negative_weight_decay():
    # Before: accepted, then torch's "Invalid weight_decay value: -1.0" once the run directory was written.
    with pytest.raises(ValueError, match=r"^weight_decay must be >= 0, got -1.0; give 0 for none$"):
        FedAvg(weight_decay=-1.0)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        # Before: "error: --model.clip_grad_norm: Problem with given class_path 'fl_lightning.module.FedAvg':"
        (
            ["--model.clip_grad_norm", "nan"],
            "error: --model.clip_grad_norm: expected a finite float or None, got 'nan' (not a number)",
        ),
        # Before: "expected float or None, got 'inf'" (inf is a float)
        (
            ["--federation.client_state_mb", "inf"],
            "error: --federation.client_state_mb: expected a finite float or None, got 'inf' (infinite)",
        ),
        # Before: "error: argument federation.rounds --> trainer.max_epochs: invalid Optional value: '5'"
        (["--trainer.max_epochs", "5"], "error: --trainer.max_epochs is set from --federation.rounds"),
        # Before: "error: -1 is not in bounds, numpy accepts from 0 to 4294967295" (no option named)
        (["--seed_everything", "-1"], "error: --seed_everything -1: a seed must be between 0 and 4294967295"),
        # Before: "error: --data.seed: expected int, got 'True'" (Lightning's random seed, named as another option)
        (["--seed_everything", "true"], "error: --seed_everything true: the partition and the client sampling derive"),
        # Before: ZeroDivisionError (exit 1) once the run directory was written
        (["--trainer.check_val_every_n_epoch", "0"], "error: trainer option check_val_every_n_epoch=0 must be"),
        # Before: accepted (a negative clipping value means nothing)
        (["--trainer.gradient_clip_val", "-1"], "error: trainer option gradient_clip_val=-1 must be >= 0"),
        # Before: Lightning's "Automatic gradient clipping is not supported for manual optimization", once started
        (
            ["--trainer.gradient_clip_val", "1.0"],
            "error: trainer option gradient_clip_val=1.0 is not supported by fedavg",
        ),
        # Before: validation ran after each client of a round, on its local model
        (["--trainer.val_check_interval", "0.5"], "error: trainer option val_check_interval=0.5 is not supported:"),
        # Before: exit 1 with no line, and a run directory holding only config.yaml
        (["--trainer.max_time", "00:00:00:00"], "error: trainer option max_time='00:00:00:00' stops the fit before"),
        # Before: accepted, and the fit ended after its rounds anyway
        (["--trainer.min_epochs", "5"], "error: trainer option min_epochs=5 exceeds rounds=1"),
        # Before: accepted, and the model was built with the data's value instead
        (["--model.num_classes", "5"], "error: --model.num_classes 5 disagrees with the data (digits has num_classes"),
        (["--model.in_channels", "3"], "error: --model.in_channels 3 disagrees with the data (digits has in_channels"),
    ],
    ids=lambda v: v if isinstance(v, str) else " ".join(v),
)
def test_refused_at_start_up_in_one_line(tmp_path, capsys, extra, message):
    assert run([*BASE, "--trainer.default_root_dir", str(tmp_path / "r"), *extra]) == EXIT_CODES["bad input"]
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), lines
    assert not (tmp_path / "r").exists()  # refused before the run directory


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("fedntd", "model: fedntd is the command line's name for FedNTD; in a config file write model: FedNTD"),
        ("fedntdd", "model: fedntdd: unknown method; did you mean fedntd?"),
    ],
)
def test_a_config_naming_its_method_as_the_command_line_does(tmp_path, capsys, model, message):
    from fl_lightning.cli_args import check_config_method

    # Before: "error: --model: Expected a path but fedntd either not accessible or invalid"
    config = tmp_path / "mine.yaml"
    config.write_text(f"model: {model}\ndata:\n  dataset: digits\n  num_clients: 3\nfederation:\n  rounds: 1\n")
    assert run(["fit", "--config", str(config), "--trainer.default_root_dir", str(tmp_path / "r")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --config {config}: {message}"), lines
    assert not (tmp_path / "r").exists()
    config.write_text(config.read_text().replace(f"model: {model}", "model: FedNTD"))  # what it says to write
    check_config_method(str(config))  # accepted (jsonargparse takes a class name)


def test_model_fact_that_agrees_with_the_data_is_accepted():
    from fl_lightning.cli_args import check_data_facts

    class Data:
        dataset, num_classes, in_channels, image_size = "digits", 10, 1, 8

    check_data_facts({"num_classes": 10, "in_channels": None, "image_size": [8, 8]}, Data())
    with pytest.raises(ValueError, match="--model.image_size 32 disagrees"):
        check_data_facts({"image_size": 32}, Data())

    class Own:  # a user's module whose own default the data replaces: not given, so not refused
        def __init__(self, num_classes: int = 3) -> None:
            self.num_classes = num_classes

    check_data_facts({"num_classes": 3}, Data(), Own)
    with pytest.raises(ValueError, match="--model.num_classes 5 disagrees"):
        check_data_facts({"num_classes": 5}, Data(), Own)


def _spec(tmp_path: Path, **raw) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"settings": {"q": QUICKSTART}, "output_dir": str(tmp_path / "out"), **raw}))
    return path


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        # Before: every method of a setting with one config trained that config's method, under each method's name.
        ({"methods": ["fedavg", "fedntd"]}, "it trains fl_lightning.FedAvg, not fedntd; give the setting a path with"),
        ({"methods": ["fedavg", "fedavgg"]}, "method fedavgg: unknown method; did you mean fedavg?"),
        # Before: the same run listed twice (its directory shared).
        ({"methods": ["fedavg", "fedavg"]}, "methods lists fedavg more than once"),
        ({"methods": ["fedavg"], "seeds": [0, 0]}, "seeds lists 0 more than once"),
        # Before: every fit of that seed failed after it started.
        ({"methods": ["fedavg"], "seeds": [-1]}, "seed -1 is out of range; a seed is between 0 and 4294967295"),
    ],
)
def test_compare_refuses(tmp_path, raw, match):
    with pytest.raises(ValueError, match=match):
        CompareSpec.from_yaml(_spec(tmp_path, **raw))


def test_compare_one_config_for_its_own_method_and_variants(tmp_path):
    variants = {"fedavg_lr": {"method": "fedavg", "overrides": ["--model.init_args.lr", "0.01"]}}
    spec = CompareSpec.from_yaml(_spec(tmp_path, methods=["fedavg", "fedavg_lr"], variants=variants))
    assert [r.method for r in spec.runs()] == ["fedavg", "fedavg_lr"]
