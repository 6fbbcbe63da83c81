"""A comparison's numbers: each run's row against the same-seed baseline run, and each (setting, method)'s summary.

The rows of ``per_seed.csv`` (:func:`per_seed_results`) and of the results tables (:func:`summarize`) are built
here from runs loaded by :func:`fl_lightning.experiments.runs.load_runs`; formatting and writing them is
:mod:`fl_lightning.experiments.tables`'s job.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from fl_lightning.core.metrics import rounds_to_target
from fl_lightning.experiments.runs import RunRef, divergence_round, is_completed, load_runs, ran_on, same_schedule


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (``ddof=1``; 0 for a single value), unrounded: round where shown.

    >>> [round(v, 4) for v in mean_std([0.5, 0.7])]
    [0.6, 0.1414]
    """
    arr = np.asarray(values, dtype=np.float64)
    std = float(arr.std(ddof=1)) if len(arr) > 1 else 0.0
    return float(arr.mean()), std


#: Rounds-to-target definitions: name -> (the baseline run's accuracy that is the target, the paper that defines it).
TARGETS: dict[str, tuple[str, str]] = {
    "final": ("final_acc", "FedNTD; docs/source/methods.md"),
    "best": ("best_acc", "FedLMD"),
}

#: Accuracies compared seed by seed with the baseline: name in the results -> key in a run's ``summary.json``.
DELTAS: dict[str, str] = {"final_acc": "final_acc", "best_acc": "best_acc", "last10_acc": "last10_mean_acc"}

#: Local-model measures (``--federation.eval_local``), as the mean over a run's last 10 evaluated rounds: name in the
#: results -> ``metrics.csv`` column. AccL: the updated local models' mean test accuracy (FedSSD §3.1, FedCAD Fig. 1);
#: τ: FedKA's class-wise forgetting degree of the local models against the global one.
LOCAL: dict[str, str] = {"local_acc_last10": "local_acc_mean", "forgetting_degree_last10": "local_forgetting_degree"}


def baseline_by_seed(loaded: Sequence[dict[str, Any]], baseline: str) -> dict[tuple[str, int], dict[str, Any]]:
    """The baseline's completed runs by (setting, seed).

    Each method's run is paired with the baseline's run of the same setting and seed: the seed fixes the partition
    and the client sampling.
    """
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for run in loaded:
        if run["method"] == baseline and is_completed(run):
            out.setdefault((run["setting"], run["seed"]), run)
    return out


def first_round_at(run: dict[str, Any], target: float) -> int | None:
    """The first round a run's global accuracy reaches ``target`` (None if it never does)."""
    rows = run["rows"]
    return rounds_to_target([int(x["round"]) for x in rows], [x["global_acc"] for x in rows], target)


def paired_target(run: dict[str, Any], base: dict[str, Any], key: str) -> dict[str, Any]:
    """Rounds to the target = the baseline run's ``key`` accuracy (its final or best), and the speedup.

    The speedup is the baseline run's rounds to the target / the run's (None when either never reaches it).
    """
    target = float(base["summary"][key])
    rounds, base_rounds = first_round_at(run, target), first_round_at(base, target)
    return {"target": target, "rounds": rounds, "speedup": base_rounds / rounds if rounds and base_rounds else None}


def paired_delta(run: dict[str, Any], base: dict[str, Any], key: str) -> float | None:
    """The run's ``key`` accuracy minus the baseline run's (None when either lacks it)."""
    value, base_value = run["summary"].get(key), base["summary"].get(key)
    return None if value is None or base_value is None else float(value) - float(base_value)


def last10(run: dict[str, Any], column: str) -> float | None:
    """The mean of a ``metrics.csv`` column over the run's last 10 rounds that have it (None: no round has it)."""
    values = [r[column] for r in run["rows"] if math.isfinite(r.get(column, math.nan))]
    return float(np.mean(values[-10:])) if values else None


