"""The seed papers' headline claims beside fl_lightning's closest results, with a verdict per claim.

The claims live in a YAML (``results/claims/paper_claims.yaml``): per claim the paper's FedAvg and method numbers, the
setting, and, where fl_lightning has run its closest setting, a ``measure`` block naming the comparison that holds
it::

    measure:
      table: fmnist_ntd_3seeds      # results/<table>/report/per_seed.csv (written by `cli.py compare`)
      setting: shard2
      method: fedntd
      metric: final_acc             # final_acc | best_acc | last10_acc | speedup_final_target | speedup_best_target
                                    # | probe_acc | local_acc_last10 | forgetting | mean_drop
      made_by: python bench/x.py    # optional: the command that wrote per_seed.csv, where it is not `cli.py compare`

The verdict compares the paper's gain of the method over FedAvg (accuracy points, or speedup − 1) with fl_lightning's
gain, paired by seed (:data:`VERDICT_RULES`). Each verdict is given over all completed seeds and over seed 0 alone,
so that a table shows which verdicts a single seed would have got wrong.

``python cli.py claims`` writes ``claims.md``, ``claims.csv`` and ``claims.png`` next to the YAML and refreshes
README's generated sections (:mod:`fl_lightning.experiments.includes`).
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fl_lightning.core.files import read_yaml, write_text_atomic
from fl_lightning.experiments.aggregate import mean_std
from fl_lightning.experiments.tables import fmt_mean_std

#: The method every claim is measured against: ``per_seed.csv``'s deltas and speedups must be against it.
BASELINE = "fedavg"
#: What a verdict means, in the order they are checked.
VERDICT_RULES: dict[str, str] = {
    "not run": "no completed run of the method paired with FedAvg in the named comparison",
    "diverged": "every finished run of the method diverged",
    "reproduced": "every finished run of the method completed and beat FedAvg's run of its seed, by at least half the "
    "paper's gain on average where the paper prints one",
    "direction only": "the mean paired gain has the paper's sign but not the rest of 'reproduced'",
    "not reproduced": "the mean paired gain is zero or opposite to the paper's",
}
#: The run statuses a verdict counts: a run still running, interrupted or failed is left out until it finishes.
FINISHED = ("completed", "diverged")
#: A paper's "Failed" (``paper_failed: true``): reproduced when every run diverged or ended within this many points
#: of chance accuracy (``chance``, default 10 %).
FAILED_MARGIN = 5.0
#: Metrics a claim can be measured by: per_seed.csv's value column, its paired column, and how a gain is read.
METRICS: dict[str, tuple[str, str, str]] = {
    "final_acc": ("final_acc", "delta_final_acc", "points"),
    "best_acc": ("best_acc", "delta_best_acc", "points"),
    "last10_acc": ("last10_acc", "delta_last10_acc", "points"),
    "speedup_final_target": ("speedup_final_target", "speedup_final_target", "speedup"),
    "speedup_best_target": ("speedup_best_target", "speedup_best_target", "speedup"),
    # a probe of one local update from a saved global model (bench/local_probe.py): the local model's class-mean
    # test accuracy, paired with FedAvg's local model from the same global model
    "probe_acc": ("probe_acc", "delta_probe_acc", "points"),
    # AccL, the local models' mean test accuracy over the last 10 rounds (``eval_local``): per_seed.csv has no paired
    # column for it, so the gain is the method's value minus FedAvg's of the same seed
    "local_acc_last10": ("local_acc_last10", "", "points"),
    # forgetting F (FedNTD eq. 5) x 100, the method's minus FedAvg's of the same seed; lower is better, so a paper's
    # claim of less forgetting has a negative gain and is reproduced by negative ones
    "forgetting": ("forgetting", "", "points"),
    # the mean fall of the global accuracy from one evaluated round to the next
    # (fl_lightning.experiments.aggregate.mean_drop), for the papers' "more stable" curves; lower is better
    "mean_drop": ("mean_drop", "", "points"),
}
#: Metrics where lower is better: a claim with no paper numbers is won by a negative gain; no paper "Failed" by them.
LOWER_IS_BETTER = frozenset({"forgetting", "mean_drop"})
#: A claim's ``measure`` keys: the required ones, then the optional ones.
MEASURE_KEYS = ("table", "setting", "method", "metric")
MEASURE_OPTIONAL = ("made_by",)
CLAIMS_COLUMNS = (
    "id",
    "paper",
    "dataset",
    "metric",
    "paper_fedavg",
    "paper_method",
    "paper_gain",
    "fl_table",
    "fl_setting",
    "fl_method",
    "fl_metric",
    "seeds",
    "fl_fedavg",
    "fl_method_value",
    "fl_gain_mean",
    "fl_gain_std",
    "wins",
    "verdict",
    "verdict_seed0",
    "diverged",
    "reason",
)


def load_claims(path: Path) -> list[dict[str, Any]]:
    """The claims of a claims YAML, each checked for the fields the table needs."""
    data = read_yaml(path)
    claims = data.get("claims") if isinstance(data, dict) else None
    if not isinstance(claims, list) or not all(isinstance(c, dict) for c in claims):
        raise ValueError(f"{path}: expected a mapping with a 'claims' list of mappings")
    papers = data.get("papers") or {}
    if not isinstance(papers, dict):
        raise ValueError(f"{path}: 'papers' must map each paper's key to its name and title")
    for claim in claims:
        if claim.get("paper") in papers:
            claim.setdefault("paper_title", str(papers[claim["paper"]]))
        missing = [k for k in ("id", "paper", "dataset", "metric", "method") if k not in claim]
        if missing:
            raise ValueError(f"{path}: claim {claim.get('id', '?')} lacks {', '.join(missing)}")
        measure = claim.get("measure")
        if measure is not None:
            lacking = [k for k in MEASURE_KEYS if k not in measure]
            if lacking:
                raise ValueError(f"{path}: claim {claim['id']}'s measure lacks {', '.join(lacking)}")
            unknown = sorted(set(measure) - set(MEASURE_KEYS) - set(MEASURE_OPTIONAL))
            if unknown:
                raise ValueError(f"{path}: claim {claim['id']}'s measure has unknown key(s) {unknown}")
            if measure["metric"] not in METRICS:
                metric, choices = measure["metric"], ", ".join(METRICS)
                raise ValueError(f"{path}: claim {claim['id']}: unknown metric {metric!r}; choose from {choices}")
            lower = measure["metric"] in LOWER_IS_BETTER
            if claim.get("paper_failed") and (METRICS[measure["metric"]][2] != "points" or lower):
                raise ValueError(f"{path}: claim {claim['id']}: paper_failed needs an accuracy metric")
            if claim.get("paper_metric") == "rounds" and METRICS[measure["metric"]][2] != "speedup":
                raise ValueError(
                    f"{path}: claim {claim['id']}: paper_metric rounds needs a speedup metric, got {measure['metric']}"
                )
            if not claim.get("paper_failed") and paper_gain(claim, METRICS[measure["metric"]][2]) == 0:
                raise ValueError(
                    f"{path}: claim {claim['id']}: the paper's method ties FedAvg (gain 0), which no direction can "
                    "reproduce; measure a claim with a gain, or leave out fedavg and method_value"
                )
    return claims


def paper_gain(claim: dict[str, Any], kind: str) -> float | None:
    """The paper's gain of the method over FedAvg: accuracy points, or for rounds (T) the speedup − 1."""
    base, value = claim.get("fedavg"), claim.get("method_value")
    if not isinstance(base, int | float) or not isinstance(value, int | float):
        return None
    if kind == "speedup":  # the paper gives rounds T to FedAvg's accuracy: FedAvg's T / the method's T
        return base / value - 1.0 if value > 0 else None
    return float(value) - float(base)


