"""Writes the paper-setting configs in ``configs/`` (run it after changing a setting; a test checks they are in sync).

Each config is a complete, standalone LightningCLI file, so that ``python cli.py fit --config configs/<name>.yaml`` is
all a user types; any key can still be overridden on the command line. A method's class path and default
hyper-parameters come from the registry, :data:`fl_lightning.methods.METHODS`, and the signature of its class; this
script holds only the settings (data, federation, network, local optimizer) and the papers' own choices.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Any

import yaml

import fl_lightning
from fl_lightning.methods import METHODS
from fl_lightning.module import FedAvg

CONFIGS = Path(__file__).resolve().parent.parent / "configs"

#: Constructor arguments that are not written into a config: SCAFFOLD's ``server_lr`` (the federation's server
#: optimizer owns the server learning rate), FedLMD's ``teacher_free`` (FedLMD-Tf is its own class) and MOON's
#: ``proj_dim`` (the projection head's size, architecture rather than a hyper-parameter of the papers' tables).
#: Arguments whose default is ``None`` (an option switched off) are left out too.
NOT_WRITTEN = frozenset({"server_lr", "teacher_free", "proj_dim"})

#: Defaults that depend on the data (``None`` in the signature), written out with their value for the shipped
#: settings, all of 10 classes: FedSSD's M_max (its paper's 0.01 for 10 classes).
TEN_CLASS_DEFAULTS: dict[tuple[str, str], Any] = {("fedssd", "m_max"): 0.01}

#: Registered methods without paper-setting configs (use them with ``--model <Name>`` on any config).
NO_CONFIGS: tuple[str, ...] = ()


def class_path(cls: type) -> str:
    """``fl_lightning.<Name>`` for a class the package exports, else ``<module>.<Name>``."""
    if getattr(fl_lightning, cls.__name__, None) is cls:
        return f"fl_lightning.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def method_defaults(cls: type[FedAvg]) -> dict[str, Any]:
    """A method's own hyper-parameters and their defaults, in signature order, from its class.

    FedAvg's arguments (network and local optimizer) are the setting's; :data:`NOT_WRITTEN` and ``None`` defaults
    are left out, except those :data:`TEN_CLASS_DEFAULTS` resolves.
    """
    base = inspect.signature(FedAvg).parameters
    defaults = {
        name: TEN_CLASS_DEFAULTS.get((cls.method_name, name), p.default)
        for name, p in inspect.signature(cls).parameters.items()
        if name not in base
        and name not in NOT_WRITTEN
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and p.default is not p.empty
    }
    return {name: value for name, value in defaults.items() if value is not None}


#: Adaptive server optimizers (Reddi et al., "Adaptive Federated Optimization", ICLR 2021) on FedAvg clients. τ = 1e-3
#: and β1 = 0.9, β2 = 0.99 as in the paper; η from the paper's grid (powers of 10^0.5, here 0.003-0.1) by a 20-round
#: probe on shard 2, seed 0 (scripts/server_lr_probe.sh; README "Server optimizers").
SERVER_OPTIMIZERS = {
    "fedadam": ("FedAdam", {"lr": 0.01, "beta1": 0.9, "beta2": 0.99, "tau": 0.001}, "η = 0.01"),
    "fedyogi": ("FedYogi", {"lr": 0.01, "beta1": 0.9, "beta2": 0.99, "tau": 0.001}, "η = 0.01"),
    "fedadagrad": ("FedAdagrad", {"lr": 0.03, "beta1": 0.0, "tau": 0.001}, "η = 0.03"),
}

# The baselines the papers compare against (docs/source/methods.md, "Baselines"): configs in the FedNTD setting
# (Fashion-MNIST and CIFAR-10) and FedSSD's CIFAR-10 setting.
BASELINES = ("scaffold", "feddyn", "moon", "fednova", "fedcurv")

# NIID-Bench on Fashion-MNIST (FedSSD's [48]): 10 clients, all participate, 50 rounds, E=10, batch 64, LeNet.
NIID_BENCH_PARTITIONS = {
    "iid": {"partition": "iid"},
    "dir05": {"partition": "dirichlet", "alpha": 0.5},
    "c1": {"partition": "classes_per_client", "classes_per_client": 1},
    "c2": {"partition": "classes_per_client", "classes_per_client": 2},
    "c3": {"partition": "classes_per_client", "classes_per_client": 3},
}

# FedNTD-paper setting on Fashion-MNIST: 100 clients, ratio 0.1, E=5, batch 50, decay 0.99, LeNet (CPU-friendly).
NTD_PARTITIONS = {
    "shard2": {"partition": "shard", "shards_per_client": 2},
    "lda01": {"partition": "dirichlet", "alpha": 0.1, "min_client_size": 10},
}

FEDKA_NOTE = (
    "\n# With the paper's defaults FedKA diverges in this setting (round 30; see the README's FedKA section)."
    "\n# Add --model.init_args.clip_grad_norm 10 (not in the paper) to keep it finite."
)


def _ntd_setting(part: dict[str, Any], **federation: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The FedNTD-paper setting's data and federation sections for one partition, plus ``federation`` extras."""
    data = {"dataset": "fashion_mnist", "num_clients": 100, "batch_size": 50, "holdout_per_class": 64, **part}
    fed = {"rounds": 100, "sample_ratio": 0.1, "local_epochs": 5, "lr_decay": 0.99, **federation}
    return data, fed


