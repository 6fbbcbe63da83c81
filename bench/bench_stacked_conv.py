"""Milliseconds for one forward and backward of a convolution of K stacked clients, each way it can be computed.

The batched engine's stacked step runs each client's convolution under ``vmap``, which lowers it to one grouped
convolution (groups = K) unless ``Federation(stacked_conv=...)`` says otherwise. This times, for K = 10 clients:

- ``vmap``: ``vmap(conv2d)`` over the stacked inputs and weights (``stacked_conv=grouped``, the default);
- ``vmap matmul``: the same under ``stacked_conv=matmul`` (im2col and one batched matmul);
- ``vmap loop``: the same under ``stacked_conv=loop`` (one convolution per client, forward and backward);
- ``loop``: K ordinary convolutions called directly (the sequential engine's arithmetic);
- ``grouped``: the grouped convolution called directly, on the CPU also with mkldnn off.

Shapes: ``lenet``'s two convolutions on the quickstart's digits (8×8, padding 2, batch 32) and on Fashion-MNIST
(28×28, batch 50), and the ``cnn``'s two on CIFAR-10 (32×32, padding 2, batch 50: the FedNTD setting of
``bench_engines.py``'s ``cifar10_ntd_shapes``).

On the CPU: float32, the mean of ``--repeats`` calls after 10 warm-up calls. With ``--gpu``: ``bf16`` autocast (as
``precision="bf16-mixed"``), each way's forward and backward recorded once as a CUDA graph and replayed
``--repeats`` times (the device time alone, as the engine's recorded step runs it), and ``vmap`` again with cuDNN's
benchmark mode (its algorithms timed first).

Usage: ``python bench/bench_stacked_conv.py [--gpu] [--clients 10] [--threads N] [--repeats 200] [--shapes cifar]``
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from fl_lightning.core.stacked_conv import lowered_convolutions

# (name, in channels, out channels, image side, padding, batch)
SHAPES = {
    "digits": [("digits conv1", 1, 6, 8, 2, 32), ("digits conv2", 6, 16, 4, 2, 32)],
    "fmnist": [("fmnist conv1", 1, 6, 28, 0, 50), ("fmnist conv2", 6, 16, 12, 0, 50)],
    "cifar": [("cifar cnn conv1", 3, 32, 32, 2, 50), ("cifar cnn conv2", 32, 64, 16, 2, 50)],
}
Way = Callable[[], Tensor]
WAYS = ("vmap", "vmap matmul", "vmap loop", "loop", "grouped")


def ways(x: Tensor, w: Tensor, b: Tensor, pad: int) -> dict[str, Way]:
    """Each way's forward, from stacked inputs ``x`` [K, B, C, H, W], weights ``w`` [K, O, C, k, k], biases [K, O]."""
    k, batch, cin, side = x.shape[0], x.shape[1], x.shape[2], x.shape[-1]
    cout, kernel = w.shape[1], w.shape[-1]

    def vmapped(lowering: str) -> Way:
        def forward() -> Tensor:
            with lowered_convolutions(lowering):
                return torch.func.vmap(lambda xi, wi, bi: F.conv2d(xi, wi, bi, padding=pad))(x, w, b).sum()

        return forward

    def grouped() -> Tensor:
        merged = x.permute(1, 0, 2, 3, 4).reshape(batch, k * cin, side, side)
        return F.conv2d(merged, w.reshape(k * cout, cin, kernel, kernel), b.reshape(-1), padding=pad, groups=k).sum()

    def loop() -> Tensor:
        return torch.stack([F.conv2d(x[i], w[i], b[i], padding=pad).sum() for i in range(k)]).sum()

    return dict(zip(WAYS, (vmapped("grouped"), vmapped("matmul"), vmapped("loop"), loop, grouped), strict=True))


def cpu_ms(f: Way, leaves: list[Tensor], repeats: int) -> float:
    """Mean milliseconds over ``repeats`` calls after 10 warm-up calls, each a forward and a backward."""
    for _ in range(10):
        torch.autograd.grad(f(), leaves)
    start = time.perf_counter()
    for _ in range(repeats):
        torch.autograd.grad(f(), leaves)
    return (time.perf_counter() - start) / repeats * 1e3


def gpu_ms(f: Way, leaves: list[Tensor], repeats: int) -> float:
    """Mean milliseconds of one replay of ``f``'s forward and backward recorded as a CUDA graph (bf16 autocast)."""

    def step() -> list[Tensor]:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = f()
        return list(torch.autograd.grad(out, leaves))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", action="store_true", help="bf16 autocast on CUDA, each way replayed as a CUDA graph")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--shapes", default="digits,fmnist,cifar", help=f"comma-separated subset of {list(SHAPES)}")
    args = parser.parse_args()
    names = [s for s in args.shapes.split(",") if s]
    if any(s not in SHAPES for s in names):
        parser.error(f"unknown shapes in {names}; choose from {', '.join(SHAPES)}")
    if args.gpu and not torch.cuda.is_available():
        print("--gpu: torch.cuda.is_available() is False on this machine; nothing measured")
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device("cuda" if args.gpu else "cpu")
    where = (
        f"{torch.cuda.get_device_name(0)}, bf16 autocast, CUDA-graph replays"
        if args.gpu
        else f"CPU float32, {torch.get_num_threads()} threads"
    )
    print(f"K = {args.clients} clients; {where}; torch {torch.__version__}")
    print(f"ms per forward + backward, mean of {args.repeats}")
    extra = "vmap bench" if args.gpu else "no mkldnn"
    labels = [*WAYS, extra]
    print(f"{'shape':16s}" + "".join(f"{label:>13s}" for label in labels))
    for name, cin, cout, side, pad, batch in (shape for s in names for shape in SHAPES[s]):
        x = torch.randn(args.clients, batch, cin, side, side, device=device, requires_grad=True)
        w = torch.randn(args.clients, cout, cin, 5, 5, device=device, requires_grad=True)
        b = torch.randn(args.clients, cout, device=device, requires_grad=True)
        fs, leaves = ways(x, w, b, pad), [x, w, b]
        if args.gpu:
            t = {label: gpu_ms(f, leaves, args.repeats) for label, f in fs.items()}
            with torch.backends.cudnn.flags(enabled=True, benchmark=True):
                t[extra] = gpu_ms(fs["vmap"], leaves, args.repeats)
        else:
            t = {label: cpu_ms(f, leaves, args.repeats) for label, f in fs.items()}
            with torch.backends.mkldnn.flags(enabled=False):
                t[extra] = cpu_ms(fs["grouped"], leaves, args.repeats)
        print(f"{name:16s}" + "".join(f"{t[label]:13.3f}" for label in labels), flush=True)


if __name__ == "__main__":
    main()