def _float(cell: str) -> float | None:
    """A ``per_seed.csv`` cell as a finite number (None for an empty or non-finite cell)."""
    try:
        value = float(cell)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _unpaired(row: dict[str, str]) -> bool:
    """Whether a comparison's report left a completed run unpaired with FedAvg's (their rounds differ, say).

    Its row has a final accuracy but no delta against the baseline (a row of another tool's table, without the
    ``delta_final_acc`` column, is taken as paired).
    """
    return row.get("delta_final_acc") == "" and _float(row.get("final_acc", "")) is not None


def read_per_seed(results_dir: Path, table: str, columns: Sequence[str] = ()) -> list[dict[str, str]]:
    """The rows of ``results/<table>/report/per_seed.csv`` (empty when that comparison has no report).

    ``columns``: the value columns the caller reads, required besides setting, method, seed and status.
    """
    path = Path(results_dir) / table / "report" / "per_seed.csv"
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    lacking = sorted({"setting", "method", "seed", "status", *columns} - set(rows[0])) if rows else []
    if lacking:
        raise ValueError(
            f"{path} lacks column(s) {lacking}: rewrite it with the command that made it "
            "(a comparison's: `cli.py compare --report-only`)"
        )
    return rows


def measured(
    rows: Sequence[dict[str, str]], measure: dict[str, Any], seeds: Sequence[int] | None = None
) -> dict[str, Any]:
    """fl_lightning's side of a claim from a comparison's per-seed rows.

    Per paired seed (the method's run and FedAvg's both completed): the method's value, FedAvg's, and the gain
    (points for accuracies, speedup − 1 for speedups). ``seeds`` restricts the seeds used.
    """
    value_col, gain_col, kind = METRICS[measure["metric"]]
    pick = [r for r in rows if r["setting"] == measure["setting"] and (seeds is None or int(r["seed"]) in seeds)]
    mine = {int(r["seed"]): r for r in pick if r["method"] == measure["method"]}
    base = {int(r["seed"]): r for r in pick if r["method"] == BASELINE and r["status"] == "completed"}
    out: dict[str, Any] = {"kind": kind, "seeds": [], "values": [], "base": [], "gains": [], "missed_target": 0}
    out["pairs"] = 0  # seeds where the method's run and FedAvg's both completed, whether or not they hold the value
    # finished runs only: one still running (or interrupted, or failed) neither wins nor loses a seed yet
    out["runs"] = sum(1 for r in mine.values() if r["status"] in FINISHED)
    out["diverged"] = sum(1 for r in mine.values() if r["status"] == "diverged")
    for seed in sorted(mine):
        run = mine[seed]
        if run["status"] != "completed" or seed not in base or run.get("paired") == "False" or _unpaired(run):
            continue
        out["pairs"] += 1
        value, base_value = _float(run[value_col]), _float(base[seed][value_col])
        gain: float | None
        if kind == "speedup":
            speedup = _float(run[gain_col])
            if speedup is None:  # the method never reached FedAvg's accuracy: counted as speedup 0, a loss
                out["missed_target"] += 1
                speedup = 0.0
            gain = speedup - 1.0
        else:
            if gain_col:
                delta = _float(run[gain_col])
            else:
                delta = None if value is None or base_value is None else value - base_value
            gain = None if delta is None else 100.0 * delta
            value = None if value is None else 100.0 * value
            base_value = None if base_value is None else 100.0 * base_value
        if gain is None:
            continue
        out["seeds"].append(seed)
        out["values"].append(value)
        out["base"].append(base_value)
        out["gains"].append(gain)
    return out


