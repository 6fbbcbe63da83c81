"""Is FedKA's divergence a defect or a step-size instability of its squared-logit anchor loss?

Runs FedKA in the Fashion-MNIST FedNTD-paper setting (LeNet, 100 clients, ratio 0.1, E = 5, batch 50) and records, at
every local step, the batch CE, L_KA and the largest curvature the anchor term alone puts on the classifier layer:

    λ_KA = (2β/|T|) · σ_max([H_T, 1])²,   H_T the anchors' penultimate features.

CE is convex in the classifier's weights and L_KA is a convex quadratic in them, so the loss's Hessian restricted to
that layer is at least λ_KA; heavy-ball SGD (lr, momentum ρ) on a quadratic diverges along a direction whose
curvature exceeds 2(1 + ρ)/lr. The script prints, per round, the largest ``lr·λ_KA / (2(1+ρ))`` (> 1 means that
step was outside the stable region), the largest L_KA and the global accuracy, and writes every step to a CSV.

With ``--replay CKPT --client K`` it instead replays one client's local update from a saved global model (e.g. the
round before a divergence), in the setting of the run that saved it (its data, network, E, batch, the round's lr; any
FedKA run, the t-CNN setting's too; ``--device cuda`` where there is a GPU), over several random batch orders, for a
grid of (β, lr, gradient clipping), and prints how often L_KA explodes: if halving lr (or clipping) removes what
β·L_KA at full lr does, the divergence is a step-size instability of the loss, not a wrong loss.

Usage: ``python bench/fedka_stability.py --rounds 30 --beta 0.1 --partition shard --out runs/fedka_stability``
       ``python bench/fedka_stability.py --replay runs/.../fedka/seed0/checkpoints/last.ckpt --client 16``
       ``python bench/fedka_stability.py --client 5 --device cuda --replay
       runs/compare/fmnist_fedka_setting/dir01/fedka/seed0/checkpoints/last.ckpt``
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from _setting import (
    bare_trainer,
    fmnist_ntd_datamodule,
    round_lr_scale,
    rounds_done,
    run_setting,
)  # bench/ is on sys.path
from torch import Tensor
from torch.func import functional_call, jacrev

from fl_lightning import Federation
from fl_lightning.core import losses as Lf
from fl_lightning.core.context import ClientContext
from fl_lightning.methods import FedKA, _first_per_class


class FedKAProbe(FedKA):
    """FedKA with the same loss, recording the anchor term's curvature and size at every local step."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rows: list[dict[str, float]] = []
        self._client = -1

    def on_client_start(self, client: ClientContext) -> None:
        super().on_client_start(client)
        self._client, self._lr, self._step = client.client, client.lr, 0

    def _anchor_curvature(self) -> float:
        assert self.anchor_x is not None and self.dominant is not None
        return anchor_curvature(self.net, self.anchor_x, self.dominant, self.beta)

    def client_loss(self, x: Tensor, y: Tensor) -> Tensor:
        ce = F.cross_entropy(self(x), y)
        if self.anchor_x is None:
            return ce
        assert self.dominant is not None and self.anchor_zg is not None
        h = self.net.features(self.anchor_x)
        ka = Lf.ka_loss(self.net.classifier(h), self.anchor_zg, self.dominant)
        lam_full = self._anchor_curvature()
        with torch.no_grad():
            h1 = torch.cat([h.float(), torch.ones(len(h), 1, device=h.device)], dim=1)
            finite = bool(torch.isfinite(h1).all())
            sigma = torch.linalg.matrix_norm(h1, ord=2).item() if finite else float("inf")
            lam = 2 * self.beta / len(h) * sigma**2
        rho = self.hparams.momentum
        self.rows.append(
            {
                "round": self.trainer.current_epoch + 1,
                "client": self._client,
                "step": self._step,
                "lr": self._lr,
                "ce": ce.item(),
                "l_ka": ka.item(),
                "anchors": len(h),
                "feature_norm_mean": h.float().norm(dim=1).mean().item(),
                "lambda_ka": lam,
                "stability_ratio": self._lr * lam / (2 * (1 + rho)),
                "lambda_ka_full": lam_full,
                "stability_ratio_full": self._lr * lam_full / (2 * (1 + rho)),
            }
        )
        self._step += 1
        return ce + self.beta * ka