def mean_drop(run: dict[str, Any]) -> float | None:
    """How much a run's global accuracy oscillates: its mean fall from one evaluated round to the next.

    A rise counts 0, so a learning curve that only rises scores 0; non-finite accuracies are skipped (only completed
    runs get a value in the reports); None with under two evaluated rounds. With ``eval_every`` > 1 a step spans
    that many rounds, so compare runs of one ``eval_every``.
    fl_lightning's measure for the papers' "more stable" curves (FedLMD Fig. 6, FedKA's title).

    >>> round(mean_drop({"rows": [{"global_acc": a} for a in (0.5, 0.7, 0.6, 0.8)]}), 4)  # one fall of 0.1 in 3
    0.0333
    """
    accs = [r["global_acc"] for r in run["rows"] if math.isfinite(r["global_acc"])]
    if len(accs) < 2:
        return None
    return float(np.mean([max(0.0, a - b) for a, b in zip(accs, accs[1:], strict=False)]))


def seed_result(run: dict[str, Any], base: dict[str, Any] | None) -> dict[str, Any]:
    """One run's row of ``per_seed.csv``.

    Its accuracies (completed runs only) and, against the same-seed baseline run ``base`` (None when that is not
    completed), its rounds to both targets, speedups and accuracy deltas.
    """
    summary, done = run["summary"], is_completed(run)
    out: dict[str, Any] = {"setting": run["setting"], "method": run["method"], "seed": run["seed"]}
    out["status"] = summary.get("status", "missing")
    for name, key in {**DELTAS, "forgetting": "forgetting"}.items():
        out[name] = summary.get(key) if done else None
    out["mean_drop"] = mean_drop(run) if done else None
    for name, column in LOCAL.items():
        out[name] = last10(run, column) if done else None
    out["wall_seconds"] = summary.get("wall_seconds")
    pair = base if done else None
    out["paired"] = pair is not None
    for kind, (key, _paper) in TARGETS.items():
        hit = paired_target(run, pair, key) if pair is not None else {"target": None, "rounds": None, "speedup": None}
        out[f"{kind}_target"] = hit["target"]
        out[f"rounds_to_{kind}_target"] = hit["rounds"]
        out[f"speedup_{kind}_target"] = hit["speedup"]
    for name, key in DELTAS.items():
        out[f"delta_{name}"] = paired_delta(run, pair, key) if pair is not None else None
    return out


def per_seed_results(loaded: Sequence[dict[str, Any]], baseline: str) -> list[dict[str, Any]]:
    """:func:`seed_result` of every loaded run, each against the baseline's run of the same setting and seed.

    A run is paired only with a baseline run of its schedule (the same rounds and ``eval_every``,
    :func:`~fl_lightning.experiments.runs.same_schedule`): it is left unpaired otherwise.
    """
    bases = baseline_by_seed(loaded, baseline)
    out = []
    for run in loaded:
        base = bases.get((run["setting"], run["seed"]))
        out.append(seed_result(run, base if base is not None and same_schedule(run, base) else None))
    return out


def target_stats(results: Sequence[dict[str, Any]], kind: str) -> dict[str, Any]:
    """Rounds and speedups to the ``kind`` target of a (setting, method)'s seeds paired with the baseline.

    The targets, the rounds and speedups of the seeds that reached their target, and how many reached it out of how
    many were paired.
    """
    paired = [r for r in results if r["paired"]]
    reached = [r for r in paired if r[f"rounds_to_{kind}_target"] is not None]
    return {
        "target": [r[f"{kind}_target"] for r in paired],
        "rounds": [r[f"rounds_to_{kind}_target"] for r in reached],
        "speedup": [r[f"speedup_{kind}_target"] for r in reached if r[f"speedup_{kind}_target"] is not None],
        "reached": len(reached),
        "paired": len(paired),
    }


