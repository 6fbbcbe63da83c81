"""Whole-or-nothing writes, and the clean-up of what a killed write left."""

from __future__ import annotations

import pytest
from helpers import tiny_run

from fl_lightning.core.files import atomic_path, remove_temporaries, temporary_name, write_text_atomic


def test_atomic_path_replaces_on_success_and_keeps_the_old_file_on_error(tmp_path):
    target = tmp_path / "summary.json"
    write_text_atomic(target, "old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed mid-write")
    assert target.read_text() == "old"
    assert not temporary_name(target).exists()
    write_text_atomic(target, "new")
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_remove_temporaries_touches_only_temporaries(tmp_path):
    keep = [tmp_path / "metrics.csv", tmp_path / ".hidden", tmp_path / "notes.tmp"]
    stale = [temporary_name(tmp_path / "metrics.csv"), temporary_name(tmp_path / "curve.png")]
    for p in keep + stale:
        p.write_text("x")
    assert sorted(remove_temporaries(tmp_path)) == sorted(stale)
    assert all(p.exists() for p in keep) and not any(p.exists() for p in stale)


def test_a_run_removes_what_a_killed_run_left(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    stale = [temporary_name(run_dir / "curve.png"), temporary_name(run_dir / "checkpoints" / "last.ckpt")]
    for p in stale:
        p.write_bytes(b"cut")
    tiny_run(run_dir, rounds=1)
    assert not any(p.exists() for p in stale)
    assert (run_dir / "summary.json").exists()
