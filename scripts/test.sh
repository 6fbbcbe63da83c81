#!/usr/bin/env bash
# Set up a virtual environment (once) and run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install -q --upgrade pip >/dev/null
"$VENV/bin/pip" install -q torch==2.14.1 torchvision==0.29.1
"$VENV/bin/pip" install -q -e ".[dev]"
export WANDB_MODE=offline WANDB_SILENT=true
# One pytest worker per core (pytest-xdist), one thread each: the tests are many small federations, not big kernels.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
"$VENV/bin/python" -m pytest -q -n "${PYTEST_WORKERS:-auto}" "$@"
