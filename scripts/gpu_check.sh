#!/usr/bin/env bash
# The GPU checks in one run, for a machine with a CUDA GPU and PyTorch + Lightning installed (no virtual environment
# needed: the checkout is put on PYTHONPATH). Every piece has its own time limit and the limits add up to 410 s, so
# that the run fits twice within 15 minutes of GPU time with a machine's start (about 36 s) each:
#
#   1. the tests marked `gpu` (115 s): the captured step equals the sequential engine in float32 for every method
#      and ends within a point of it after 20 rounds in bf16-mixed; so does each way of computing the stacked
#      convolutions; the group size fits a memory budget; every method trains batched in bf16-mixed, its steps
#      recorded;
#   2. bench/bench_engines.py --gpu --method fedntd on the Fashion-MNIST FedNTD setting (60 s): sequential, batched
#      (its step a CUDA graph) and batched uncaptured, each step's time beside its graph's replay alone and its
#      arithmetic floor, the peak memory per client, 200 rounds;
#   3. the stacked convolutions: bench/bench_stacked_conv.py --gpu on the CIFAR-10 cnn's two convolutions, each way
#      (vmap's grouped convolution, with and without cuDNN's benchmark mode; im2col + batched matmul; one convolution
#      per client) recorded and replayed (25 s); then the CIFAR-10-shaped FedNTD setting, sequential against the
#      batched engine computing them each way (Federation(stacked_conv=grouped|matmul|loop)), and each way's top
#      kernels in a round (--profile) (110 s);
#   4. FedNTD and FedLMD through cli.py fit, sequential against batched (100 s);
#   5. with FEDRS=1 only (30 s more): FedRS's bf16-mixed step, which could not be recorded on 2026-11-28, its test
#      run with CUDA_LAUNCH_BLOCKING=1 and the failure shown in full;
#   6. with ROUTE=1 only (70 s more): the route, FedNTD in the Fashion-MNIST setting through cli.py fit, its step
#      recorded as it is against compiled (torch.compile) then recorded.
#
# Logs go to $OUT (default /tmp/gpu_check). Fashion-MNIST is read from ./data or Debian's folder: from a machine
# without it, copy the IDX files into ./data first (30 MB).
#
#   bash scripts/gpu_check.sh
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
    free, total = torch.cuda.mem_get_info()
    print("gpu", torch.cuda.get_device_name(0), f"{total / 2**30:.0f} GiB, {free / 2**30:.0f} GiB free")
EOF
status=0
start=$SECONDS
timeout 115 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/test_step_capture.py tests/test_batched.py \
  tests/test_engine.py tests/test_server_optim.py tests/test_stacked_conv.py 2>&1 | tee "$OUT/gpu_tests.log" || status=1
echo "tests: $((SECONDS - start)) s" | tee -a "$OUT/gpu_tests.log"
timeout 60 "$PY" bench/bench_engines.py --gpu --method fedntd --rounds 3 --groups "" --workloads fmnist_ntd --no-ops \
  2>&1 | tee "$OUT/bench_engines_gpu.log" || status=1
echo "bench_engines: $((SECONDS - start)) s" | tee -a "$OUT/bench_engines_gpu.log"
timeout 25 "$PY" bench/bench_stacked_conv.py --gpu --shapes cifar --repeats 50 2>&1 \
  | tee "$OUT/bench_stacked_conv_gpu.log" || status=1
timeout 110 "$PY" bench/bench_engines.py --gpu --method fedntd --rounds 3 --groups "" --captures "" --no-ops \
  --workloads cifar10_ntd_shapes --stacked-convs matmul,loop --profile 2>&1 | tee "$OUT/bench_convs_gpu.log" || status=1
echo "stacked convolutions: $((SECONDS - start)) s" | tee -a "$OUT/bench_convs_gpu.log"
timeout 100 "$PY" bench/bench_method_engines.py --gpu --rounds 3 --configs fedntd_fmnist_shard2,fedlmd_fmnist_shard2 \
  2>&1 | tee "$OUT/bench_methods_gpu.log" || status=1
echo "methods: $((SECONDS - start)) s" | tee -a "$OUT/bench_methods_gpu.log"
if [ "${FEDRS:-0}" = 1 ]; then
  CUDA_LAUNCH_BLOCKING=1 timeout 30 "$PY" -m pytest -q -p no:cacheprovider -m gpu --runxfail -x --tb=long \
    "tests/test_batched.py::test_every_method_trains_batched_in_bf16_on_a_gpu[fedrs]" 2>&1 \
    | tail -80 | tee "$OUT/fedrs_bf16_gpu.log" || status=1
fi
if [ "${ROUTE:-0}" = 1 ]; then
  timeout 70 "$PY" bench/bench_method_engines.py --gpu --rounds 4 --configs fedntd_fmnist_shard2 \
    --engines batched:graph,batched:compile 2>&1 | tee "$OUT/bench_route_gpu.log" || status=1
fi
echo "all: $((SECONDS - start)) s, status $status" | tee "$OUT/done.txt"
exit "$status"
