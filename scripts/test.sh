#!/usr/bin/env bash
# Set up a virtual environment (scripts/setup_venv.sh), check lint, format, the import contracts and the types, and run
# the tests.
#
#   bash scripts/test.sh           the suite: every test but the `slow` ones (under 5 minutes on 2 cores)
#   bash scripts/test.sh --slow    the `slow` tests alone, end to end through processes that import torch and
#                                  Lightning (signals, crashes, several processes and nodes, compare's fits), Flower
#                                  (simulation, a deployment, every method through the apps), the docs build, the
#                                  installed package, or Dynamo tracing every method's stacked step
#   bash scripts/test.sh --all     both (what CI runs, in two steps)
#
# Other arguments go to pytest, after the selection (a `-m` of your own replaces it). Naming a test file or a test
# (`tests/test_crash.py`, `tests/test_crash.py::test_...`) runs it, slow or not.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/setup_venv.sh
source scripts/setup_venv.sh  # pip only when .venv is new or pyproject.toml changed; TORCH_INDEX_URL, TORCH_SPEC
export WANDB_MODE=offline WANDB_SILENT=true
# One pytest worker per core (pytest-xdist), one thread each: the tests are many small federations, not big kernels.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
SELECT=(-m "not slow")
case "${1:-}" in
  --slow) SELECT=(-m slow); shift ;;
  --all) SELECT=(); shift ;;
  *) for arg in "$@"; do
       if [[ "$arg" == *.py || "$arg" == *::* ]]; then SELECT=(); fi
     done ;;
esac
# Lint and format ([tool.ruff]), the import contracts and the types ([tool.importlinter], [tool.mypy] in pyproject.toml).
"$VENV/bin/ruff" check --quiet .
"$VENV/bin/ruff" format --check --quiet .
"$VENV/bin/lint-imports"
"$VENV/bin/mypy"
# worksteal: idle workers take queued tests from busy ones, so a long test near the end does not leave a core idle.
"$VENV/bin/python" -m pytest -q -n "${PYTEST_WORKERS:-auto}" --dist worksteal "${SELECT[@]}" "$@"
