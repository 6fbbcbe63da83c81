"""Entry point: ``python cli.py fit --config configs/quickstart.yaml`` or ``python cli.py compare --config ...``."""

import importlib.util
import sys

# The packages fl_lightning imports (pyproject.toml's dependencies, by import name), checked without importing them.
REQUIRED = ("torch", "torchvision", "lightning", "jsonargparse", "numpy", "sklearn", "matplotlib", "yaml")


def missing_dependency() -> str | None:
    """The first of :data:`REQUIRED` this Python cannot import, as the line to print; ``None`` when all are there."""
    for name in REQUIRED:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return (
                f"error: {name} is not installed in this Python ({sys.executable}); run bash scripts/setup_venv.sh "
                "and use .venv/bin/python (or activate .venv)"
            )
    return None


if __name__ == "__main__":
    line = missing_dependency()
    if line is not None:
        print(line, file=sys.stderr)
        sys.exit(2)
    from fl_lightning.cli import main

    main()