def _sign(paper: float | None, lower_is_better: bool) -> float:
    """The sign a winning gain has: the paper's, else -1 where lower is better."""
    if paper is not None:
        return -1.0 if paper < 0 else 1.0
    return -1.0 if lower_is_better else 1.0


def verdict(paper: float | None, fl: dict[str, Any], lower_is_better: bool = False) -> str:
    """One of :data:`VERDICT_RULES` for the paper's gain ``paper`` and :func:`measured`'s ``fl``.

    ``lower_is_better``: the metric's direction (:data:`LOWER_IS_BETTER`), used where the paper prints no numbers.
    """
    gains = fl["gains"]
    if not gains:
        return "diverged" if fl["runs"] and fl["diverged"] == fl["runs"] else "not run"
    sign = _sign(paper, lower_is_better)
    mean = sum(gains) / len(gains)
    if sign * mean <= 0:
        return "not reproduced"
    # every finished run of the method completed, was paired and won (a speedup needs the target reached)
    all_seeds = all(sign * g > 0 for g in gains) and len(gains) == fl["runs"]
    if all_seeds and (paper is None or sign * mean >= 0.5 * abs(paper)):
        return "reproduced"
    return "direction only"


def failed_verdict(fl: dict[str, Any], chance: float) -> str:
    """The verdict on a paper's "Failed": did every run of the method diverge or end near chance accuracy?

    Reproduced when every finished run failed so, direction only when some did, not reproduced when none did.
    """
    if not fl["runs"]:
        return "not run"
    learned = [v for v in fl["values"] if v is not None and v > chance + FAILED_MARGIN]
    done = fl["diverged"] + len(fl["values"])
    if not learned and done == fl["runs"]:
        return "reproduced"
    return "direction only" if len(learned) < done else "not reproduced"


