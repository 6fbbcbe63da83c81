import os
import warnings

import pytest
import torch

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
torch.set_num_threads(min(2, torch.get_num_threads()))
# The suite's threads are chosen, not torch's default: a fit on a loaded machine would warn about a busy CPU otherwise.
os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
warnings.filterwarnings("ignore", ".*does not have many workers.*")
warnings.filterwarnings("ignore", ".*GPU available but not used.*")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def figures(monkeypatch):
    """The figures the plotting functions write, in order, to inspect after they are saved."""
    from matplotlib.figure import Figure

    kept = []
    savefig = Figure.savefig

    def keep(fig, *args, **kwargs):
        kept.append(fig)
        return savefig(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return kept
