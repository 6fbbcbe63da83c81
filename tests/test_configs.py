"""Every YAML in configs/ parses with LightningCLI and runs one tiny round; the CLI's resume and overrides work."""

from __future__ import annotations

import gzip
import pickle
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import read_metrics, read_summary

from fl_lightning.cli import cli_main

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
sys.path.insert(0, str(ROOT / "scripts"))


def _write_idx(folder: Path, n_train: int = 300, n_test: int = 100) -> None:
    """Fashion-MNIST-format IDX files (gzipped) with class-dependent images, so that a model can learn them."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        labels = (np.arange(n) % 10).astype(np.uint8)
        images = rng.integers(0, 40, (n, 28, 28), dtype=np.uint8)
        for i, y in enumerate(labels):
            images[i, 2 * y : 2 * y + 6, :] = 250
        with gzip.open(folder / f"{prefix}-images-idx3-ubyte.gz", "wb") as f:
            f.write(struct.pack(">IIII", 2051, n, 28, 28) + images.tobytes())
        with gzip.open(folder / f"{prefix}-labels-idx1-ubyte.gz", "wb") as f:
            f.write(struct.pack(">II", 2049, n) + labels.tobytes())


def _write_cifar10(folder: Path, per_batch: int = 60, n_test: int = 100) -> None:
    rng = np.random.default_rng(0)
    base = folder / "cifar-10-batches-py"
    base.mkdir(parents=True, exist_ok=True)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        n = n_test if name == "test_batch" else per_batch
        labels = [int(i % 10) for i in range(n)]
        data = rng.integers(0, 255, (n, 3072), dtype=np.uint8)
        with open(base / name, "wb") as f:
            pickle.dump({b"data": data, b"labels": labels}, f)


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    _write_idx(root)
    _write_cifar10(root)
    return root


def _tiny_overrides(config: Path, data_root: Path, run_dir: Path) -> list[str]:
    cfg = yaml.safe_load(config.read_text())
    data = cfg["data"]
    args = [
        "fit",
        "--config",
        str(config),
        "--trainer.default_root_dir",
        str(run_dir),
        "--trainer.enable_progress_bar",
        "false",
        "--federation.rounds",
        "1",
        "--federation.local_epochs",
        "1",
        "--federation.plots",  # a config's plots are the quickstart's (test_engine, test_plots)
        "false",
    ]
    if data["dataset"] != "digits":
        args += ["--data.root", str(data_root)]
        clients = min(data["num_clients"], 10)
        args += ["--data.num_clients", str(clients)]
        if data.get("holdout_per_class", 0) > 5:
            args += ["--data.holdout_per_class", "5"]
            if cfg["model"]["class_path"].endswith("FedSSD"):
                args += ["--model.aux_per_class", "5"]
        if data.get("partition") == "dirichlet":
            args += ["--data.min_client_size", "2"]
    return args


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_config_runs_one_tiny_round(config, data_root, tmp_path):
    run_dir = tmp_path / "run"
    cli_main(_tiny_overrides(config, data_root, run_dir))
    summary = read_summary(run_dir)
    assert summary["status"] == "completed"
    assert summary["rounds"] == 1
    assert 0.0 <= summary["final_acc"] <= 1.0
    assert (run_dir / "config.yaml").exists()
    assert (run_dir / "metrics.csv").exists()


def test_configs_are_generated_and_in_sync():
    import make_configs

    for name, text in make_configs.all_configs().items():
        path = ROOT / "configs" / name
        assert path.read_text(encoding="utf-8") == text, f"configs/{name} is stale: run scripts/make_configs.py"


def test_issue_config_names_exist():
    names = {c.name for c in CONFIGS}
    for method in ("fedavg", "kd", "fedntd", "fedlmd", "fedlmd_tf", "fedssd", "fedcad", "fedka"):
        for part in ("shard2", "lda01"):
            assert f"{method}_fmnist_{part}.yaml" in names
    for tag in ("iid", "dir05", "c1", "c2", "c3"):
        assert f"fedavg_fmnist_niid_{tag}.yaml" in names
    assert "quickstart.yaml" in names


def test_quickstart_learns(tmp_path):
    """The README's main job, shortened: a few rounds already learn digits."""
    run_dir = tmp_path / "qs"
    cli_main(
        [
            "fit",
            "--config",
            str(ROOT / "configs/quickstart.yaml"),
            "--trainer.default_root_dir",
            str(run_dir),
            "--trainer.enable_progress_bar",
            "false",
            "--federation.rounds",
            "5",
        ]
    )
    assert read_summary(run_dir)["final_acc"] > 0.8


def test_cli_resume_continues_identically(tmp_path):
    base = [
        "fit",
        "--config",
        str(ROOT / "configs/quickstart.yaml"),
        "--trainer.enable_progress_bar",
        "false",
        "--federation.local_epochs",
        "1",
        "--data.num_clients",
        "4",
        "--federation.lr_decay",
        "0.9",
    ]
    cli_main([*base, "--trainer.default_root_dir", str(tmp_path / "full"), "--federation.rounds", "3"])
    cli_main([*base, "--trainer.default_root_dir", str(tmp_path / "cut"), "--federation.rounds", "2"])
    assert (tmp_path / "cut" / "checkpoints" / "last.ckpt").exists()
    resumed = cli_main(
        [*base, "--trainer.default_root_dir", str(tmp_path / "cut"), "--federation.rounds", "3", "--ckpt_path", "last"]
    )
    assert str(resumed.trainer.ckpt_path).endswith(".ckpt")  # restored, not restarted
    full, cut = read_metrics(tmp_path / "full"), read_metrics(tmp_path / "cut")
    assert [r["global_acc"] for r in full] == [r["global_acc"] for r in cut]
    assert [r["global_loss"] for r in full] == [r["global_loss"] for r in cut]


def test_cli_help_documents_options(capsys):
    with pytest.raises(SystemExit):
        cli_main(["fit", "--help"])
    out = capsys.readouterr().out
    for option in (
        "--federation.rounds",
        "--federation.sample_ratio",
        "--data.partition",
        "--data.alpha",
        "--data.num_clients",
        "--seed_everything",
        "--trainer.precision",
        "--trainer.logger",
    ):
        assert option in out
    assert "Dirichlet concentration" in out


def test_cli_rejects_bad_input(tmp_path):
    with pytest.raises((ValueError, SystemExit)):
        cli_main(
            [
                "fit",
                "--config",
                str(ROOT / "configs/quickstart.yaml"),
                "--data.alpha",
                "0",
                "--trainer.default_root_dir",
                str(tmp_path),
            ]
        )


def test_method_by_short_name_and_override():
    from fl_lightning.methods import FedNTD

    cli = cli_main(
        [
            "--config",
            str(ROOT / "configs/quickstart.yaml"),
            "--model",
            "FedNTD",
            "--model.beta",
            "0.5",
            "--data.partition",
            "shard",
            "--data.shards_per_client",
            "3",
            "--seed_everything",
            "4",
        ],
        run=False,
    )
    assert isinstance(cli.model, FedNTD) and cli.model.beta == 0.5
    assert cli.model.num_classes == 10 and cli.model.hparams.image_size == 8  # linked from the data
    assert cli.datamodule.partitioner.shards_per_client == 3 and cli.datamodule.seed == 4
