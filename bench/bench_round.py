"""Seconds per round of fl_lightning against a minimal plain-PyTorch loop doing the same work.

Workload: the FedNTD-paper FedAvg setting on Fashion-MNIST (100 clients, sharding s=2, ratio 0.1, E=5, batch 50,
SGD lr 0.01 momentum 0.9 wd 1e-5, decay 0.99/round, ``lenet``), global evaluation on the 10k test images every round.
Both sides use the same partition, the same sampled clients and the same batch order, in the same process, and
alternate so that machine noise hits both. Prints per-round seconds (median over measured rounds) and their ratio.

Usage: ``python bench/bench_round.py [--rounds 6] [--repeats 2] [--dataset fashion_mnist]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from _setting import bare_trainer  # bench/ is on sys.path when run as a script

from fl_lightning import FedAvg, FederatedDataModule, Federation
from fl_lightning.core.aggregation import StateAccumulator, aggregation_weights
from fl_lightning.core.batches import RoundBatches
from fl_lightning.core.models import build_model

SETTING = dict(num_clients=100, sample_ratio=0.1, local_epochs=5, batch_size=50, lr=0.01, momentum=0.9, wd=1e-5)


def run_project(dataset: str, rounds: int, seed: int) -> list[float]:
    """Round seconds of a Trainer.fit federation (the first round is warm-up and dropped)."""
    dm = FederatedDataModule(
        dataset,
        partition="shard",
        shards_per_client=2,
        num_clients=SETTING["num_clients"],
        batch_size=SETTING["batch_size"],
        seed=seed,
    )
    model = FedAvg(
        net="lenet",
        num_classes=dm.num_classes,
        in_channels=dm.in_channels,
        image_size=dm.image_size,
        lr=SETTING["lr"],
        momentum=SETTING["momentum"],
        weight_decay=SETTING["wd"],
    )
    fed = Federation(
        rounds=rounds + 1,
        sample_ratio=SETTING["sample_ratio"],
        local_epochs=SETTING["local_epochs"],
        lr_decay=0.99,
        seed=seed,
        plots=False,
    )
    with tempfile.TemporaryDirectory() as tmp:
        bare_trainer(tmp, fed, max_epochs=rounds + 1).fit(model, datamodule=dm)
    return [row["round_seconds"] for row in fed.recorder.history[1:]]


def run_plain(dataset: str, rounds: int, seed: int) -> list[float]:
    """Round seconds of a hand-written loop: same data, clients, batches, optimizer, averaging and evaluation."""
    dm = FederatedDataModule(
        dataset,
        partition="shard",
        shards_per_client=2,
        num_clients=SETTING["num_clients"],
        batch_size=SETTING["batch_size"],
        seed=seed,
    )
    dm.setup("fit")
    planner = Federation(
        rounds=rounds + 1,
        sample_ratio=SETTING["sample_ratio"],
        local_epochs=SETTING["local_epochs"],
        lr_decay=0.99,
        seed=seed,
    )
    planner.dm = dm
    torch.manual_seed(seed)
    net = build_model("lenet", dm.in_channels, dm.image_size, dm.num_classes)
    transform = dm.transform
    assert transform is not None and dm.data is not None
    test_x, test_y = dm.data.test_x, dm.data.test_y
    times = []
    for r in range(rounds + 1):
        start = time.perf_counter()
        plan = planner.plan(r)
        global_state = {k: v.clone() for k, v in net.state_dict().items()}
        weights = aggregation_weights([dm.client_sizes[c] for c in plan.clients])
        acc = StateAccumulator()
        lr = SETTING["lr"] * plan.lr_scale
        batches = RoundBatches(dm.train_x, dm.train_y, dm.client_indices, plan, dm.batch_size, False, seed).batches()
        for slot, steps in enumerate(plan.steps):
            net.load_state_dict(global_state)
            opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=SETTING["momentum"], weight_decay=SETTING["wd"])
            net.train()
            for _ in range(steps):
                x, y = next(batches)
                loss = F.cross_entropy(net(transform(x, True)), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            acc.add(net.state_dict(), weights[slot])
        net.load_state_dict(acc.result({k: v.dtype for k, v in global_state.items()}))
        net.eval()
        correct = 0
        with torch.no_grad():
            for s in range(0, len(test_y), dm.eval_batch_size):
                logits = net(transform(test_x[s : s + dm.eval_batch_size], False))
                correct += int((logits.argmax(1) == test_y[s : s + dm.eval_batch_size]).sum())
        times.append(time.perf_counter() - start)
    return times[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="fashion_mnist")
    parser.add_argument("--rounds", type=int, default=6, help="measured rounds per repeat (plus one warm-up)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, lightning {L.__version__}")
    project, plain = [], []
    for rep in range(args.repeats):
        plain += run_plain(args.dataset, args.rounds, args.seed)
        project += run_project(args.dataset, args.rounds, args.seed)
        print(
            f"repeat {rep + 1}: plain {statistics.median(plain):.3f} s/round, "
            f"fl_lightning {statistics.median(project):.3f} s/round"
        )
    p, q = statistics.median(project), statistics.median(plain)
    print("=" * 72)
    print(f"workload: FedAvg, {args.dataset}, 100 clients, shard(2), ratio 0.1, E=5, batch 50, lenet, CPU")
    print(f"plain PyTorch loop : {q:.3f} s/round (median of {len(plain)} rounds)")
    print(f"fl_lightning       : {p:.3f} s/round (median of {len(project)} rounds)")
    print(f"ratio              : {p / q:.3f}x  (target <= 1.10x)")
    if args.json:
        args.json.write_text(json.dumps({"plain_s": q, "project_s": p, "ratio": p / q}, indent=2))


if __name__ == "__main__":
    main()
