"""A torchvision model federated over your own image folder (images of any size, e.g. not square).

The folder holds ``train/<class>/*.png`` and ``test/<class>/*.png`` (torchvision's ``ImageFolder`` layout). The images
are not loaded into memory: each round reads only its clients' files, through DataLoader workers::

    python examples/image_folder.py path/to/folder --size 48 64 --rounds 20 --workers 2
"""

from __future__ import annotations

import argparse
from pathlib import Path

import lightning as L
from torchvision import models, transforms
from torchvision.datasets import ImageFolder

from fl_lightning import FederatedDataModule, Federation
from fl_lightning.methods import FedNTD


def main(
    folder: str,
    size: tuple[int, int] = (48, 64),
    rounds: int = 20,
    num_clients: int = 4,
    local_epochs: int = 2,
    workers: int = 0,
    arch: str = "resnet18",
    lr: float = 0.01,
    out: str = "runs/image_folder",
) -> float:
    """Final global test accuracy (a fraction) of FedNTD with the torchvision network ``arch`` on the images."""
    for split in ("train", "test"):
        if not (Path(folder) / split).is_dir():
            raise FileNotFoundError(f"{Path(folder) / split} is not a folder; give a folder holding {split}/<class>/")
    to_tensor = transforms.Compose([transforms.Resize(size), transforms.PILToTensor()])  # uint8 [3, H, W]
    train = ImageFolder(str(Path(folder) / "train"), transform=to_tensor)
    test = ImageFolder(str(Path(folder) / "test"), transform=to_tensor)  # its classes must match (checked)
    dm = FederatedDataModule.from_datasets(
        train,
        test,
        name=Path(folder).name,
        partition="dirichlet",
        alpha=0.5,
        num_clients=num_clients,
        min_client_size=2,
        batch_size=16,
        hflip=True,
        num_workers=workers,
    )
    model = FedNTD(net=models.get_model(arch, num_classes=len(train.classes)), lr=lr)
    federation = Federation(rounds=rounds, local_epochs=local_epochs)
    trainer = L.Trainer(callbacks=[federation], default_root_dir=out, logger=False, enable_progress_bar=False)
    trainer.fit(model, datamodule=dm)
    accuracy = federation.history[-1]["global_acc"]
    print(f"final test accuracy {accuracy:.4f} (results in {Path(out).resolve()})")
    return accuracy


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--size", type=int, nargs=2, default=(48, 64), metavar=("HEIGHT", "WIDTH"))
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--local-epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2, help="data-loading processes (main() defaults to 0)")
    parser.add_argument("--arch", default="resnet18", help="a torchvision classification model's name")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--out", default="runs/image_folder")
    args = parser.parse_args()
    try:
        main(
            args.folder,
            tuple(args.size),
            rounds=args.rounds,
            num_clients=args.clients,
            local_epochs=args.local_epochs,
            workers=args.workers,
            arch=args.arch,
            lr=args.lr,
            out=args.out,
        )
    except (FileNotFoundError, ValueError) as err:  # bad input: one line, not a traceback
        raise SystemExit(f"error: {err}") from None
