"""Milliseconds for one forward and backward of a convolution of K stacked clients, four ways.

The batched engine's stacked step runs each client's convolution through ``vmap``, which lowers it to one grouped
convolution (groups = K). This prints that against the alternatives, for ``lenet``'s two convolutions on the
quickstart's digits (8×8, padding 2, batch 32) and on Fashion-MNIST (28×28, batch 50), K = 10 clients:

- ``vmap``: ``vmap(conv2d)`` over the stacked inputs and weights (what the engine runs);
- ``grouped``: the same grouped convolution called directly (mkldnn on, then off);
- ``loop``: K ordinary convolutions, one per client (the sequential engine's arithmetic);
- ``unfold-bmm``: im2col (``unfold``) and one batched matmul over the clients.

Usage: ``python bench/bench_stacked_conv.py [--clients 10] [--threads N] [--repeats 200]``
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

# (name, in channels, out channels, image side, padding, batch): lenet's convolutions on the two datasets
SHAPES = [
    ("digits conv1", 1, 6, 8, 2, 32),
    ("digits conv2", 6, 16, 4, 2, 32),
    ("fmnist conv1", 1, 6, 28, 0, 50),
    ("fmnist conv2", 6, 16, 12, 0, 50),
]


def ms_per_call(f: Callable[[], Tensor], repeats: int) -> float:
    """Mean milliseconds over ``repeats`` calls after 10 warm-up calls, each a forward and a backward."""
    for _ in range(10):
        f().backward()
    start = time.perf_counter()
    for _ in range(repeats):
        f().backward()
    return (time.perf_counter() - start) / repeats * 1e3


def ways(x: Tensor, w: Tensor, b: Tensor, pad: int) -> dict[str, Callable[[], Tensor]]:
    """Each way's forward, from stacked inputs ``x`` [K, B, C, H, W], weights ``w`` [K, O, C, k, k], biases [K, O]."""
    k, batch, cin, side = x.shape[0], x.shape[1], x.shape[2], x.shape[-1]
    cout, kernel = w.shape[1], w.shape[-1]

    def vmapped() -> Tensor:
        return torch.func.vmap(lambda xi, wi, bi: F.conv2d(xi, wi, bi, padding=pad))(x, w, b).sum()

    def grouped() -> Tensor:
        merged = x.permute(1, 0, 2, 3, 4).reshape(batch, k * cin, side, side)
        return F.conv2d(merged, w.reshape(k * cout, cin, kernel, kernel), b.reshape(-1), padding=pad, groups=k).sum()

    def loop() -> Tensor:
        return sum(F.conv2d(x[i], w[i], b[i], padding=pad).sum() for i in range(k))  # type: ignore[return-value]

    def unfold_bmm() -> Tensor:
        cols = F.unfold(x.reshape(k * batch, cin, side, side), kernel, padding=pad)  # [K·B, C·k·k, L]
        cols = cols.reshape(k, batch, cin * kernel * kernel, -1).transpose(2, 3).reshape(k, -1, cin * kernel * kernel)
        return torch.baddbmm(b.unsqueeze(1), cols, w.reshape(k, cout, -1).transpose(1, 2)).sum()

    return {"vmap": vmapped, "grouped": grouped, "loop": loop, "unfold-bmm": unfold_bmm}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    print(f"K = {args.clients} clients, {threads} threads, ms per forward + backward (mean of {args.repeats})")
    print(f"{'shape':14s} {'vmap':>8s} {'grouped':>8s} {'no mkldnn':>10s} {'loop':>8s} {'unfold-bmm':>11s}")
    for name, cin, cout, side, pad, batch in SHAPES:
        x = torch.randn(args.clients, batch, cin, side, side, requires_grad=True)
        w = torch.randn(args.clients, cout, cin, 5, 5, requires_grad=True)
        b = torch.randn(args.clients, cout, requires_grad=True)
        fs = ways(x, w, b, pad)
        t = {label: ms_per_call(f, args.repeats) for label, f in fs.items()}
        with torch.backends.mkldnn.flags(enabled=False):
            t["no mkldnn"] = ms_per_call(fs["grouped"], args.repeats)
        print(
            f"{name:14s} {t['vmap']:8.3f} {t['grouped']:8.3f} {t['no mkldnn']:10.3f} {t['loop']:8.3f} "
            f"{t['unfold-bmm']:11.3f}"
        )


if __name__ == "__main__":
    main()