def anchor_curvature(net: torch.nn.Module, anchor_x: Tensor, dominant: Tensor, beta: float) -> float:
    """Largest eigenvalue of β·L_KA's Gauss-Newton matrix (2β/|T|)·JᵀJ over all of ``net``'s parameters.

    J is the Jacobian of the anchors' non-dominant logits; the matrix is L_KA's exact Hessian where the local logits
    equal the teacher's (every client's first step) and its positive part elsewhere.
    """
    keep = ~dominant
    params = {k: v.detach() for k, v in net.named_parameters()}

    def logits(p: dict[str, Tensor]) -> Tensor:
        return functional_call(net, p, (anchor_x,))[:, keep]

    jac = torch.cat([j.flatten(2).flatten(0, 1) for j in jacrev(logits)(params).values()], dim=1)
    if not torch.isfinite(jac).all():
        return float("inf")
    top = torch.linalg.eigvalsh(jac @ jac.T)[-1].item()
    return 2 * beta / len(anchor_x) * top


def replay(ckpt: str, client: int, orders: int, device: torch.device) -> None:
    """Replay ``client``'s local update of the round after ``ckpt`` from the global model saved there.

    The setting (data, network, batch size, E, the round's lr, momentum, weight decay, γ, μ) is the run's own
    (:func:`run_setting`). The anchors are built here, apart from the module: the shared sample of each missing class
    and the first local sample of each non-dominant class, at most μ.
    """
    state, dm, hp, federation = run_setting(ckpt)
    replayed = rounds_done(state, federation) + 1
    epochs = int(federation.get("local_epochs", 1))
    lr = hp["lr"] * round_lr_scale(state, federation)
    glob = FedKA(**hp)
    glob.load_state_dict(state["state_dict"])
    net_g = glob.net.to(device).eval()
    t = dm.transform
    assert t is not None
    raw, y = dm.client_data(client)
    x, y = t(raw.to(device), False), y.to(device)
    counts = torch.as_tensor(dm.client_class_counts[client])
    missing, non_dom, dominant = Lf.ka_class_groups(counts, glob.gamma)
    shared = _first_per_class(dm.aux_y, 1)
    anchors = [dm.aux_x[shared][torch.isin(dm.aux_y[shared], torch.nonzero(missing).flatten())]]
    anchors += [raw[torch.nonzero(y.cpu() == c).flatten()[:1]] for c in torch.nonzero(non_dom).flatten()]
    ax = t(torch.cat(anchors)[: glob.mu].to(device), False)
    dominant = dominant.to(device)
    with torch.no_grad():
        azg = net_g(ax)
    beta0, batch, rho = glob.beta, dm.batch_size, glob.hparams.momentum
    ratio = lr * anchor_curvature(net_g, ax, dominant, beta0) / (2 * (1 + rho))
    print(
        f"round {replayed}, client {client}: {len(y)} samples, classes {torch.nonzero(counts).flatten().tolist()}, "
        f"{len(ax)} anchors; {hp.get('net')}, E = {epochs}, batch {batch}, lr {lr:.5f}, momentum {rho}, on {device}"
    )
    print(
        f"  global model: anchor logit norm {azg.norm(dim=1).mean():.2f}; step-0 stability ratio lr·λ/(2(1+ρ)) at "
        f"beta {beta0:g}: {ratio:.2f} (> 1: outside the stable region); {orders} batch orders each"
    )
    print("  beta     lr       clip  diverged  L_KA>100  median max L_KA  median final CE  median |g|  steps |g|>10")
    for beta, scale, clip in [
        (0.0, 1, None),
        (0.0, 0.5, None),
        (0.1, 1, None),
        (0.1, 0.75, None),
        (0.1, 0.5, None),
        (0.1, 0.25, None),
        (0.1, 1, 10.0),
        (0.03, 1, None),
        (0.01, 1, None),
        (0.001, 1, None),
    ]:
        peaks, finals, norms, diverged = [], [], [], 0
        for order in range(orders):
            torch.manual_seed(order)
            local = FedKA(**hp)
            local.net.load_state_dict(glob.net.state_dict())
            net = local.net.to(device).train()
            opt = torch.optim.SGD(net.parameters(), lr=lr * scale, momentum=rho, weight_decay=glob.hparams.weight_decay)
            peak, ce = 0.0, float("nan")
            for _ in range(epochs):
                for idx in torch.randperm(len(y)).split(batch):
                    idx = idx.to(device)
                    ce_t = F.cross_entropy(net(x[idx]), y[idx])
                    ka = Lf.ka_loss(net(ax), azg, dominant)
                    loss = ce_t + beta * ka
                    opt.zero_grad()
                    loss.backward()
                    norm = torch.nn.utils.clip_grad_norm_(net.parameters(), clip if clip is not None else math.inf)
                    norms.append(norm.item())
                    opt.step()
                    peak, ce = max(peak, ka.item()), ce_t.item()
            ok = all(torch.isfinite(p).all() for p in net.parameters()) and ce == ce
            diverged += not ok
            peaks.append(peak if ok else float("inf"))
            finals.append(ce if ok else float("inf"))
        big = sum(p > 100 for p in peaks)
        print(
            f"  {beta:<7g}  {lr * scale:.5f}  {clip if clip else '-':>4}  {diverged:4d}/{orders}  {big:5d}/{orders}"
            f"  {torch.tensor(peaks).median():15.4g}  {torch.tensor(finals).median():15.4g}"
            f"  {torch.tensor(norms).nan_to_num(math.inf).median():10.3g}"
            f"  {100 * sum(n > 10 for n in norms) / len(norms):10.1f}%",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--partition", default="shard", choices=["shard", "dirichlet"])
    parser.add_argument("--out", default="runs/fedka_stability")
    parser.add_argument("--replay", default=None, help="a FedKA checkpoint: replay one client's update from it")
    parser.add_argument("--client", type=int, default=16, help="the client to replay")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="where to replay")
    parser.add_argument("--orders", type=int, default=10, help="random batch orders per setting")
    args = parser.parse_args()
    L.seed_everything(0, verbose=False)
    if args.replay:
        replay(args.replay, args.client, args.orders, torch.device(args.device))
        return
    dm = fmnist_ntd_datamodule(args.partition)
    model = FedKAProbe(net="lenet", lr=args.lr, momentum=0.9, weight_decay=1e-5, beta=args.beta, mu=10)
    fed = Federation(rounds=args.rounds, sample_ratio=0.1, local_epochs=5, lr_decay=0.99, plots=False)
    out = Path(args.out)
    bare_trainer(out, fed, max_epochs=args.rounds).fit(
        model, datamodule=dm
    )  # a diverged run stops itself (status "diverged")
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "steps.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(model.rows[0]))
        writer.writeheader()
        writer.writerows(model.rows)
    acc = {int(h["round"]): h.get("global_acc", float("nan")) for h in fed.recorder.history}
    status = fed.recorder.status
    print(f"FedKA beta={args.beta} lr={args.lr} {args.partition}: status {status}; steps in {out / 'steps.csv'}")
    print("ratio = lr·λ/(2(1+ρ)): λ from the classifier layer only (cls) or from all parameters (full)")
    print("round  global_acc  max_ratio_cls  max_ratio_full  steps_full>1  max_L_KA   max_CE  mean_feat_norm")
    for r in sorted({int(row["round"]) for row in model.rows}):
        rows = [row for row in model.rows if row["round"] == r]
        print(
            f"{r:5d}  {acc.get(r, float('nan')):10.4f}  {max(x['stability_ratio'] for x in rows):13.2f}"
            f"  {max(x['stability_ratio_full'] for x in rows):14.2f}"
            f"  {sum(x['stability_ratio_full'] > 1 for x in rows):12d}  {max(x['l_ka'] for x in rows):9.2f}"
            f"  {max(x['ce'] for x in rows):7.2f}  {sum(x['feature_norm_mean'] for x in rows) / len(rows):14.2f}"
        )
    if fed.recorder.status == "diverged":
        last = model.rows[-1]["client"]
        rows = [row for row in model.rows if row["client"] == last and row["round"] == model.rows[-1]["round"]]
        print(f"the diverging client {last}'s first steps: step ratio_cls ratio_full L_KA CE feature_norm")
        for row in rows[:14]:
            print(
                f"  {row['step']:4d} {row['stability_ratio']:8.2f} {row['stability_ratio_full']:8.2f}"
                f" {row['l_ka']:12.4g} {row['ce']:10.4g} {row['feature_norm_mean']:10.4g}"
            )


if __name__ == "__main__":
    main()
