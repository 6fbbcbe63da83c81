#!/usr/bin/env bash
# Set up a virtual environment (scripts/setup_venv.sh) and run the quickstart federation on the embedded digits dataset.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/setup_venv.sh
source scripts/setup_venv.sh  # pip only when .venv is new or pyproject.toml changed; TORCH_INDEX_URL, TORCH_SPEC
"$VENV/bin/python" cli.py fit --config configs/quickstart.yaml "$@"  # a new runs/quickstart/version_N
