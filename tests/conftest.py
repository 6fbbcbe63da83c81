import os
import signal
import warnings

import pytest
import torch

from fl_lightning.core.faults import restore_signal_handlers, signal_handlers

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


@pytest.fixture(autouse=True)
def _signal_handlers_restored():
    """Every test leaves SIGINT's and SIGTERM's handlers as it found them; one that does not fails, naming them.

    The in-process signal tests need Ctrl-C to raise KeyboardInterrupt: a handler left behind by an earlier test in
    the same worker (Lightning ignores SIGINT after a KeyboardInterrupt in a fit) would make them fail far from the
    cause. The handlers are put back either way.
    """
    before = signal_handlers()
    yield
    left = {s: h for s, h in (signal_handlers() or {}).items() if before is not None and h is not before[s]}
    restore_signal_handlers(before)
    if left:
        names = ", ".join(f"{signal.Signals(s).name} = {h!r}" for s, h in left.items())
        pytest.fail(f"the test left a signal handler changed: {names} (restored)", pytrace=False)


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
