"""FedCAD's Fig. 2 probe: how much of the global model's knowledge one local update keeps, class by class.

From a saved global model (the paper's: FedAvg after 10 rounds, 10 clients, Dir(0.5), E = 10, batch 64), every client
trains once with each method (at its defaults, the shipped configs' values), in the run's own setting (its data,
network, E, batch, lr, momentum, weight decay), by the methods' own code: a one-round federation
(:class:`fl_lightning.Federation`) whose only client is the probed one, so that the round's global model is that
client's local model. Each local model is evaluated on the test set per
class. In the paper, its client holds almost nothing of classes 0-4; FedAvg's local model forgets them (class mean
45.1 % against the global model's 47.5 %), FedLSD's (``kd``) keeps 49.4 % and FedCAD's 59.2 %.

Writes, under ``--out``, per global model (its seed ``S``, which also fixes the partition):

- ``seedS/probe.csv``: per method and client, the client's class shares and the local model's per-class test accuracy;
- ``seedS/probe.txt``: the printed tables (the paper-like client as in the paper's figure, then every client);
- ``seedS/per_seed.csv``: per method, the local models' class-mean test accuracy (``probe_acc``) and its difference
  to FedAvg's local models from the same global model (``delta_probe_acc``), for the paper-like client (setting
  ``paper_client``) and averaged over the probed clients (``all_clients``);

and then ``report/per_seed.csv``, every ``seed*/per_seed.csv`` under ``--out`` in one table: the claims table's input
(``cli.py claims``, metric ``probe_acc``). Probing another seed's global model into the same ``--out`` adds its rows.

The paper-like client is the one with the most classes under 5 % of its data (ties: the least label entropy), as the
paper's (0, 0, 2, 3, 4 % for five classes).

Usage, per seed S: ``python cli.py fit --config configs/fedavg_fmnist_dir05.yaml --seed_everything S --federation.rounds
10 --trainer.default_root_dir runs/probe/fedavg_dir05_r10_seedS``, then ``python bench/local_probe.py --ckpt
runs/probe/fedavg_dir05_r10_seedS/checkpoints/last.ckpt --out results/fmnist_fedcad_probe``
"""

from __future__ import annotations

import argparse
import csv
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning as L
from _setting import (
    bare_trainer,
    round_lr_scale,
    rounds_done,
    run_seed,
    run_setting,
)  # bench/ is on sys.path when run as a script

from fl_lightning import FederatedDataModule, Federation
from fl_lightning.core.rounds import RoundPlan, client_steps
from fl_lightning.methods import METHODS, FedAvg

#: A class under this share of a client's data is one of its minority classes.
MINORITY = 0.05