def claim_row(claim: dict[str, Any], results_dir: Path) -> dict[str, Any]:
    """One row of the claims table (:data:`CLAIMS_COLUMNS`)."""
    measure = claim.get("measure")
    row: dict[str, Any] = {c: "" for c in CLAIMS_COLUMNS}
    row.update(
        id=claim["id"],
        paper=claim["paper"],
        dataset=claim["dataset"],
        metric=claim["metric"],
        paper_fedavg="" if claim.get("fedavg") is None else claim["fedavg"],
        paper_method=" ".join(str(v) for v in (claim["method"], claim.get("method_value")) if v is not None),
        reason=claim.get("investigation", ""),
    )
    if measure is None:
        row["verdict"] = row["verdict_seed0"] = "not run"
        row["reason"] = row["reason"] or claim.get("not_run", "")
        return row
    kind = METRICS[measure["metric"]][2]
    gain = paper_gain(claim, "speedup" if kind == "speedup" and claim.get("paper_metric") == "rounds" else "points")
    if kind == "speedup" and claim.get("paper_metric") != "rounds":
        gain = None  # an accuracy claim measured by speed: the paper's gain has no speedup to compare
    rows = read_per_seed(results_dir, measure["table"], [c for c in METRICS[measure["metric"]][:2] if c])
    fl, fl0 = measured(rows, measure), measured(rows, measure, seeds=[0])
    lower = measure["metric"] in LOWER_IS_BETTER
    row.update(
        paper_gain="" if gain is None else round(gain, 2),
        fl_table=measure["table"],
        fl_setting=measure["setting"],
        fl_method=measure["method"],
        fl_metric=measure["metric"],
        seeds=" ".join(map(str, fl["seeds"])),
        verdict=verdict(gain, fl, lower),
        verdict_seed0=verdict(gain, fl0, lower),
    )
    if claim.get("paper_failed"):  # the paper reports the method as "Failed": did it fail here too?
        chance = float(claim.get("chance", 10.0))
        row.update(verdict=failed_verdict(fl, chance), verdict_seed0=failed_verdict(fl0, chance))
    row.update(
        diverged=f"{fl['diverged']}/{fl['runs']}" if fl["diverged"] else "",
    )
    if row["verdict"] == "not run" and not row["reason"] and fl["pairs"]:
        column = METRICS[measure["metric"]][0]
        why = {
            "local_acc_last10": "run them again with --federation.eval_local true, which records AccL",
            "mean_drop": "a mean drop needs at least two evaluated rounds",
        }.get(column, "run them again so that they record it")
        row["reason"] = f"its {fl['pairs']} completed pair(s) of runs hold no {column} to compare: {why}"
    elif row["verdict"] == "not run" and not row["reason"]:
        command = measure.get("made_by") or f"bash scripts/paper_tables.sh {measure['table']}"
        why = claim.get("not_run") or "no finished pair yet"
        row["reason"] = (
            f"{why}; `{command}` runs it (resuming unfinished runs) and writes its report in "
            f"results/{measure['table']}/"
        )
    if fl["gains"]:
        mean, std = mean_std(fl["gains"])
        row.update(fl_gain_mean=round(mean, 2), fl_gain_std=round(std, 2) if len(fl["gains"]) > 1 else "")
        sign = _sign(gain, lower)
        row["wins"] = f"{sum(1 for g in fl['gains'] if sign * g > 0)}/{len(fl['gains'])}"
        if fl["missed_target"]:
            row["wins"] += f", {fl['missed_target']} never reached FedAvg's accuracy"
        if kind == "points":
            row["fl_fedavg"] = _pm([b for b in fl["base"] if b is not None])
            row["fl_method_value"] = _pm([v for v in fl["values"] if v is not None])
    return row