def _mean_if_all_reached(stats: dict[str, Any], key: str) -> float | None:
    """The mean of ``stats[key]`` when every paired seed reached the target (else None)."""
    values = stats[key]
    if not stats["paired"] or stats["reached"] < stats["paired"] or len(values) < stats["paired"]:
        return None
    return float(np.mean(values))


def _group_row(setting: str, method: str, runs: list[dict[str, Any]], results: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary row of one (setting, method) from its loaded runs and their :func:`seed_result` rows."""
    done = [r for r in runs if is_completed(r)]
    statuses = sorted({r["summary"].get("status", "missing") for r in runs})
    diverged = [r for r in runs if r["summary"].get("status") == "diverged"]
    targets = {kind: target_stats(results, kind) for kind in TARGETS}
    final = targets["final"]
    return {
        "setting": setting,
        "method": method,
        "seeds": len(runs),
        "completed": len(done),
        "status": "diverged" if "diverged" in statuses else ",".join(statuses),
        "final_acc": [r["summary"]["final_acc"] for r in done],
        "best_acc": [r["summary"]["best_acc"] for r in done],
        "last10_acc": [
            r["summary"]["last10_mean_acc"] for r in done if r["summary"].get("last10_mean_acc") is not None
        ],
        "forgetting": [r["summary"]["forgetting"] for r in done],
        "mean_drop": [r["mean_drop"] for r in results if r["mean_drop"] is not None],
        **{name: [r[name] for r in results if r[name] is not None] for name in LOCAL},
        "wall_seconds": [r["summary"]["wall_seconds"] for r in done],
        "wall_seconds_all": [
            float(r["summary"]["wall_seconds"]) for r in runs if _finite(r["summary"].get("wall_seconds"))
        ],
        # the "final" target alone, as means over the paired seeds
        "target": float(np.mean(final["target"])) if final["target"] else None,
        "rounds_to_target": _mean_if_all_reached(final, "rounds"),
        "speedup": _mean_if_all_reached(final, "speedup"),
        "targets": targets,
        "deltas": {name: [r[f"delta_{name}"] for r in results if r[f"delta_{name}"] is not None] for name in DELTAS},
        "ran_on": [ran_on(r["summary"]) for r in runs if r["summary"].get("status") != "missing"],
        "diverged_round": [divergence_round(r) for r in diverged],
        "best_before_divergence": [
            max((x["global_acc"] for x in r["rows"] if math.isfinite(x["global_acc"])), default=math.nan)
            for r in diverged
        ],
    }


def _finite(value: Any) -> bool:
    """Whether ``value`` is a finite number."""
    return isinstance(value, (int, float)) and math.isfinite(value)


def summarize(runs: Sequence[RunRef], baseline: str) -> list[dict[str, Any]]:
    """One row per (setting, method): accuracies, forgetting, rounds to target, speedups and accuracy deltas.

    Rounds, speedups and deltas pair each run with the baseline's run of the same setting and seed; the two targets
    are that run's final and best accuracy.
    """
    return summarize_loaded(load_runs(runs), baseline)


def summarize_loaded(loaded: Sequence[dict[str, Any]], baseline: str) -> list[dict[str, Any]]:
    """:func:`summarize` of runs already loaded by :func:`load_runs`."""
    results = per_seed_results(loaded, baseline)
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, run in enumerate(loaded):
        groups[(run["setting"], run["method"])].append(i)  # insertion order: the order the runs came in
    return [
        _group_row(setting, method, [loaded[i] for i in idx], [results[i] for i in idx])
        for (setting, method), idx in groups.items()
    ]


def total_wall(summary: list[dict[str, Any]]) -> tuple[float, int]:
    """The comparison's wall time, and how many runs reported one.

    The sum of every run's ``wall_seconds``, diverged and unfinished runs included.
    """
    walls = [w for s in summary for w in s["wall_seconds_all"]]
    return float(sum(walls)), len(walls)
