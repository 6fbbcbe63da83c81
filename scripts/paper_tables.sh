#!/usr/bin/env bash
# Run the paper-table comparisons (issue "paper tables") one after another, then archive every finished run into
# results/ and rebuild the reports, the claims table and README's generated tables from them.
#
#   bash scripts/paper_tables.sh                 # all CPU comparisons, in this order
#   bash scripts/paper_tables.sh fmnist_ntd_3seeds fmnist_lda005_3seeds
#   bash scripts/paper_tables.sh --archive-only  # no runs: archive, reports, claims
#
# Each comparison reuses finished runs and resumes interrupted ones, so stop it (Ctrl-C, or SIGTERM when it runs in the
# background) and start it again at will. fmnist_fedka_setting is left out by default: its t-CNN takes about 11 hours a
# run on one CPU core; name it to run it (on a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
DEFAULT=(fmnist_ntd_3seeds fmnist_lda005_3seeds fmnist_fedssd_setting fmnist_niid_bench)
archive_only=false
tables=()
for arg in "$@"; do
  case "$arg" in
    --archive-only) archive_only=true ;;
    *) tables+=("$arg") ;;
  esac
done
[ ${#tables[@]} -gt 0 ] || tables=("${DEFAULT[@]}")
for t in "${tables[@]}"; do
  [ -f "configs/compare/$t.yaml" ] || { echo "no configs/compare/$t.yaml; choose from: $(ls configs/compare | sed 's/.yaml//' | tr '\n' ' ')"; exit 2; }
done

archive() {
  local t=$1 src="runs/compare/$1"
  [ -d "$src" ] || return 0
  bash scripts/archive_results.sh "$src" "results/$t"
  "$PY" cli.py compare --config "configs/compare/$t.yaml" --report-only --output-dir "results/$t"
}

status=0
for t in "${tables[@]}"; do
  if ! $archive_only; then
    "$PY" cli.py compare --config "configs/compare/$t.yaml" || status=$?
  fi
  archive "$t"
  [ "$status" -eq 0 ] || break  # interrupted or a run failed: archive what finished, stop here
done
"$PY" cli.py claims
exit "$status"
