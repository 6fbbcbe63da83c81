"""What a user who follows the docs literally ran into: each test names the command and what it got before."""

from __future__ import annotations

import yaml
from helpers import quickstart_fit_args, read_summary

from fl_lightning.cli import run


def test_a_ckpt_path_before_the_runs_own_config_still_resumes(tmp_path):
    """``fit --ckpt_path last --config <run dir>/config.yaml``: the saved ``ckpt_path: null`` undid the flag.

    The fit then refused the run as finished ("pass --overwrite to replace it", which for an interrupted run would have
    moved its checkpoint aside), and ``test --ckpt_path <file> --config <run dir>/config.yaml`` asked for a
    ``--ckpt_path``.
    """
    run_dir = tmp_path / "run"
    assert run(quickstart_fit_args(run_dir, rounds=1)) == 0
    saved = run_dir / "config.yaml"
    assert "ckpt_path" not in yaml.safe_load(saved.read_text())
    assert run(["fit", "--ckpt_path", "last", "--config", str(saved), "--federation.rounds", "2"]) == 0
    assert read_summary(run_dir)["rounds_done"] == 2
    checkpoint = str(run_dir / "checkpoints" / "last.ckpt")
    quiet = ["--trainer.enable_progress_bar", "false"]
    assert run(["test", "--ckpt_path", checkpoint, "--config", str(saved), *quiet]) == 0