def _config(
    name: str,
    method: str,
    net: str,
    data: dict[str, Any],
    fed: dict[str, Any],
    header: str,
    lr: float = 0.01,
    method_args: dict[str, Any] | None = None,
) -> tuple[str, str]:
    cls = METHODS[method]
    init_args = {
        "net": net,
        "lr": lr,
        "momentum": 0.9,
        "weight_decay": 1.0e-5,
        **method_defaults(cls),
        **(method_args or {}),
    }
    body = {
        "seed_everything": 0,
        "trainer": {"default_root_dir": f"runs/{name}", "accelerator": "auto"},
        "model": {"class_path": class_path(cls), "init_args": init_args},
        "data": data,
        "federation": fed,
    }
    text = f"# {header}\n" + yaml.safe_dump(body, sort_keys=False)
    return f"{name}.yaml", text


def all_configs() -> dict[str, str]:
    """File name -> YAML text of every generated config."""
    out: dict[str, str] = {}

    def add(item: tuple[str, str]) -> None:
        out[item[0]] = item[1]

    for tag, part in NIID_BENCH_PARTITIONS.items():
        data = {"dataset": "fashion_mnist", "num_clients": 10, "batch_size": 64, **part}
        fed = {"rounds": 50, "sample_ratio": 1.0, "local_epochs": 10}
        add(
            _config(
                f"fedavg_fmnist_niid_{tag}",
                "fedavg",
                "lenet",
                data,
                fed,
                f"NIID-Bench Fashion-MNIST, {tag}: FedAvg, 10 clients, 50 rounds, E=10, batch 64, LeNet.",
            )
        )

    for method in (m for m in METHODS if m not in NO_CONFIGS):
        for tag, part in NTD_PARTITIONS.items():
            data, fed = _ntd_setting(part)
            add(
                _config(
                    f"{method}_fmnist_{tag}",
                    method,
                    "lenet",
                    data,
                    fed,
                    f"FedNTD-paper setting on Fashion-MNIST, {tag}: {method}, 100 clients, ratio 0.1, E=5, "
                    "batch 50, decay 0.99, LeNet, 100 rounds (64 per class held out for the server, all methods)."
                    + (FEDKA_NOTE if method == "fedka" else ""),
                )
            )

    for name, (optimizer, args, eta) in SERVER_OPTIMIZERS.items():
        for tag, part in NTD_PARTITIONS.items():
            server = {"class_path": f"fl_lightning.core.server_optim.{optimizer}", "init_args": args}
            data, fed = _ntd_setting(part, server_optimizer=server)
            add(
                _config(
                    f"{name}_fmnist_{tag}",
                    "fedavg",
                    "lenet",
                    data,
                    fed,
                    f"{optimizer} (Reddi et al., Adaptive Federated Optimization, ICLR 2021) in the FedNTD-paper "
                    f"setting on Fashion-MNIST, {tag}: FedAvg clients, 100 clients, ratio 0.1, E=5, batch 50, decay "
                    f"0.99, LeNet, 100 rounds.\n# {eta}, τ = 1e-3: the best of η in (0.003, 0.01, 0.03, 0.1) in a "
                    "20-round probe on shard 2 (scripts/server_lr_probe.sh, README).",
                )
            )

    # FedAvgM (Hsu et al., 2019): server momentum β_s = 0.9 with server lr η_s = 0.1, so that the effective server step
    # η_s / (1 − β_s) is FedAvg's 1.
    for tag, part in NTD_PARTITIONS.items():
        data, fed = _ntd_setting(part, server_lr=0.1, server_momentum=0.9)
        add(
            _config(
                f"fedavgm_fmnist_{tag}",
                "fedavg",
                "lenet",
                data,
                fed,
                f"FedAvgM (Hsu et al., 2019, arXiv:1909.06335) in the FedNTD-paper setting on Fashion-MNIST, {tag}: "
                "FedAvg clients, 100 clients, ratio 0.1, E=5, batch 50, decay 0.99, LeNet, 100 rounds.\n# Server "
                "momentum beta_s = 0.9 with server lr eta_s = 0.1: the effective server step eta_s / (1 - beta_s) = 1 "
                "is FedAvg's, which Hsu et al. find\n# works best when held fixed; no probe was run for it.",
            )
        )

    # FedLMD §5.4: FedLMD-Tf for the first half, then FedLMD.
    data = {
        "dataset": "fashion_mnist",
        "num_clients": 100,
        "batch_size": 50,
        "holdout_per_class": 64,
        **NTD_PARTITIONS["shard2"],
    }
    add(
        _config(
            "fedlmd_tf_switch_fmnist_shard2",
            "fedlmd_tf",
            "lenet",
            data,
            {"rounds": 100, "sample_ratio": 0.1, "local_epochs": 5, "lr_decay": 0.99},
            "FedLMD-Tf until round 50, then FedLMD (FedLMD paper §5.4), FedNTD-paper setting on Fashion-MNIST.",
            method_args={"switch_round": 50},
        )
    )

    # The seed papers' own settings, transposed to Fashion-MNIST (results/claims/paper_claims.yaml lists the
    # differences): FedSSD's (and FedCAD's numbers in FedSSD's Table I): 10 clients, Dir(0.5), all clients every round,
    # E=10, batch 64, LeNet, 100 rounds, 64 per class held out for the server (for FedAvg too, so that runs pair).
    for method in ("fedavg", "fedssd", "fedcad"):
        data = {
            "dataset": "fashion_mnist",
            "num_clients": 10,
            "batch_size": 64,
            "partition": "dirichlet",
            "alpha": 0.5,
            "holdout_per_class": 64,
        }
        add(
            _config(
                f"{method}_fmnist_dir05",
                method,
                "lenet",
                data,
                {"rounds": 100, "sample_ratio": 1.0, "local_epochs": 10, "eval_local": True},
                f"FedSSD-paper setting (Table I) on Fashion-MNIST: {method}, 10 clients, Dir(0.5), all clients each "
                "round, E=10, batch 64, LeNet, 100 rounds.\n# eval_local: AccL, the local models' mean test accuracy "
                "(FedSSD Fig. 7, FedCAD Fig. 1), at one test pass per client.",
            )
        )
    # FedKA's: 10 clients, Dir(0.1), all clients, E=10, batch 128, its t-CNN, 100 rounds, one shared sample per class.
    for method in ("fedavg", "fedka"):
        data = {
            "dataset": "fashion_mnist",
            "num_clients": 10,
            "batch_size": 128,
            "partition": "dirichlet",
            "alpha": 0.1,
            "holdout_per_class": 1,
        }
        add(
            _config(
                f"{method}_fmnist_dir01",
                method,
                "tcnn",
                data,
                {"rounds": 100, "sample_ratio": 1.0, "local_epochs": 10, "eval_local": True},
                f"FedKA-paper setting (Table 1) on Fashion-MNIST: {method}, 10 clients, Dir(0.1), all clients each "
                "round, E=10, batch 128, t-CNN, 100 rounds.\n# eval_local: the local models' forgetting degree (FedKA "
                "Figs. 3 and 6) and AccL, at one test pass per client.",
            )
        )

    # Paper headline settings on CIFAR-10 (need the data under ./data or --data.root).
    cifar_aug = {"crop_padding": 4, "hflip": True}
    # LDA α = 0.05, where the FedNTD/FedLMD papers report SCAFFOLD and FedNova as "Failed" (and FedLMD its headline
    # gain). min_client_size 1: on Fashion-MNIST, 100 draws of Dir(0.05) over 100 clients never give every client 2
    # samples with seed 1.
    for method in ("fedavg", "fedntd", "fedlmd", "fedlmd_tf", "scaffold", "fednova"):
        data = {
            "dataset": "fashion_mnist",
            "num_clients": 100,
            "batch_size": 50,
            "holdout_per_class": 64,
            "partition": "dirichlet",
            "alpha": 0.05,
            "min_client_size": 1,
        }
        add(
            _config(
                f"{method}_fmnist_lda005",
                method,
                "lenet",
                data,
                {"rounds": 100, "sample_ratio": 0.1, "local_epochs": 5, "lr_decay": 0.99},
                f"FedNTD-paper setting on Fashion-MNIST, LDA alpha=0.05 (the papers' 'Failed' case): {method}, "
                "100 clients, ratio 0.1, E=5, batch 50, decay 0.99, LeNet, 100 rounds.",
            )
        )

    for method in ("fedavg", "fedssd", *BASELINES):
        data = {
            "dataset": "cifar10",
            "num_clients": 10,
            "batch_size": 64,
            "partition": "dirichlet",
            "alpha": 0.5,
            "holdout_per_class": 64,
        }
        fed = {"rounds": 100, "sample_ratio": 1.0, "local_epochs": 10}
        add(
            _config(
                f"{method}_cifar10_dir05",
                method,
                "lenet",
                data,
                fed,
                f"FedSSD paper CIFAR-10 setting: {method}, 10 clients, Dir(0.5), E=10, batch 64, LeNet, 100 rounds.",
            )
        )
    data = {
        "dataset": "cifar10",
        "num_clients": 10,
        "batch_size": 64,
        "partition": "dirichlet",
        "alpha": 0.5,
        "holdout_per_class": 64,
    }
    add(
        _config(
            "fedcad_cifar10_dir05",
            "fedcad",
            "lenet",
            data,
            {"rounds": 100, "sample_ratio": 1.0, "local_epochs": 5},
            "FedCAD paper CIFAR-10 setting: 10 clients, Dir(0.5), E=5, batch 64, LeNet, 100 rounds.",
        )
    )
    for method in ("fedavg", "fedntd", "fedlmd", "fedlmd_tf", *BASELINES):
        data = {
            "dataset": "cifar10",
            "num_clients": 100,
            "batch_size": 50,
            "partition": "shard",
            "shards_per_client": 2,
            "cutout": 16 if method == "fedntd" else 0,
            **cifar_aug,
        }
        fed = {"rounds": 200, "sample_ratio": 0.1, "local_epochs": 5, "lr_decay": 0.99}
        add(
            _config(
                f"{method}_cifar10_shard2",
                method,
                "cnn",
                data,
                fed,
                f"FedNTD/FedLMD paper CIFAR-10 setting: {method}, 100 clients, shard(2), ratio 0.1, E=5, batch 50, "
                "2-conv CNN, decay 0.99, 200 rounds, crop+flip augmentation"
                + (" and Cutout(16), as FedNTD's paper." if method == "fedntd" else "."),
            )
        )
    for method in ("fedavg", "fedka"):
        data = {
            "dataset": "cifar10",
            "num_clients": 10,
            "batch_size": 128,
            "partition": "dirichlet",
            "alpha": 0.1,
            "holdout_per_class": 1,
        }
        fed = {"rounds": 100, "sample_ratio": 1.0, "local_epochs": 10}
        add(
            _config(
                f"{method}_cifar10_dir01",
                method,
                "tcnn",
                data,
                fed,
                f"FedKA paper CIFAR-10 setting: {method}, 10 clients, Dir(0.1), E=10, batch 128, t-CNN, 100 rounds.",
            )
        )
    return out


def main() -> int:
    """Write every config."""
    CONFIGS.mkdir(exist_ok=True)
    for name, text in all_configs().items():
        (CONFIGS / name).write_text(text, encoding="utf-8")
    print(f"wrote {len(all_configs())} configs to {CONFIGS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