class OneClient(Federation):
    """A federation whose every round trains one given client, at a given learning-rate scale."""

    def __init__(self, client: int, lr_scale: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.client, self.lr_scale = client, lr_scale

    def plan(self, round_idx: int) -> RoundPlan:
        assert self.dm is not None
        dm = self.dm
        steps = client_steps(dm.client_sizes[self.client], dm.batch_size, self.local_epochs, dm.drop_last)
        return RoundPlan(round_idx, (self.client,), (steps,), self.local_epochs, self.lr_scale)


def paper_like(shares: dict[int, list[float]]) -> int:
    """The client with the most classes under :data:`MINORITY` of its data; ties: the least label entropy."""

    def entropy(p: list[float]) -> float:
        return -sum(x * math.log(x) for x in p if x > 0)

    return min(shares, key=lambda k: (-sum(s < MINORITY for s in shares[k]), entropy(shares[k])))


def from_global_model(state: dict[str, Any], hp: dict[str, Any], method: str) -> FedAvg:
    """``method``'s module holding the checkpoint's network; exits with one line for a method with other weights."""
    module = METHODS[method](**hp)
    net = {k: v for k, v in state["state_dict"].items() if k.startswith("net.")}
    if set(module.state_dict()) != set(net):  # e.g. MOON's projection head: not in a FedAvg global model
        raise SystemExit(f"{method} has weights beside its network's; the probe starts only the network")
    module.load_state_dict(net)
    return module


def probe(
    setting: tuple[dict[str, Any], FederatedDataModule, dict[str, Any], dict[str, Any]], method: str, client: int
) -> list[float] | None:
    """Per-class test accuracy of ``client``'s local model after one local update with ``method`` (its defaults).

    ``setting``: the global model's run, as :func:`run_setting` returns it. ``None`` when the update diverged (a
    non-finite loss or weights): a result, not an error.
    """
    state, dm, hp, federation = setting
    module = from_global_model(state, hp, method)
    fed = OneClient(
        client,
        round_lr_scale(state, federation),
        rounds=1,
        local_epochs=int(federation.get("local_epochs", 1)),
        seed=run_seed(state),
        plots=False,
    )
    with tempfile.TemporaryDirectory() as tmp:
        bare_trainer(tmp, fed, max_epochs=1).fit(module, datamodule=dm)
    if fed.status == "diverged":
        return None
    if fed.status != "completed":
        raise SystemExit(f"{method}, client {client}: the local update ended {fed.status}")
    row = fed.history[-1]
    return [float(row[f"acc_class_{c}"]) for c in range(dm.num_classes)]


def mean(xs: list[float]) -> float:
    """Their mean; NaN for none."""
    return sum(xs) / len(xs) if xs else float("nan")


def class_mean(acc: list[float] | None) -> float | None:
    """The class-mean accuracy of per-class accuracies; ``None`` for a diverged update."""
    return None if acc is None else mean(acc)


PER_SEED_COLUMNS = ("setting", "method", "seed", "status", "probe_acc", "delta_probe_acc", "clients")


def per_seed_rows(
    acc: dict[tuple[str, int], list[float] | None], methods: list[str], clients: list[int], target: int, seed: int
) -> list[dict[str, Any]]:
    """``seedS/per_seed.csv``'s rows: per method, the paper-like client's and all clients' class-mean accuracy.

    A method whose update diverged on any client of a group is ``diverged`` there: its ``probe_acc`` is the mean over
    the clients that completed, and it has no ``delta_probe_acc``; nor has any method where FedAvg's diverged.
    """

    rows = []
    for setting, group in (("paper_client", [target]), ("all_clients", clients)):
        base = [v for k in group if (v := class_mean(acc[("fedavg", k)])) is not None]
        for m in methods:
            done = [v for k in group if (v := class_mean(acc[(m, k)])) is not None]
            completed, paired = len(done) == len(group), len(done) == len(base) == len(group)
            rows.append(
                {
                    "setting": setting,
                    "method": m,
                    "seed": seed,
                    "status": "completed" if completed else "diverged",
                    "probe_acc": round(mean(done), 5) if done else "",
                    "delta_probe_acc": round(mean(done) - mean(base), 5) if paired else "",
                    "clients": " ".join(map(str, group)),
                }
            )
    return rows


def write_per_seed(path: Path, rows: list[dict[str, Any]]) -> None:
    """``rows`` as a CSV with :data:`PER_SEED_COLUMNS`."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=PER_SEED_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def merge_per_seed(out: Path) -> Path:
    """``out/report/per_seed.csv``: the rows of every ``out/seed*/per_seed.csv``, by seed."""
    rows: list[dict[str, Any]] = []
    for path in sorted(out.glob("seed*/per_seed.csv"), key=lambda p: int(p.parent.name[4:])):
        with open(path, newline="") as f:
            rows += list(csv.DictReader(f))
    (out / "report").mkdir(parents=True, exist_ok=True)
    write_per_seed(out / "report" / "per_seed.csv", rows)
    return out / "report" / "per_seed.csv"


def main() -> None:
    """Probe every client with every method from ``--ckpt``'s global model; write and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", required=True, help="the global model: a run's checkpoints/last.ckpt")
    parser.add_argument("--methods", nargs="+", default=["fedavg", "kd", "fedcad"], choices=sorted(METHODS))
    parser.add_argument("--clients", type=int, nargs="*", default=None, help="clients to probe (default: all)")
    parser.add_argument("--out", default="runs/local_probe")
    args = parser.parse_args()
    if "fedavg" not in args.methods:
        parser.error("--methods must include fedavg: every method is paired against it")
    L.seed_everything(0, verbose=False)
    setting = run_setting(args.ckpt)  # one datamodule for every probe: its setup() runs once
    state, dm, hp, federation = setting
    for m in args.methods:  # a method the probe cannot start fails here, before any probe runs
        from_global_model(state, hp, m)
    num_classes = dm.num_classes
    clients = args.clients if args.clients else list(range(len(dm.client_sizes)))
    shares = {k: (dm.client_class_counts[k] / dm.client_class_counts[k].sum()).tolist() for k in clients}
    target = paper_like(shares)
    seed = run_seed(state)
    start = time.perf_counter()
    acc = {(m, k): probe(setting, m, k) for m in args.methods for k in clients}
    seconds = time.perf_counter() - start

    out = Path(args.out)
    here = out / f"seed{seed}"
    here.mkdir(parents=True, exist_ok=True)
    classes = range(num_classes)
    with open(here / "probe.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            ["method", "client", "status", "class_mean"]
            + [f"share_{c}" for c in classes]
            + [f"acc_class_{c}" for c in classes]
        )
        for (m, k), a in acc.items():
            blank = [""] * (num_classes + 1)
            status, cells = ("completed", [round(mean(a), 4), *a]) if a else ("diverged", blank)
            writer.writerow([m, k, status, cells[0], *(round(s, 4) for s in shares[k]), *cells[1:]])

    def cell(value: float | None, width: int) -> str:
        return f"{'diverged':>{width}}" if value is None else f"{100 * value:{width}.2f}"

    lines = [f"global model: {args.ckpt} (after round {rounds_done(state, federation)}, seed {seed})"]
    lines.append(f"{len(args.methods)} methods (their defaults) x {len(clients)} clients in {seconds:.0f} s")
    lines.append(f"client {target} (the paper-like one): class shares and per-class test accuracy (%), class mean:")
    lines.append(f"  {'':8}" + "".join(f"{c:>6}" for c in classes) + "    mean  minority  majority")
    minority = [c for c in classes if shares[target][c] < MINORITY]
    majority = [c for c in classes if c not in minority]
    lines.append(f"  {'data':8}" + "".join(f"{s:6.2f}" for s in shares[target]))
    for m in args.methods:
        if acc[(m, target)] is None:
            lines.append(f"  {m:8}  diverged")
            continue
        a = [100 * x for x in acc[(m, target)]]
        lines.append(
            f"  {m:8}" + "".join(f"{x:6.1f}" for x in a) + f"  {mean(a):6.2f}  {mean([a[c] for c in minority]):8.2f}"
            f"  {mean([a[c] for c in majority]):8.2f}"
        )
    lines.append(
        f"every client: its local model's class-mean test accuracy (%); minority: classes under {MINORITY:.0%}"
    )
    lines.append(f"  {'client':>6}  {'minority':>8}" + "".join(f"{m:>9}" for m in args.methods))
    for k in clients:
        n_min = sum(s < MINORITY for s in shares[k])
        lines.append(f"  {k:6d}  {n_min:8d}" + "".join(cell(class_mean(acc[(m, k)]), 9) for m in args.methods))
    done = {m: [v for k in clients if (v := class_mean(acc[(m, k)])) is not None] for m in args.methods}
    lines.append(f"  {'mean':>6}  {'':8}" + "".join(cell(mean(done[m]), 9) for m in args.methods))
    lines.append(f"  {'of':>6}  {'':8}" + "".join(f"{len(done[m]):>6}/{len(clients):<2}" for m in args.methods))
    text = "\n".join(lines)
    print(text)
    (here / "probe.txt").write_text(text + "\n")

    write_per_seed(here / "per_seed.csv", per_seed_rows(acc, args.methods, clients, target, seed))
    merged = merge_per_seed(out)
    print(f"[local_probe] {here / 'probe.csv'}, {here / 'probe.txt'}, {merged} ({len(list(out.glob('seed*')))} seeds)")


if __name__ == "__main__":
    main()