def _pm(values: Sequence[float]) -> str:
    """``mean ± std`` of values already in points (the mean alone for one value; empty for none)."""
    if not values:
        return ""
    mean, std = mean_std(values)
    return fmt_mean_std(mean, std if len(values) > 1 else None)


def _gain_cell(row: dict[str, Any], kind: str) -> str:
    """fl_lightning's gain cell: mean ± std over seeds (a speedup as ``1.20x``) and the seeds won."""
    if row["fl_gain_mean"] == "":
        return "–"
    spread = "" if row["fl_gain_std"] == "" else f" ± {row['fl_gain_std']:.2f}"  # no spread over one seed
    if kind == "speedup":
        return f"{row['fl_gain_mean'] + 1:.2f}x{spread} ({row['wins']})"
    return f"{row['fl_gain_mean'] + 0.0:+.2f}{spread} ({row['wins']})"


def claims_markdown(claims: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]]) -> str:
    """The claims table in Markdown, with what its columns and verdicts mean."""
    lines = [
        "| claim | paper: FedAvg → method | gain | fl_lightning setting | FedAvg | method | gain (wins) | verdict "
        "| seed 0 alone |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for claim, row in zip(claims, rows, strict=True):
        measure = claim.get("measure") or {}
        kind = METRICS[measure["metric"]][2] if measure else "points"
        paper_gain_cell = (
            ""
            if row["paper_gain"] == ""
            else (f"{row['paper_gain'] + 1:.2f}x" if kind == "speedup" else f"{row['paper_gain']:+.2f}")
        )
        setting = (
            f"`{measure['table']}` {measure['setting']}, {measure['method']}, {measure['metric']}" if measure else "–"
        )
        verdict_cell = row["verdict"] + (f" (diverged {row['diverged']})" if row["diverged"] else "")
        lines.append(
            f"| {row['id']} ({claim['dataset']}) | {row['paper_fedavg'] or '–'} → {row['paper_method']} "
            f"| {paper_gain_cell or '–'} "
            f"| {setting} | {row['fl_fedavg'] or '–'} | {row['fl_method_value'] or '–'} | {_gain_cell(row, kind)} "
            f"| {verdict_cell} | {row['verdict_seed0']} |"
        )
    rules = "; ".join(f"**{name}**: {text}" for name, text in VERDICT_RULES.items())
    lines += [
        "",
        "Gain: method − FedAvg in accuracy points (paired by seed: same partition and sampling), in forgetting F "
        "× 100 or mean drop of the accuracy from one evaluated round to the next (`forgetting` and `mean_drop` rows, "
        "where lower is better: won by negative gains), or "
        "the speedup in rounds to FedAvg's accuracy; fl_lightning's as mean ± std over the paired seeds, with the "
        f'seeds the method wins. Verdicts: {rules}. A paper\'s "Failed" is reproduced when every run of the method '
        f"diverged or ended within {FAILED_MARGIN:g} points of chance, direction only when some did. The last column "
        "is the verdict seed 0 alone "
        "would give. Each claim's source, the paper's setting and every difference from fl_lightning's: "
        "`claims_settings.md`.",
    ]
    reasons = [(row["id"], row["reason"]) for row in rows if row["reason"] and row["verdict"] != "not run"]
    reasons += [(row["id"], row["reason"]) for row in rows if row["reason"] and row["verdict"] == "not run"]
    if reasons:
        lines += ["", "Why, where a claim is not reproduced or not run:", ""]
        lines += [f"- **{cid}**: {' '.join(str(text).split())}" for cid, text in reasons]
    return "\n".join(lines) + "\n"


def settings_markdown(claims: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]]) -> str:
    """Each claim's source and setting in the paper, the fl_lightning setting measuring it and how they differ."""
    lines = ["# The claims' settings and how fl_lightning's differ", ""]
    for claim, row in zip(claims, rows, strict=True):
        paper = claim.get("paper_title", claim["paper"])
        lines += [f"## {claim['id']}", "", f"- paper: {paper}; {claim.get('source', '')}".rstrip("; ")]
        lines.append(f"- metric: {' '.join(str(claim['metric']).split())}")
        setting = claim.get("setting") or {}
        if setting:
            lines.append(
                "- paper's setting: " + "; ".join(f"{k} {' '.join(str(v).split())}" for k, v in setting.items())
            )
        measure = claim.get("measure")
        if measure:
            source = measure.get("made_by") or f"configs/compare/{measure['table']}.yaml"
            lines.append(
                f"- fl_lightning: `{source}`, setting {measure['setting']}, "
                f"{measure['method']} against fedavg, {measure['metric']}; verdict: {row['verdict']}"
            )
        else:
            lines.append(f"- fl_lightning: not run ({' '.join(str(row['reason']).split())})")
        for diff in claim.get("differences") or []:
            lines.append(f"  - differs: {' '.join(str(diff).split())}")
        lines.append("")
    return "\n".join(lines)


