"""Write ``results/claims/summary.md``: the claims table in brief, the headline results README shows.

``python cli.py claims`` writes ``results/claims/claims.csv`` (every claim of the five papers beside fl_lightning's
paired result and a verdict); this script condenses it to one short row per claim, and ``python cli.py claims``
then copies the summary into README's generated section (:mod:`fl_lightning.experiments.includes`)::

    .venv/bin/python scripts/docs_results.py && .venv/bin/python cli.py claims

``--check`` writes nothing and exits 1 when the summary differs from what ``claims.csv`` gives (a test runs it).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLAIMS = ROOT / "results" / "claims" / "claims.csv"
SUMMARY = ROOT / "results" / "claims" / "summary.md"

#: Metrics measured as a ratio (speedup in rounds) rather than in points; ``claims.csv`` holds them as ratio − 1.
RATIOS = frozenset({"speedup_final_target", "speedup_best_target"})


def _gain(value: str, metric: str) -> str:
    if not value:
        return "–"
    number = float(value)
    return f"{number + 1:.2f}x" if metric in RATIOS else f"{number:+.2f}"


def summary(rows: list[dict[str, str]]) -> str:
    """The Markdown summary of the claims table's rows."""
    out = [
        "| claim | paper: FedAvg → method | paper's gain | fl_lightning's gain (seeds won) | verdict |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        metric = row["fl_metric"] or ""
        paper = f"{row['paper_fedavg']} → {row['paper_method']}" if row["paper_fedavg"] else row["paper_method"]
        if row["fl_gain_mean"] and row["seeds"] and row["wins"]:
            ours = f"{_gain(row['fl_gain_mean'], metric)} ({row['wins']})"
        else:
            ours = "–"
        paper_gain = _gain(row["paper_gain"], metric) if row["paper_gain"] else "–"
        out.append(f"| {row['id']} ({row['dataset']}) | {paper} | {paper_gain} | {ours} | {row['verdict']} |")
    counts: dict[str, int] = {}
    for row in rows:
        verdict = row["verdict"].split(" (")[0]
        counts[verdict] = counts.get(verdict, 0) + 1
    tally = ", ".join(f"{n} {verdict}" for verdict, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    out += [
        "",
        f"{len(rows)} claims: {tally}. Gains are method − FedAvg in accuracy points (forgetting F × 100 and mean drop: "
        "lower is better), or the speedup in rounds to FedAvg's accuracy; fl_lightning's are paired by seed on "
        "Fashion-MNIST transpositions of the papers' settings, mean over seeds.",
    ]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check``, compare) ``results/claims/summary.md``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the summary is out of date")
    args = parser.parse_args(argv)
    with CLAIMS.open(newline="", encoding="utf-8") as f:
        text = summary(list(csv.DictReader(f)))
    current = SUMMARY.read_text(encoding="utf-8") if SUMMARY.is_file() else None
    if args.check:
        if current != text:
            print(f"{SUMMARY.relative_to(ROOT)} is out of date: run python scripts/docs_results.py", file=sys.stderr)
            return 1
        return 0
    if current != text:
        SUMMARY.write_text(text, encoding="utf-8")
        print(f"wrote {SUMMARY.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
