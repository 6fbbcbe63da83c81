#!/usr/bin/env bash
# The server learning rate probe behind the FedAdam/FedYogi/FedAdagrad configs: 20 rounds of the Fashion-MNIST FedNTD
# setting (shard 2, seed 0) for each optimizer and eta in 0.003, 0.01, 0.03, 0.1; prints each run's mean accuracy over
# rounds 16-20 (the criterion), best and final accuracy. Usage: bash scripts/server_lr_probe.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-runs/server_lr_probe}"
PY="${PY:-.venv/bin/python}"
for opt in fedadam fedyogi fedadagrad; do
  for lr in 0.003 0.01 0.03 0.1; do
    dir="$out/$opt-$lr"
    [ -f "$dir/summary.json" ] && continue
    "$PY" cli.py fit --config "configs/${opt}_fmnist_shard2.yaml" --federation.rounds 20 \
      --federation.server_optimizer.lr "$lr" --trainer.enable_progress_bar false --federation.plots false \
      --trainer.default_root_dir "$dir" > /dev/null
  done
done
"$PY" - "$out" <<'PYEOF'
import csv, sys
print(f"{'optimizer':<11} {'eta':>6} {'mean 16-20':>10} {'best':>6} {'final':>6}")
for opt in ("fedadam", "fedyogi", "fedadagrad"):
    for lr in ("0.003", "0.01", "0.03", "0.1"):
        acc = [float(r["global_acc"]) for r in csv.DictReader(open(f"{sys.argv[1]}/{opt}-{lr}/metrics.csv"))]
        print(f"{opt:<11} {lr:>6} {sum(acc[15:20]) / 5:10.4f} {max(acc):6.4f} {acc[-1]:6.4f}")
PYEOF
