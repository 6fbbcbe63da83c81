"""``cli.py compare``: runs each fit in its own directory, reuses finished runs, resumes interrupted ones."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import read_metrics, read_summary

from fl_lightning.cli import cli_main
from fl_lightning.experiments.compare import CompareSpec, _threads_per_run, main, run_comparison, write_spec_report

ROOT = Path(__file__).resolve().parent.parent
CLASSES = {"fedavg": "fl_lightning.FedAvg", "fedntd": "fl_lightning.methods.FedNTD"}


@pytest.fixture
def spec_file(tmp_path):
    base = yaml.safe_load((ROOT / "configs/quickstart.yaml").read_text())
    base["data"]["num_clients"] = 4
    base["federation"].update({"rounds": 2, "local_epochs": 1})
    for method, class_path in CLASSES.items():
        cfg = {**base, "model": {"class_path": class_path, "init_args": base["model"]["init_args"]}}
        (tmp_path / f"{method}.yaml").write_text(yaml.safe_dump(cfg))
    spec = {
        "name": "tiny",
        "output_dir": str(tmp_path / "out"),
        "methods": list(CLASSES),
        "seeds": [0],
        "settings": {"digits": str(tmp_path / "{method}.yaml")},
        "jobs": 2,
    }
    path = tmp_path / "compare.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.slow
def test_compare_runs_reuses_and_resumes(spec_file, tmp_path, capsys):
    spec = CompareSpec.from_yaml(spec_file)
    # an interrupted fedntd run: one of its two rounds done, with a checkpoint
    ntd_dir = spec.output_dir / "digits" / "fedntd" / "seed0"
    cli_main(
        [
            "fit",
            "--config",
            str(tmp_path / "fedntd.yaml"),
            "--federation.rounds",
            "1",
            "--trainer.default_root_dir",
            str(ntd_dir),
            "--trainer.enable_progress_bar",
            "false",
        ]
    )
    first_round = read_metrics(ntd_dir)[0]
    summary = read_summary(ntd_dir)
    summary["status"] = "interrupted"
    (ntd_dir / "summary.json").write_text(json.dumps(summary))
    assert [r.state() for r in spec.runs()] == ["new", "partial"]

    # --report-only runs nothing and marks what is unfinished
    assert main(["--config", str(spec_file), "--report-only"]) == 0
    assert "report only, 0 of 2 runs finished" in capsys.readouterr().out
    assert [r.state() for r in spec.runs()] == ["new", "partial"]
    partial_md = (spec.output_dir / "report" / "results.md").read_text()
    assert "interrupted" in partial_md
    assert (
        "0 of 2 runs finished. No run finished yet (1 run, left out of the tables): digits/fedavg. "
        "Not finished, so not in their rows' figures: digits/fedntd seed 0." in partial_md
    )

    report = run_comparison(spec)
    out = capsys.readouterr().out
    assert "2 to run" in out
    assert [r.state() for r in spec.runs()] == ["done", "done"]
    resumed = read_metrics(ntd_dir)
    assert len(resumed) == 2 and resumed[0]["global_acc"] == first_round["global_acc"]
    assert "Restored all states from the checkpoint" in (ntd_dir / "stdout.log").read_text()
    md = (report / "results.md").read_text()
    assert "fedavg" in md and "fedntd" in md
    assert (report / "curves_digits.png").stat().st_size > 0

    # a second call reuses everything
    assert main(["--config", str(spec_file)]) == 0
    assert "0 to run" in capsys.readouterr().out


def test_spec_validation(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"methods": ["fedavg"], "settings": {"x": str(tmp_path / "{method}.yaml")}}))
    with pytest.raises(FileNotFoundError, match="no config"):
        CompareSpec.from_yaml(path)
    path.write_text(yaml.safe_dump({"methods": ["fedavg"]}))
    with pytest.raises(ValueError, match="settings"):
        CompareSpec.from_yaml(path)


def test_a_comparison_that_is_not_yaml_is_one_line_and_exit_2(tmp_path, capsys):
    from fl_lightning.cli import main as cli

    path = tmp_path / "invalid.yaml"
    path.write_text("name: e\nmethods: [fedavg\nseeds: [0]\n")
    with pytest.raises(SystemExit) as exit_:
        cli(["compare", "--config", str(path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err
    assert f"{path}: not valid YAML at line 3, column 6: while parsing a flow sequence" in err


@pytest.mark.parametrize("path", sorted((ROOT / "configs/compare").glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_comparisons_parse(path, monkeypatch):
    monkeypatch.chdir(ROOT)
    spec = CompareSpec.from_yaml(path)
    assert spec.runs() and spec.baseline == spec.methods[0]


ARCHIVED = [
    p for p in sorted((ROOT / "configs/compare").glob("*.yaml")) if (ROOT / "results" / p.stem / "report").is_dir()
]


@pytest.mark.parametrize("path", ARCHIVED, ids=lambda p: p.stem)
def test_shipped_reports_are_their_archived_runs_numbers(path, tmp_path, monkeypatch):
    """results/<table>/report's tables are what the runs archived beside them give now (README includes them)."""
    monkeypatch.chdir(ROOT)
    spec = CompareSpec.from_yaml(path)
    spec.output_dir = ROOT / "results" / path.stem
    out = write_spec_report(spec, tmp_path, plots=False)
    shipped = spec.output_dir / "report"
    tables = sorted(p.name for p in shipped.iterdir() if p.suffix in (".md", ".csv", ".json"))
    assert "results.md" in tables and "per_seed.csv" in tables
    for name in tables:
        assert (out / name).read_text() == (shipped / name).read_text(), (
            f"{name}: run scripts/paper_tables.sh --archive-only"
        )