def write_claims(
    claims_yaml: Path, results_dir: Path, out_dir: Path | None = None, plot: bool = True
) -> tuple[Path, Path]:
    """``claims.md``, ``claims_settings.md``, ``claims.csv`` and ``claims.png`` from the claims YAML and reports.

    The figure leaves out the papers' "Failed" claims (:func:`plot_claims`); ``plot=False`` writes the text files alone.
    """
    claims = load_claims(claims_yaml)
    rows = [claim_row(c, results_dir) for c in claims]
    out = Path(out_dir) if out_dir is not None else Path(claims_yaml).parent
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "claims.md", claims_markdown(claims, rows))
    write_text_atomic(out / "claims_settings.md", settings_markdown(claims, rows))
    buf = [list(CLAIMS_COLUMNS)] + [[row[c] for c in CLAIMS_COLUMNS] for row in rows]
    text = io.StringIO()
    csv.writer(text).writerows(buf)
    write_text_atomic(out / "claims.csv", text.getvalue())
    if plot:
        plot_claims([r for c, r in zip(claims, rows, strict=True) if not c.get("paper_failed")], out / "claims.png")
    return out / "claims.md", out / "claims.csv"


#: A verdict's colour in :func:`plot_claims`.
VERDICT_COLORS = {"reproduced": "tab:green", "direction only": "tab:orange", "not reproduced": "tab:red"}


def plot_claims(rows: Sequence[dict[str, Any]], path: Path) -> Path | None:
    """A forest plot of the claims measured in points; None (and no file) where no such claim is measured.

    One line per claim in the table's order: fl_lightning's paired gain (mean ± std over seeds, coloured by verdict)
    beside the paper's gain, in accuracy points, or forgetting F × 100 or mean drop (labelled "lower is better").
    Speedup claims (another unit) and claims with no paired gain (not run, diverged) have no line; pass the rows of
    the papers' "Failed" claims only if they should be drawn, their verdict being about failing, not about a gain.
    """
    shown = [r for r in rows if r["fl_gain_mean"] != "" and METRICS[r["fl_metric"]][2] == "points"]
    if not shown:
        Path(path).unlink(missing_ok=True)  # an older figure would show claims that are no longer measured
        return None
    from matplotlib.lines import Line2D

    from fl_lightning.core.plots import new_figure, save_figure

    fig, ax = new_figure((10, 0.32 * len(shown) + 1.8))
    for y, row in enumerate(shown):
        color = VERDICT_COLORS.get(row["verdict"], "tab:gray")
        ax.errorbar(row["fl_gain_mean"], y, xerr=row["fl_gain_std"] or None, fmt="o", color=color, ms=5)
        if row["paper_gain"] != "":
            ax.plot(row["paper_gain"], y, "x", color="black", ms=7)
    ax.set_yticks(range(len(shown)))
    labels = [
        f"{r['id']}{', lower is better' * (r['fl_metric'] in LOWER_IS_BETTER)} "
        f"({len(r['seeds'].split())} seed{'s' * (' ' in r['seeds'])})"
        for r in shown
    ]
    ax.set_yticklabels(labels)
    ax.invert_yaxis()
    ax.axvline(0.0, color="gray", lw=0.8)
    handles = [Line2D([], [], marker="o", ls="", color=c, label=v) for v, c in VERDICT_COLORS.items()]
    handles.append(Line2D([], [], marker="x", ls="", color="black", label="the paper's gain"))
    ax.legend(handles=handles, fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=4, frameon=False)
    ax.set_xlabel("gain over FedAvg, mean ± std over seeds (points)")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def stale_claims(claims_yaml: Path, results_dir: Path) -> list[str]:
    """The files :func:`write_claims` would change, beside ``claims_yaml``."""
    with tempfile.TemporaryDirectory() as tmp:
        write_claims(claims_yaml, results_dir, Path(tmp), plot=False)  # the figure is not compared
        fresh = {p.name: p.read_bytes() for p in Path(tmp).iterdir() if p.suffix in (".md", ".csv")}
    here = Path(claims_yaml).parent
    return [
        str(here / name)
        for name, data in sorted(fresh.items())
        if not (here / name).is_file() or (here / name).read_bytes() != data
    ]


