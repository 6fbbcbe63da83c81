#!/usr/bin/env bash
# Set up a virtual environment (scripts/setup_venv.sh) and run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/setup_venv.sh
source scripts/setup_venv.sh  # pip only when .venv is new or pyproject.toml changed; TORCH_INDEX_URL, TORCH_SPEC
export WANDB_MODE=offline WANDB_SILENT=true
# One pytest worker per core (pytest-xdist), one thread each: the tests are many small federations, not big kernels.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# The import contracts and the types ([tool.importlinter], [tool.mypy] in pyproject.toml); the docs build runs in the
# suite (tests/test_docs.py).
"$VENV/bin/lint-imports"
"$VENV/bin/mypy"
"$VENV/bin/python" -m pytest -q -n "${PYTEST_WORKERS:-auto}" "$@"