def test_wandb_command_groups_and_tags(spec_file):
    from fl_lightning.experiments.compare import _command

    spec = CompareSpec.from_yaml(spec_file)
    spec.wandb = True
    cmd = _command(spec, spec.runs()[1], resume=True)
    text = " ".join(cmd)
    assert "--trainer.logger WandbLogger" in text and "--trainer.logger.offline true" in text
    assert "--trainer.logger.group tiny" in text
    assert '["fedntd", "seed0", "digits"]' in text
    assert cmd[-2:] == ["--ckpt_path", "last"]


def test_tensorboard_logger_works(tmp_path):
    pytest.importorskip("tensorboard")
    cli_main(
        [
            "fit",
            "--config",
            str(ROOT / "configs/quickstart.yaml"),
            "--federation.rounds",
            "1",
            "--federation.local_epochs",
            "1",
            "--trainer.default_root_dir",
            str(tmp_path),
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.logger",
            "TensorBoardLogger",
            "--trainer.logger.save_dir",
            str(tmp_path / "tb"),
        ]
    )
    assert list((tmp_path / "tb").rglob("events.out.tfevents.*"))
    assert read_summary(tmp_path)["status"] == "completed"


def _fake_finished_run(spec: CompareSpec, run, config: dict) -> None:
    run.run_dir.mkdir(parents=True)
    (run.run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    (run.run_dir / "summary.json").write_text(json.dumps({"status": "completed"}))
    (run.run_dir / "metrics.csv").write_text("round,global_acc\n1,0.5\n")


def test_finished_run_reused_only_when_its_config_matches(spec_file):
    # Before: compare reused a finished run after the YAML's overrides changed and reported the old result.
    spec = CompareSpec.from_yaml(spec_file)
    spec.methods, spec.seeds = ["fedavg"], [0]
    run = spec.runs()[0]
    _fake_finished_run(spec, run, spec.resolved(run))
    assert run.plan(spec) == ("reuse", "")
    spec.overrides = ["--federation.local_epochs", "2", "--trainer.logger", "false"]
    action, why = run.plan(spec)
    assert action == "rerun" and "federation.local_epochs: 1 -> 2" in why
    from fl_lightning.experiments.compare import _command

    assert _command(spec, run, resume=False, overwrite=True)[-1] == "--overwrite"


@pytest.mark.slow
def test_compare_reruns_a_run_whose_config_changed(spec_file, capsys):
    spec = CompareSpec.from_yaml(spec_file)
    spec.methods, spec.seeds, spec.jobs = ["fedavg"], [0], 1
    run_comparison(spec)
    run = spec.runs()[0]
    first = (run.run_dir / "summary.json").read_bytes()
    spec.overrides = ["--federation.local_epochs", "2"]
    run_comparison(spec)
    out = capsys.readouterr().out
    assert "rerunning, its config differs (federation.local_epochs: 1 -> 2)" in out
    assert yaml.safe_load((run.run_dir / "config.yaml").read_text())["federation"]["local_epochs"] == 2
    aside = list(run.run_dir.parent.glob("seed0.replaced-*"))
    assert len(aside) == 1 and (aside[0] / "summary.json").read_bytes() == first
    assert "Restored" not in (run.run_dir / "stdout.log").read_text()


def test_a_variant_runs_its_methods_config_with_its_own_arguments(spec_file):
    raw = yaml.safe_load(spec_file.read_text())
    variant = {"method": "fedntd", "overrides": ["--model.init_args.beta", "0.5"]}
    raw.update(methods=["fedavg", "fedntd", "fedntd_b05"], variants={"fedntd_b05": variant})
    spec_file.write_text(yaml.safe_dump(raw))
    spec = CompareSpec.from_yaml(spec_file)
    runs = {r.method: r for r in spec.runs()}
    assert runs["fedntd_b05"].config == runs["fedntd"].config
    assert runs["fedntd_b05"].run_dir.name == "seed0" and runs["fedntd_b05"].run_dir.parent.name == "fedntd_b05"
    assert spec.resolved(runs["fedntd_b05"])["model"]["init_args"]["beta"] == 0.5
    assert spec.resolved(runs["fedntd"])["model"]["init_args"]["beta"] == 1.0
    _fake_finished_run(spec, runs["fedntd"], spec.resolved(runs["fedntd"]))
    action, why = runs["fedntd_b05"].plan(spec)
    assert action == "new"  # its own directory: the plain method's finished run is not taken for it
    fixed = {**raw, "methods": ["fedntd", "fedntd_b05"], "baseline": "fedntd"}
    fixed["settings"] = {"digits": raw["settings"]["digits"].format(method="fedntd")}  # one config for every method
    spec_file.write_text(yaml.safe_dump(fixed))
    assert CompareSpec.from_yaml(spec_file).variants == {"fedntd_b05": ("fedntd", variant["overrides"])}
    for variants, error in [
        ({"fedntd_b9": variant}, "'fedntd_b9' is not one of the methods"),
        ({"fedntd_b05": {"overrides": []}}, "needs 'method'"),
        ({"fedntd_b05": {"method": "fedntd", "beta": 0.5}}, r"unknown key\(s\) \['beta'\]"),
        ({"fedntd_b05": {"method": "fedntd", "overrides": "--model.init_args.beta 0.5"}}, "must be a list"),
        ({"fedntd_b05": {"method": "fedntd", "overrides": ["--model.init_args.bta", "0.5"]}}, "does not resolve"),
        ({"fedntd_b05": {"method": "fedprox"}}, "no config"),
        ({"fedntd_b05": variant, "fedavg": {"method": "fedntd_b05"}}, "based on another variant"),
        ({"fedntd": {"method": "fedntd"}}, "a name of its own"),
        ({"fedavg": {"method": "fedntd"}}, "has a method's name"),
    ]:
        spec_file.write_text(yaml.safe_dump({**raw, "variants": variants}))
        with pytest.raises((ValueError, FileNotFoundError), match=error):
            CompareSpec.from_yaml(spec_file)


def test_notes_are_read_as_lines(spec_file):
    spec = yaml.safe_load(spec_file.read_text())
    spec_file.write_text(yaml.safe_dump({**spec, "notes": "one line"}))
    assert CompareSpec.from_yaml(spec_file).notes == ["one line"]
    spec_file.write_text(yaml.safe_dump({**spec, "notes": ["a", "b"]}))
    assert CompareSpec.from_yaml(spec_file).notes == ["a", "b"]
    spec_file.write_text(yaml.safe_dump({**spec, "notes": {"a": 1}}))
    with pytest.raises(ValueError, match="notes must be a list"):
        CompareSpec.from_yaml(spec_file)


@pytest.mark.parametrize(
    "values, error",
    [
        ({"digits": {"fedavg": [78.1, 2.51], "fedntd": 80.2}}, None),
        ({"nope": {"fedavg": 78.1}}, "'nope' is not one of the settings"),
        ({"digits": {"fedprox": 78.1}}, "'fedprox' is not one of the methods"),
        ({"digits": {"fedavg": [78.1, -1.0]}}, "give \\[mean, std\\]"),
        ({"digits": {"fedavg": "78.1 ± 2.5"}}, "give \\[mean, std\\]"),
        ({"digits": [78.1]}, "map each method"),
    ],
)
def test_published_numbers_are_checked_against_the_comparison(spec_file, values, error):
    spec = yaml.safe_load(spec_file.read_text())
    spec_file.write_text(yaml.safe_dump({**spec, "published": {"source": "A paper.", "values": values}}))
    if error is not None:
        with pytest.raises(ValueError, match=error):
            CompareSpec.from_yaml(spec_file)
        return
    published = CompareSpec.from_yaml(spec_file).published
    assert published.metric == "best_acc" and published.source == "A paper."
    assert published.values == {("digits", "fedavg"): (78.1, 2.51), ("digits", "fedntd"): (80.2, None)}
    for bad, match in [
        ({"values": values}, "needs a source"),
        ({"source": "A paper.", "values": {}}, "needs a source and values"),
        ({"source": "A paper.", "values": values, "metric": "acc"}, "choose one of"),
        ({"source": "A paper.", "values": values, "table": 3}, "unknown key"),
    ]:
        spec_file.write_text(yaml.safe_dump({**spec, "published": bad}))
        with pytest.raises(ValueError, match=match):
            CompareSpec.from_yaml(spec_file)


def test_output_dir_overrides_the_yamls(spec_file, tmp_path, capsys):
    elsewhere = tmp_path / "archived"
    args = ["--config", str(spec_file), "--report-only", "--output-dir", str(elsewhere)]
    # Before: a folder that was not there (a typo) was created, with an empty report, and compare exited 0.
    assert f"no folder {elsewhere} to report on" in _compare_error(args, capsys)
    assert not elsewhere.exists()
    (elsewhere / "digits" / "fedavg" / "other").mkdir(parents=True)
    assert "holds none of the comparison's runs (such as digits/fedavg/seed0/summary.json)" in _compare_error(
        args, capsys
    )
    assert not (elsewhere / "report").exists()
    spec = CompareSpec.from_yaml(spec_file)
    spec.output_dir = elsewhere
    _fake_finished_run(spec, spec.runs()[0], spec.resolved(spec.runs()[0]))
    summary = {"status": "completed", "final_acc": 0.5, "best_acc": 0.5, "forgetting": 0.0, "wall_seconds": 1.0}
    (spec.runs()[0].run_dir / "summary.json").write_text(json.dumps(summary))
    assert main(args) == 0
    assert f"report: {elsewhere / 'report' / 'results.md'}" in capsys.readouterr().out
    assert "1 of 2 runs finished. No run finished yet (1 run" in (elsewhere / "report" / "results.md").read_text()
    assert not (tmp_path / "out").exists()  # the YAML's output_dir is left alone


def test_runs_start_interrupted_first_then_seed_by_seed(spec_file, capsys):
    spec = yaml.safe_load(spec_file.read_text())
    spec_file.write_text(yaml.safe_dump({**spec, "seeds": [0, 1]}))
    spec = CompareSpec.from_yaml(spec_file)
    interrupted = next(r for r in spec.runs() if (r.method, r.seed) == ("fedntd", 1))
    (interrupted.run_dir / "checkpoints").mkdir(parents=True)
    (interrupted.run_dir / "checkpoints" / "last.ckpt").write_bytes(b"")
    (interrupted.run_dir / "config.yaml").write_text(yaml.safe_dump(spec.resolved(interrupted)))
    run_comparison(spec, dry_run=True)
    starts = [
        line.split("--trainer.default_root_dir ")[1].split()[0]
        for line in capsys.readouterr().out.splitlines()
        if " fit " in line
    ]
    assert [Path(d).relative_to(spec.output_dir).as_posix() for d in starts] == [
        "digits/fedntd/seed1",  # resumed first
        "digits/fedavg/seed0",
        "digits/fedntd/seed0",
        "digits/fedavg/seed1",
    ]


def test_dry_run_prints_the_commands_and_writes_nothing(spec_file, capsys):
    # Before: it also wrote a report into the output folder and printed "[compare] 1/2 ...: no summary" lines.
    spec = CompareSpec.from_yaml(spec_file)
    assert main(["--config", str(spec_file), "--dry-run"]) == 0
    header, *commands = capsys.readouterr().out.splitlines()
    assert header.startswith(f"[compare] {spec.name}: 2 runs, 0 already done, 2 to run")
    assert len(commands) == 2 and all(" fit " in c and "--trainer.default_root_dir" in c for c in commands)
    assert not spec.output_dir.exists()


@pytest.mark.slow
def test_sigterm_stops_the_comparison_and_its_fits(spec_file, tmp_path):
    # Before: compare only passed on SIGINT, which background jobs ignore, so SIGTERM left its fits running as orphans.
    spec = yaml.safe_load(spec_file.read_text())
    for method in CLASSES:
        cfg = yaml.safe_load((tmp_path / f"{method}.yaml").read_text())
        cfg["federation"]["rounds"] = 500
        (tmp_path / f"{method}.yaml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.Popen(
        [sys.executable, "cli.py", "compare", "--config", str(spec_file)],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # as `nohup ... &`: no terminal to send Ctrl-C to the fits
    )
    out = Path(spec["output_dir"]) / "digits"
    metrics = [out / method / "seed0" / "metrics.csv" for method in CLASSES]
    deadline = time.time() + 120
    while not all(m.exists() for m in metrics) and time.time() < deadline:
        time.sleep(0.05)
    assert all(m.exists() for m in metrics), "the fits did not start"
    fits = subprocess.run(["pgrep", "-f", f"default_root_dir {out}"], capture_output=True, text=True).stdout.split()
    assert len(fits) == 2
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 4, err
        assert err.strip().splitlines()[-1].startswith("error: compare interrupted")
        for pid in fits:  # every fit has ended, and recorded itself as interrupted
            with pytest.raises(ProcessLookupError):
                os.kill(int(pid), 0)
    finally:  # leave no orphan behind when the test fails
        subprocess.run(["pkill", "-KILL", "-f", f"default_root_dir {out}"])
    assert [read_summary(m.parent)["status"] for m in metrics] == ["interrupted", "interrupted"]


@pytest.mark.parametrize(
    ("given", "jobs", "expected"), [(None, 1, 4), (None, 2, 2), (None, 8, 1), ("1", 1, 1), ("3", 2, 3)]
)
def test_each_fit_gets_a_share_of_the_cores_unless_omp_num_threads_is_set(monkeypatch, given, jobs, expected):
    # Two comparisons side by side (JOBS=1 OMP_NUM_THREADS=1 scripts/paper_tables.sh) must not each take every core.
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    if given is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", given)
    assert _threads_per_run(jobs) == expected


def test_compare_on_a_busy_cpu_warns_once_before_its_fits(spec_file, monkeypatch, capsys):
    from fl_lightning import rules
    from fl_lightning.experiments import compare

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(rules, "busy_cores", lambda: 1.5)
    monkeypatch.setattr(rules.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(compare.os, "cpu_count", lambda: 2)  # jobs 2 on 2 cores: one thread a fit, two fits
    monkeypatch.setattr(compare.Run, "in_use", lambda self: "another process runs it")  # no fit is started
    run_comparison(CompareSpec.from_yaml(spec_file))
    out = capsys.readouterr().out
    line = "[compare] warning: the CPU is busy (other processes keep 1.5 of 2 cores busy) and its fits run 2 torch"
    assert out.count(line) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the user chose the threads: nothing said
    run_comparison(CompareSpec.from_yaml(spec_file))
    assert "warning" not in capsys.readouterr().out


def test_compare_reads_a_refused_fit_by_the_command_lines_exit_code():
    from fl_lightning.cli import EXIT_CODES
    from fl_lightning.experiments.compare import EXIT_BAD_INPUT

    assert EXIT_BAD_INPUT == EXIT_CODES["bad input"]


def _compare_error(args: list[str], capsys) -> str:
    """The one line `fl-lightning compare ARGS` ends with (exit code 2)."""
    from fl_lightning.cli import main as cli

    with pytest.raises(SystemExit) as exit_:
        cli(["compare", *args])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2, err
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


def test_bad_templates_overrides_and_output_folders_are_one_line_and_exit_2(spec_file, tmp_path, capsys):
    # Before: a KeyError traceback, an argparse.ArgumentError traceback, a NotADirectoryError traceback.
    raw = yaml.safe_load(spec_file.read_text())
    for template, error in [
        ("{metod}.yaml", "names {metod}; a path may name only {method} and {setting}"),
        ("{method.x}.yaml", "names {method.x}"),
        ("{method.yaml", "is not a template"),
    ]:
        spec_file.write_text(yaml.safe_dump({**raw, "settings": {"digits": str(tmp_path / template)}}))
        assert error in _compare_error(["--config", str(spec_file), "--dry-run"], capsys)
    fixed = {**raw, "methods": ["fedavg"], "settings": {"digits": str(tmp_path / "fedavg.yaml")}}
    spec_file.write_text(yaml.safe_dump({**fixed, "overrides": ["--federation.round", "2"]}))
    err = _compare_error(["--config", str(spec_file), "--dry-run"], capsys)
    assert "setting 'digits', method 'fedavg' does not resolve: unrecognized arguments: --federation.round 2" in err
    spec_file.write_text(yaml.safe_dump(fixed))
    (tmp_path / "afile").write_text("")
    err = _compare_error(["--config", str(spec_file), "--output-dir", str(tmp_path / "afile" / "out")], capsys)
    assert f"output_dir {tmp_path / 'afile' / 'out'} cannot be written (Not a directory)" in err


def test_an_override_typo_is_refused_when_the_yaml_is_read(spec_file, capsys):
    # Before: with {method} templates every fit failed on it in turn, each after its start-up (a 114-run spec: 114).
    raw = yaml.safe_load(spec_file.read_text())
    spec_file.write_text(yaml.safe_dump({**raw, "overrides": ["--federation.round", "2"]}))
    err = _compare_error(["--config", str(spec_file)], capsys)
    assert "setting 'digits', method 'fedavg' does not resolve: unrecognized arguments: --federation.round 2" in err
    assert not Path(raw["output_dir"]).exists()  # no fit was started


@pytest.mark.parametrize("where", ["setting", "variant"])
def test_a_name_that_is_not_one_path_part_is_refused(spec_file, where):
    # Before: accepted, then the report failed after every run had trained (curves_a/b.png: no folder a).
    raw = yaml.safe_load(spec_file.read_text())
    if where == "setting":
        raw["settings"] = {"digits/hard": raw["settings"]["digits"]}
        error = "setting 'digits/hard' names a folder, so it must be one path part"
    else:
        raw["methods"] = ["fedavg", "fedntd/b05"]
        raw["variants"] = {"fedntd/b05": {"method": "fedntd", "overrides": ["--model.init_args.beta", "0.5"]}}
        error = "method 'fedntd/b05' names a folder"
    spec_file.write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match=error):
        CompareSpec.from_yaml(spec_file)


def test_dry_run_quotes_what_the_shell_would_split(spec_file, tmp_path, capsys):
    # Before: joined with spaces, so `my runs/...` pasted into a shell became two arguments.
    import shlex

    raw = yaml.safe_load(spec_file.read_text())
    spec_file.write_text(yaml.safe_dump({**raw, "output_dir": str(tmp_path / "my runs")}))
    spec = CompareSpec.from_yaml(spec_file)
    assert main(["--config", str(spec_file), "--dry-run"]) == 0
    _header, *commands = capsys.readouterr().out.splitlines()
    from fl_lightning.experiments.compare import _command

    assert [shlex.split(c) for c in commands] == [_command(spec, r, resume=False) for r in spec.runs()]


def test_a_completed_run_whose_rounds_grew_is_extended_not_retrained(spec_file, capsys):
    # Before: raising --federation.rounds moved the finished run aside and trained it again from round 1.
    spec = CompareSpec.from_yaml(spec_file)
    spec.methods, spec.seeds = ["fedavg"], [0]
    run = spec.runs()[0]
    _fake_finished_run(spec, run, spec.resolved(run))
    (run.run_dir / "checkpoints").mkdir()
    (run.run_dir / "checkpoints" / "last.ckpt").write_bytes(b"")
    spec.overrides = ["--federation.rounds", "4"]
    assert run.plan(spec) == ("extend", "its rounds grew (federation.rounds: 2 -> 4)")
    run_comparison(spec, dry_run=True)
    out = capsys.readouterr().out
    assert "rerunning" not in out
    assert "digits/fedavg/seed0: extending, its rounds grew (federation.rounds: 2 -> 4)" in out
    assert out.rstrip().endswith("--federation.rounds 4 --ckpt_path last")
    spec.overrides = ["--federation.rounds", "4", "--federation.local_epochs", "2"]  # more than the rounds changed
    assert run.plan(spec)[0] == "rerun"
    spec.overrides = ["--federation.rounds", "1"]  # fewer rounds: a new run
    assert run.plan(spec)[0] == "rerun"
    spec.overrides = ["--federation.rounds", "4"]
    (run.run_dir / "summary.json").write_text(json.dumps({"status": "diverged"}))  # fit does not resume one
    assert run.plan(spec)[0] == "rerun"
    (run.run_dir / "summary.json").write_text(json.dumps({"status": "completed"}))
    (run.run_dir / "checkpoints" / "last.ckpt").unlink()  # nothing to extend from
    assert run.plan(spec)[0] == "rerun"


def test_a_report_only_reading_resolves_no_fit(monkeypatch):
    # Found by review: --report-only resolved every setting x method (7 s for fmnist_ntd_3seeds) before it looked
    # at the runs, and failed on a comparison whose configs have been renamed since.
    from fl_lightning.experiments.compare_spec import CompareSpec

    def resolving(self, path):
        raise AssertionError("resolved the fits")

    monkeypatch.setattr(CompareSpec, "check_resolves", resolving)
    spec = CompareSpec.from_yaml(ROOT / "configs/compare/fmnist_ntd_3seeds.yaml", check_fits=False)
    assert spec.methods and spec.settings
    with pytest.raises(AssertionError, match="resolved the fits"):
        CompareSpec.from_yaml(ROOT / "configs/compare/fmnist_ntd_3seeds.yaml")