def check_results_dir(claims: Sequence[dict[str, Any]], results_dir: Path) -> None:
    """Refuse a results folder that is not there or holds none of the claims' comparisons' ``per_seed.csv``.

    Every claim would read "not run", and ``claims`` would rewrite the claims files and delete the figure of
    results that exist elsewhere (a typo in ``--results``).
    """
    if not results_dir.is_dir():
        raise FileNotFoundError(
            f"no results folder {results_dir}; pass --results DIR, the folder holding <comparison>/report/per_seed.csv"
        )
    tables = sorted({str(c["measure"]["table"]) for c in claims if c.get("measure")})
    if tables and not any((results_dir / t / "report" / "per_seed.csv").is_file() for t in tables):
        raise FileNotFoundError(
            f"{results_dir} holds no comparison's report/per_seed.csv (looked for {', '.join(tables[:3])}"
            f"{', ...' if len(tables) > 3 else ''}); pass --results DIR, the folder holding them"
        )


def main(argv: list[str] | None = None) -> int:
    """``cli.py claims [--claims FILE] [--results DIR] [--readme FILE | --check]``."""
    from fl_lightning.experiments import includes

    parser = argparse.ArgumentParser(prog="cli.py claims", description=__doc__.split("\n\n")[0])
    parser.add_argument("--claims", default="results/claims/paper_claims.yaml", help="the claims YAML")
    parser.add_argument("--results", default="results", help="the folder holding each comparison's report")
    parser.add_argument("--readme", default="README.md", help="the Markdown file whose generated sections to refresh")
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing: exit 1 if the claims files or a generated README section are out of date",
    )
    args = parser.parse_args(argv)
    claims_yaml = Path(args.claims)
    if not claims_yaml.is_file():
        raise FileNotFoundError(f"no claims file {claims_yaml}; pass --claims FILE")
    check_results_dir(load_claims(claims_yaml), Path(args.results))
    if args.check:
        stale = stale_claims(claims_yaml, Path(args.results))
        stale += [f"{args.readme}'s section from {name}" for name in includes.stale_sections(Path(args.readme))]
        for name in stale:
            print(f"[claims] {name} is out of date; run `python cli.py claims`")
        return 1 if stale else 0
    md, csv_path = write_claims(claims_yaml, Path(args.results))
    png = md.with_name("claims.png")
    print(f"[claims] {md}, {csv_path}" + (f" and {png}" if png.is_file() else " (no claim measured in points to plot)"))
    changed = includes.refresh(Path(args.readme))
    print(
        f"[claims] {args.readme}: {len(changed)} generated section(s) refreshed"
        if changed
        else f"[claims] {args.readme}: generated sections up to date"
    )
    return 0
