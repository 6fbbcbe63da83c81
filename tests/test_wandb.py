"""The real W&B logger, offline and without a key: what the run wrote to its local W&B files."""

from __future__ import annotations

import json
import struct
import time

import pytest

wandb = pytest.importorskip("wandb")


def _records(run_file):
    """The protobuf records of a ``.wandb`` file (W&B's LevelDB-style log: 32 KiB blocks of framed chunks)."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        payload = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0:  # padding up to the block's end
            pos += 32768 - pos % 32768 if pos % 32768 else 0
            continue
        pending = payload if kind in (1, 2) else pending + payload
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


@pytest.mark.slow
def test_wandb_offline_run(tmp_path, monkeypatch):
    from fl_lightning.cli import cli_main

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    cli_main(
        [
            "fit",
            "--config",
            "configs/quickstart.yaml",
            "--federation.rounds",
            "3",
            "--federation.local_epochs",
            "2",
            "--trainer.default_root_dir",
            str(tmp_path),
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.logger",
            "WandbLogger",
            "--trainer.logger.offline",
            "true",
            "--trainer.logger.save_dir",
            str(tmp_path),
            "--trainer.logger.project",
            "fl_lightning_test",
            "--trainer.logger.group",
            "unit",
            "--trainer.logger.tags",
            '["fedavg", "seed0"]',
        ]
    )
    wandb.finish()  # flush the run's records, as a finished process does
    run_dirs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(run_dirs) == 1
    for _ in range(20):  # W&B's service may still be writing the file after finish() on a busy machine
        history, config, summary, tags = _read_run(run_dirs[0])
        if any("global/acc" in h for h in history):
            break
        time.sleep(0.5)
    rows = [h for h in history if "global/acc" in h]
    # one point per round; Lightning's WandbLogger records the step we pass (the round) as trainer/global_step
    assert [int(h["trainer/global_step"]) for h in rows] == [1, 2, 3]
    metrics = (tmp_path / "metrics.csv").read_text().splitlines()
    assert float(metrics[-1].split(",")[1]) == pytest.approx(rows[-1]["global/acc"])
    assert any(key.startswith("federation/rounds") for key in config)
    assert "final_acc" in summary and "status" in summary
    assert set(tags) >= {"fedavg", "seed0"}
    images = list(run_dirs[0].glob("files/media/images/plots/*.png"))
    assert len(images) == 2


def _read_run(run_dir):
    history, config, summary, tags = [], {}, {}, []
    for record in _records(next(run_dir.glob("run-*.wandb"))):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            )
        elif kind == "config":
            config.update({item.key or "/".join(item.nested_key): item.value_json for item in record.config.update})
        elif kind == "summary":
            summary.update({item.key or "/".join(item.nested_key): item.value_json for item in record.summary.update})
        elif kind == "run":
            tags = list(record.run.tags)
    return history, config, summary, tags
