#!/usr/bin/env bash
# Copy the small, readable outputs of finished runs (summary.json, metrics.csv, config.yaml, partition.csv) from a
# runs/ folder into results/, so that measured numbers live in git. Usage: scripts/archive_results.sh SRC DEST
set -euo pipefail
src="$1"; dest="$2"
# A run that compare moved aside (<seed>.replaced-<time>, when its config changed) is the old run: not archived.
find "$src" \( -path "*/report" -o -name "*.replaced-*" \) -prune -o -name summary.json -print | while read -r summary; do
  status=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['status'])" "$summary")
  case "$status" in completed|diverged) ;; *) continue ;; esac
  run_dir=$(dirname "$summary"); rel=${run_dir#"$src"}; mkdir -p "$dest/$rel"
  for f in summary.json metrics.csv config.yaml partition.csv; do
    if [ -f "$run_dir/$f" ]; then cp "$run_dir/$f" "$dest/$rel/"; fi  # not `&&`: a missing file must not stop set -e
  done
done
if [ -d "$src/report" ]; then mkdir -p "$dest/report"; cp "$src"/report/results.{md,csv} "$dest/report/"; fi
