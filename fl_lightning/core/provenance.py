"""Where a run trains and from which code: the device and git revision its ``summary.json`` records."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

import torch


def device_label(device: torch.device) -> str:
    """Where a run trains: ``cpu``, or ``cuda (<GPU name>)``."""
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return device.type


@functools.lru_cache(maxsize=1)
def git_revision() -> str | None:
    """The short git revision of the fl_lightning checkout (None outside a git checkout)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None
