#!/usr/bin/env bash
# The GPU checks in one run, for a machine with a CUDA GPU and PyTorch + Lightning installed (no virtual environment
# needed: the checkout is put on PYTHONPATH): the tests marked `gpu`, the engines bench in bf16-mixed on all four
# workloads, then both engines on the teacher methods and on FedKA's t-CNN setting through the CLI
# (bench/bench_method_engines.py; Fashion-MNIST from ./data or Debian's folder). Logs go to $OUT (default
# /tmp/gpu_check).
#
#   bash scripts/gpu_check.sh            # about 6 minutes on an H200 (2026-11-26: tests 40-85 s, bench 78 s,
#                                        # methods about 3 min)
#
# From a machine without the data, copy the Fashion-MNIST IDX files into ./data first (they are 30 MB).
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-python3}"
OUT="${OUT:-/tmp/gpu_check}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 WANDB_MODE=offline
"$PY" - <<'EOF' 2>&1 | tee "$OUT/env.txt"
import torch, lightning
print("torch", torch.__version__, "lightning", lightning.__version__, "cuda", torch.cuda.is_available())
if torch.cuda.is_available():
    print("gpu", torch.cuda.get_device_name(0))
EOF
status=0
timeout 240 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/test_batched.py tests/test_engine.py tests/test_server_optim.py 2>&1 \
  | tee "$OUT/gpu_tests.log" || status=1
timeout 420 "$PY" bench/bench_engines.py --gpu --rounds 3 2>&1 | tee "$OUT/bench_engines_gpu.log" || status=1
timeout 300 "$PY" bench/bench_method_engines.py --gpu --rounds 6 --configs fedntd_fmnist_shard2,fedlmd_fmnist_shard2 \
  2>&1 | tee "$OUT/bench_methods_gpu.log" || status=1
timeout 240 "$PY" bench/bench_method_engines.py --gpu --rounds 3 --engines batched \
  --configs fedavg_fmnist_dir01,fedka_fmnist_dir01 2>&1 | tee -a "$OUT/bench_methods_gpu.log" || status=1
exit "$status"
