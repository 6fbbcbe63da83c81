"""bench/local_probe.py, FedCAD's Fig. 2 probe: one local update per method and client from a saved global model."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from fl_lightning.cli import cli_main
from fl_lightning.experiments import claims

ROOT = Path(__file__).resolve().parents[1]


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def global_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-round quickstart run (lr decay 0.5), in this process: the probe is what runs as a script."""
    run = tmp_path_factory.mktemp("probe") / "run"
    fit = ["fit", "--config", str(ROOT / "configs/quickstart.yaml"), "--federation.rounds", "2"]
    fit += ["--federation.lr_decay", "0.5", "--federation.plots", "false", "--trainer.default_root_dir", str(run)]
    cli_main([*fit, "--trainer.enable_progress_bar", "false"])
    return run


@pytest.fixture(scope="module")
def probed(global_run: Path) -> tuple[Path, Path]:
    """The probe of clients 0 and 3 with FedAvg and FedCAD from :func:`global_run`'s last checkpoint."""
    out = global_run.parent / "results" / "probe"
    probe = [sys.executable, "bench/local_probe.py", "--ckpt", str(global_run / "checkpoints" / "last.ckpt")]
    probe += ["--clients", "0", "3", "--methods", "fedavg", "fedcad", "--out", str(out)]
    done = subprocess.run(probe, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return global_run, out


@pytest.mark.slow
def test_each_method_trains_each_client_once_from_the_global_model(probed: tuple[Path, Path]) -> None:
    run, out = probed
    rows = read_csv(out / "seed0" / "probe.csv")
    assert [(r["method"], r["client"]) for r in rows] == [(m, k) for m in ("fedavg", "fedcad") for k in ("0", "3")]
    global_acc = [float(read_csv(run / "metrics.csv")[-1][f"acc_class_{c}"]) for c in range(10)]
    for r in rows:
        acc = [float(r[f"acc_class_{c}"]) for c in range(10)]
        assert float(r["class_mean"]) == pytest.approx(sum(acc) / 10, abs=1e-4)
        assert sum(float(r[f"share_{c}"]) for c in range(10)) == pytest.approx(1.0, abs=1e-3)
        assert acc != global_acc  # a local model, not the global one it started from
    by = {(r["method"], r["client"]): [float(r[f"acc_class_{c}"]) for c in range(10)] for r in rows}
    assert by[("fedavg", "0")] != by[("fedcad", "0")]  # each method's own loss
    assert "the paper-like one" in (out / "seed0" / "probe.txt").read_text()


@pytest.mark.slow
def test_its_per_seed_table_is_the_claims_input(probed: tuple[Path, Path]) -> None:
    _, out = probed
    means = {(r["method"], r["client"]): float(r["class_mean"]) for r in read_csv(out / "seed0" / "probe.csv")}
    rows = {(r["setting"], r["method"]): r for r in read_csv(out / "report" / "per_seed.csv")}
    target = rows[("paper_client", "fedavg")]["clients"]
    assert target in ("0", "3") and float(rows[("paper_client", "fedavg")]["delta_probe_acc"]) == 0.0
    gain = means[("fedcad", target)] - means[("fedavg", target)]
    assert float(rows[("paper_client", "fedcad")]["delta_probe_acc"]) == pytest.approx(gain, abs=1e-4)
    mean_all = (means[("fedcad", "0")] + means[("fedcad", "3")]) / 2
    assert float(rows[("all_clients", "fedcad")]["probe_acc"]) == pytest.approx(mean_all, abs=1e-4)

    measure = {"table": "probe", "setting": "paper_client", "method": "fedcad", "metric": "probe_acc"}
    claim = {"id": "c", "paper": "fedcad", "dataset": "CIFAR-10", "metric": "m", "method": "FedCAD"}
    claim.update(fedavg=45.1, method_value=59.2, measure={**measure, "made_by": "python bench/local_probe.py"})
    row = claims.claim_row(claim, out.parent)
    assert row["fl_method_value"] == f"{100 * means[('fedcad', target)]:.2f}"
    assert row["fl_gain_mean"] == pytest.approx(100 * gain, abs=0.01) and row["verdict"] in claims.VERDICT_RULES
    assert "`python bench/local_probe.py`, setting paper_client" in claims.settings_markdown([claim], [row])
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['best_acc', 'delta_best_acc'\]"):
        claims.claim_row({**claim, "measure": {**measure, "metric": "best_acc"}}, out.parent)


def test_a_diverged_update_is_a_result_without_a_paired_gain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import local_probe

    acc = {("fedavg", 0): [0.5] * 10, ("fedavg", 1): [0.7] * 10, ("fedka", 0): [0.6] * 10, ("fedka", 1): None}
    rows = {(r["setting"], r["method"]): r for r in local_probe.per_seed_rows(acc, ["fedavg", "fedka"], [0, 1], 0, 3)}
    assert rows[("paper_client", "fedka")]["status"] == "completed" and rows[("paper_client", "fedka")]["seed"] == 3
    assert rows[("paper_client", "fedka")]["delta_probe_acc"] == pytest.approx(0.1)
    assert rows[("all_clients", "fedka")]["status"] == "diverged" and rows[("all_clients", "fedka")]["probe_acc"] == 0.6
    assert rows[("all_clients", "fedka")]["delta_probe_acc"] == ""
    assert rows[("all_clients", "fedavg")]["probe_acc"] == pytest.approx(0.6)


def test_each_global_models_rows_join_the_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import local_probe

    for seed in (10, 2):  # by seed, not by name
        (tmp_path / f"seed{seed}").mkdir()
        row = {"setting": "paper_client", "method": "fedavg", "seed": seed, "status": "completed", "probe_acc": 0.5}
        local_probe.write_per_seed(tmp_path / f"seed{seed}" / "per_seed.csv", [row])
    merged = read_csv(local_probe.merge_per_seed(tmp_path))
    assert [r["seed"] for r in merged] == ["2", "10"] and list(merged[0]) == list(local_probe.PER_SEED_COLUMNS)


def test_the_probe_trains_at_the_next_rounds_learning_rate(global_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import _setting

    run = global_run
    state, _, hp, federation = _setting.run_setting(run / "checkpoints" / "last.ckpt")
    assert _setting.rounds_done(state, federation) == 2 and _setting.run_seed(state) == 0
    assert _setting.round_lr_scale(state, federation) == 0.25  # round 3's: 0.5 ** 2
    assert float(read_csv(run / "metrics.csv")[-1]["lr"]) == pytest.approx(hp["lr"] * 0.5)  # round 2 trained at 0.5
    with pytest.raises(SystemExit, match="eval_every > 1"):
        _setting.rounds_done(state, {**federation, "eval_every": 2})


@pytest.mark.slow
def test_a_method_the_probe_cannot_start_fails_before_any_probe(global_run: Path, tmp_path: Path) -> None:
    run = global_run
    cmd = [sys.executable, "bench/local_probe.py", "--ckpt", str(run / "checkpoints" / "last.ckpt")]
    done = subprocess.run([*cmd, "--methods", "fedavg", "moon", "--out", str(tmp_path)], cwd=ROOT, capture_output=True)
    assert done.returncode != 0 and done.stderr.decode().strip().endswith("the probe starts only the network")
    assert not (tmp_path / "seed0").exists()  # no probe ran
