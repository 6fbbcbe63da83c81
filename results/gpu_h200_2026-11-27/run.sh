#!/usr/bin/env bash
# One device call (2026-11-27): gpu tests, engines bench, and the FedSSD/FedCAD Table I setting's round time on a GPU
# (dir05, FedAvg/FedSSD/FedCAD side by side as compare --jobs 3 would run them, batched, bf16-mixed, 3 rounds).
set -uo pipefail
OUT="${OUT:-/tmp/devout}"; mkdir -p "$OUT"
PY="${PY:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 WANDB_MODE=offline
[ -f data/train-images-idx3-ubyte.gz ] || cp data/fashion-mnist/* data/ 2>/dev/null
T0=$(date +%s)
el() { echo "$1 at $(( $(date +%s) - T0 )) s" | tee -a "$OUT/env.txt"; }
"$PY" -c "import torch, lightning, jsonargparse; print('torch', torch.__version__, 'lightning', lightning.__version__, 'jsonargparse', jsonargparse.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu', torch.get_num_threads(), 'threads')" >> "$OUT/env.txt" 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$OUT/env.txt" 2>&1
timeout 200 "$PY" -m pytest -q -p no:cacheprovider -m gpu -rs tests/test_batched.py tests/test_engine.py tests/test_server_optim.py > "$OUT/gpu_tests.log" 2>&1
el "pytest rc $?"
timeout 150 "$PY" bench/bench_engines.py --gpu --rounds 3 > "$OUT/bench_engines_gpu.log" 2>&1
el "bench_engines rc $?"
for m in fedavg fedssd fedcad; do
  timeout -k 10 170 "$PY" cli.py fit --config configs/${m}_fmnist_dir05.yaml --federation.rounds 3 --federation.engine auto \
    --federation.plots false --trainer.default_root_dir /tmp/ssd_$m --overwrite > /tmp/ssd_$m.log 2>&1 &
done
wait
el "dir05 side by side"
for m in fedavg fedssd fedcad; do
  f=$(find /tmp/ssd_$m -name metrics.csv | head -1); cp "$f" "$OUT/dir05_${m}_side_metrics.csv" 2>/dev/null
  grep -i -m3 "engine\|error\|sequential" /tmp/ssd_$m.log >> "$OUT/fits.log"; tail -n 3 /tmp/ssd_$m.log >> "$OUT/fits.log"
done
if [ $(( $(date +%s) - T0 )) -lt 400 ]; then
  timeout -k 10 100 "$PY" cli.py fit --config configs/fedavg_fmnist_dir05.yaml --federation.rounds 3 --federation.engine auto \
    --federation.plots false --trainer.default_root_dir /tmp/ssd_alone --overwrite > /tmp/ssd_alone.log 2>&1
  f=$(find /tmp/ssd_alone -name metrics.csv | head -1); cp "$f" "$OUT/dir05_fedavg_alone_metrics.csv" 2>/dev/null
  el "dir05 fedavg alone"
fi
tail -3 "$OUT/gpu_tests.log"; tail -12 "$OUT/bench_engines_gpu.log"; cat "$OUT/env.txt"
