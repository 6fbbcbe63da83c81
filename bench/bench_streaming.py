"""Seconds per round with the training and test data streamed from a dataset, against the same data in memory.

Workload: the FedNTD-paper FedAvg setting on Fashion-MNIST (100 clients, sharding s=2, ratio 0.1, E=5, batch 50,
``lenet``, global evaluation on the 10k test images every round). The streamed side reads the decompressed IDX files
through a memory map, one item per ``__getitem__`` (a dataset that is not a tensor pair), via a ``DataLoader``; the
in-memory side holds the same images as uint8 tensors. Both runs use the same partition, clients and batch order and
end with the same global weights (checked). Prints the median seconds per round over the measured rounds (after one
warm-up round), the set-up time of each and whether the weights agree.

Usage: ``OMP_NUM_THREADS=2 python bench/bench_streaming.py [--rounds 3] [--workers 0] [--data-only]``
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _setting import bare_trainer  # bench/ is on sys.path when run as a script
from torch.utils.data import Dataset

from fl_lightning import FedAvg, FederatedDataModule, Federation
from fl_lightning.core.batches import RoundBatches
from fl_lightning.core.datasets import read_idx

FMNIST = Path("/usr/share/datasets/fashion-mnist")  # Debian's dataset-fashion-mnist


class IdxImages(Dataset):
    """Images of an (uncompressed) IDX file read one at a time through a memory map; labels held in memory."""

    def __init__(self, images: Path, labels: Path) -> None:
        self.targets = read_idx(labels).astype(np.int64)
        self.images = np.memmap(images, dtype=np.uint8, mode="r", offset=16).reshape(len(self.targets), 28, 28)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.from_numpy(np.array(self.images[i])[None]), int(self.targets[i])


def _gunzip(src: Path, dst: Path) -> Path:
    with gzip.open(src, "rb") as f, open(dst, "wb") as out:
        shutil.copyfileobj(f, out)
    return dst


def setup_seconds(dm: FederatedDataModule) -> float:
    """Seconds of the datamodule's set-up (holdout, partition, normalisation statistics: one pass over the data)."""
    start = time.perf_counter()
    dm.setup("fit")
    return time.perf_counter() - start


def run(dm: FederatedDataModule, rounds: int, root: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Per-round seconds and final global weights of a federation on ``dm``."""
    torch.manual_seed(0)
    model = FedAvg(net="lenet", num_classes=10, in_channels=1, image_size=28, lr=0.01, weight_decay=1e-5)
    fed = Federation(rounds=rounds, sample_ratio=0.1, local_epochs=5, lr_decay=0.99, plots=False)
    bare_trainer(root, fed).fit(model, datamodule=dm)
    return [row["round_seconds"] for row in fed.history], model.state_dict()


def data_seconds(dm: FederatedDataModule, fed: Federation, repeats: int = 3) -> float:
    """Seconds to read one round's data without training: the sampled clients' local batches (all epochs) and the
    test set (best of ``repeats``). A client's whole data (``ClientContext.x``) is read only by methods that use it."""
    fed.dm = dm
    plan = fed.plan(0)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for batches in RoundBatches(
            dm.train_x if dm.train_x is not None else dm._train_reader,
            dm.train_y,
            dm.client_indices,
            plan,
            dm.batch_size,
            dm.drop_last,
            dm.seed,
        ):
            for _ in batches:
                pass
        for _ in dm.test_batches():
            pass
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per run; the first is warm-up")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers of the streamed run")
    parser.add_argument("--data-only", action="store_true", help="only time reading one round's data, no training")
    args = parser.parse_args()
    opts = dict(partition="shard", shards_per_client=2, num_clients=100, batch_size=50)
    with tempfile.TemporaryDirectory() as tmp:
        files = {
            name: _gunzip(FMNIST / f"{name}.gz", Path(tmp) / name)
            for name in (
                "train-images-idx3-ubyte",
                "train-labels-idx1-ubyte",
                "t10k-images-idx3-ubyte",
                "t10k-labels-idx1-ubyte",
            )
        }
        train = IdxImages(files["train-images-idx3-ubyte"], files["train-labels-idx1-ubyte"])
        test = IdxImages(files["t10k-images-idx3-ubyte"], files["t10k-labels-idx1-ubyte"])
        in_memory = FederatedDataModule.from_tensors(
            torch.from_numpy(np.array(train.images))[:, None],
            torch.from_numpy(train.targets),
            torch.from_numpy(np.array(test.images))[:, None],
            torch.from_numpy(test.targets),
            **opts,
        )
        streamed = FederatedDataModule.from_datasets(train, test, num_workers=args.workers, **opts)
        probe = Federation(rounds=1, sample_ratio=0.1, local_epochs=5)
        mem_setup, str_setup = setup_seconds(in_memory), setup_seconds(streamed)
        mem_data, str_data = data_seconds(in_memory, probe), data_seconds(streamed, probe)
        print(f"reading one round's data: in memory {mem_data:.2f} s, streamed {str_data:.2f} s")
        if args.data_only:
            return
        mem_rounds, mem_w = run(in_memory, args.rounds, f"{tmp}/mem")
        str_rounds, str_w = run(streamed, args.rounds, f"{tmp}/str")
    same = all(torch.equal(mem_w[k], str_w[k]) for k in mem_w)
    mem, stream = statistics.median(mem_rounds[1:]), statistics.median(str_rounds[1:])
    print(f"in memory: {mem:.2f} s/round (rounds {[round(s, 2) for s in mem_rounds]}), set-up {mem_setup:.1f} s")
    print(
        f"streamed ({args.workers} workers): {stream:.2f} s/round (rounds {[round(s, 2) for s in str_rounds]}), "
        f"set-up {str_setup:.1f} s"
    )
    print(f"ratio streamed/in-memory {stream / mem:.2f}x; same global weights: {same}")


if __name__ == "__main__":
    main()
