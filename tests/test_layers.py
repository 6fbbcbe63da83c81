"""The package's layers as users meet them: the core loads no Lightning, public names import from ``fl_lightning``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nprint(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return set(out.stdout.split())


def test_importing_the_core_loads_no_lightning():
    loaded = _loaded_after(
        "import fl_lightning.core.losses, fl_lightning.core.rounds, fl_lightning.core.partitions, "
        "fl_lightning.core.server_optim, fl_lightning.core.aggregation"
    )
    frameworks = {m.split(".")[0] for m in loaded} & {"lightning", "pytorch_lightning", "jsonargparse", "wandb"}
    assert not frameworks, f"importing fl_lightning.core loaded {sorted(frameworks)}"


def test_public_names_import_from_the_package():
    import fl_lightning

    for name in fl_lightning.__all__:
        assert getattr(fl_lightning, name) is not None
    assert set(fl_lightning.__all__) <= set(dir(fl_lightning))


def test_an_unknown_name_is_an_attribute_error():
    import fl_lightning

    try:
        fl_lightning.NoSuchThing  # noqa: B018
    except AttributeError as err:
        assert "NoSuchThing" in str(err)
    else:
        raise AssertionError("fl_lightning.NoSuchThing did not raise AttributeError")


def test_modules_are_at_most_about_600_lines():
    """One job a module; the exceptions are many small parts of one kind (the method classes, the doctested losses)."""
    exceptions = {"methods.py", "losses.py"}
    long = {
        str(path.relative_to(ROOT)): n
        for path in (ROOT / "fl_lightning").rglob("*.py")
        if path.name not in exceptions and (n := len(path.read_text().splitlines())) > 620
    }
    assert not long, f"modules over 620 lines: {long}"
