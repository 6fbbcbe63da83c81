#!/usr/bin/env bash
# Set up a virtual environment (once) and run the quickstart federation on the embedded digits dataset.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install -q --upgrade pip >/dev/null
"$VENV/bin/pip" install -q torch==2.14.1 torchvision==0.29.1
"$VENV/bin/pip" install -q -e ".[dev]"
"$VENV/bin/python" cli.py fit --config configs/quickstart.yaml --overwrite "$@"
