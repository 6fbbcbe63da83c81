"""How large is each method's regulariser next to the cross-entropy once a client has drifted from the global model?

Loads a global model (a FedAvg checkpoint, or trains one for ``--rounds`` rounds), lets a few clients train locally with
plain cross-entropy for ``--epochs`` epochs (FedAvg's drift), and prints, averaged over their data, the CE and each
method's added term with its paper default weight. A term that stays orders of magnitude below CE cannot change what a
client learns, whatever it is meant to do.

Usage: ``python bench/loss_terms.py [--ckpt runs/.../last.ckpt] [--partition shard]``
"""

from __future__ import annotations

import argparse
import copy

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from _setting import bare_trainer, fmnist_ntd_datamodule  # bench/ is on sys.path when run as a script

from fl_lightning import FedAvg, Federation
from fl_lightning.core import losses as Lf
from fl_lightning.methods import _first_per_class


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", default=None, help="a FedAvg checkpoint of this setting (else train one)")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--partition", default="shard", choices=["shard", "dirichlet"])
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    L.seed_everything(0, verbose=False)
    dm = fmnist_ntd_datamodule(args.partition)
    dm.setup("fit")
    model = FedAvg(net="lenet", num_classes=10, in_channels=1, image_size=28)
    if args.ckpt:
        model.load_state_dict(torch.load(args.ckpt, map_location="cpu", weights_only=False)["state_dict"])
    else:
        fed = Federation(rounds=args.rounds, sample_ratio=0.1, local_epochs=5, lr_decay=0.99, plots=False)
        bare_trainer("/tmp/loss_terms", fed).fit(model, datamodule=dm)
    net_g = model.net.eval()
    t = dm.transform
    assert t is not None
    with torch.no_grad():
        keep = _first_per_class(dm.aux_y, 64)
        preds = net_g(t(dm.aux_x[keep], False)).argmax(1)
        credibility = Lf.credibility_matrix(preds, dm.aux_y[keep], 10)
        shared = _first_per_class(dm.aux_y, 1)
    rows = []
    for client in range(args.clients):
        x, y = dm.client_data(client)
        xn = t(x, False)
        local = copy.deepcopy(net_g).train()
        opt = torch.optim.SGD(local.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-5)
        for _ in range(args.epochs):
            for idx in torch.randperm(len(y)).split(50):
                opt.zero_grad()
                F.cross_entropy(local(xn[idx]), y[idx]).backward()
                opt.step()
        local.eval()
        with torch.no_grad():
            z, zg = local(xn), net_g(xn)
            counts = torch.bincount(y, minlength=10)
            majority = Lf.majority_mask(counts)
            missing, non_dom, dom = Lf.ka_class_groups(counts, 1 / 20)
            anchor_idx = torch.isin(dm.aux_y[shared], torch.nonzero(missing).flatten())
            ax = t(dm.aux_x[shared][anchor_idx][:10], False)
            alpha = Lf.cad_class_weights(zg, y, 10)
            ce = F.cross_entropy(z, y).item()
            rows.append(
                {
                    "CE": ce,
                    "KD 0.3*tau^2 KL": 0.3 * Lf.kd_loss(z, zg).item(),
                    "FedNTD 1*L_NTD": Lf.ntd_loss(z, zg, y).item(),
                    "FedLMD 1*L_LMD": Lf.lmd_loss(z, zg, y, majority).item(),
                    "FedLMD-Tf 1*L_LMD-Tf": Lf.lmd_tf_loss(z, y, majority).item(),
                    "FedSSD L_SSD (M_max 0.01)": Lf.ssd_loss(z, zg, Lf.ssd_weights(zg, y, credibility, 0.01)).item(),
                    "FedSSD mean M": Lf.ssd_weights(zg, y, credibility, 0.01).mean().item(),
                    "FedCAD loss - CE": Lf.cad_loss(z, zg, y, alpha).item() - ce,
                    "FedKA 0.1*L_KA": 0.1 * Lf.ka_loss(local(ax), net_g(ax), dom).item() if len(ax) else 0.0,
                    "global acc on client": (zg.argmax(1) == y).float().mean().item(),
                }
            )
    print(f"{args.clients} clients, {args.epochs} local epochs of plain CE from the global model ({args.partition})")
    for key in rows[0]:
        print(f"  {key:28s} {np.mean([r[key] for r in rows]):.6f}")


if __name__ == "__main__":
    main()
