"""Where a batched round's host work goes: the operator calls a round dispatches outside its built step.

On a GPU a recorded step is one replay; what is left of a round is the work around it (gathering batches, loading the
stack, checking and averaging the results), one Python call and mostly one kernel launch per operator. This runs a
``bench_engines.py`` workload on the CPU with ``step_capture="static"``, counts every operator a measured round
dispatches (its evaluation included) except those inside the built step, and prints them by operator and by the
line of fl_lightning that called them (views such as ``select`` and ``slice`` launch no kernel).

Usage: ``python bench/round_ops.py [--workload fmnist_ntd] [--rounds 2] [--top 15]``
"""

from __future__ import annotations

import argparse
import collections
import traceback
from typing import Any

import lightning as L
from bench_engines import BUILDERS, fit  # bench/ is on sys.path when run as a script
from torch.utils._python_dispatch import TorchDispatchMode

import fl_lightning.core.step_capture as step_capture


class OutsideStep(TorchDispatchMode):
    """Counts operators while ``on``, except inside a built step's call."""

    def __init__(self) -> None:
        super().__init__()
        self.on = False
        self.inside = False
        self.ops: collections.Counter[str] = collections.Counter()
        self.lines: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if self.on and not self.inside:
            self.ops[str(func)] += 1
            ours = [f for f in traceback.extract_stack(limit=12) if "/fl_lightning/" in f.filename]
            if ours:
                self.lines[f"{ours[-1].filename.split('/fl_lightning/')[-1]}:{ours[-1].lineno}"] += 1
        return func(*args, **(kwargs or {}))


class LastRound(L.Callback):
    """Switches the counter on for the fit's last round."""

    def __init__(self, mode: OutsideStep, rounds: int) -> None:
        self.mode, self.last = mode, rounds - 1

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.mode.on = trainer.current_epoch == self.last

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.mode.on = False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="fmnist_ntd", choices=sorted(BUILDERS))
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the fit; the last one is counted")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    mode = OutsideStep()
    call = step_capture.CapturedStep.__call__

    def counted_apart(self: step_capture.CapturedStep) -> None:
        mode.inside = True
        try:
            call(self)
        finally:
            mode.inside = False

    step_capture.CapturedStep.__call__ = counted_apart  # type: ignore[method-assign]
    work = BUILDERS[args.workload]()
    counter = LastRound(mode, args.rounds)
    with mode:
        fit(work, "batched", None, args.rounds, {"accelerator": "cpu"}, lambda fed: [counter], "static")
    print(f"{args.workload}: {sum(mode.ops.values()):,d} operator calls in round {args.rounds} outside the built step")
    for title, counts in (("by operator", mode.ops), ("by line of fl_lightning", mode.lines)):
        print(f"\n{title}:")
        for name, n in counts.most_common(args.top):
            print(f"  {n:>7,d}  {name}")


if __name__ == "__main__":
    main()
