#!/usr/bin/env bash
# Build the documentation site into docs/_build/html (open docs/_build/html/index.html; nothing is fetched online).
# Fails on any warning, broken cross-reference (-n) or broken internal link (tests/test_docs.py checks the Markdown
# links and anchors of README and docs/). Arguments go to sphinx-build, e.g. `bash scripts/docs.sh -E` to rebuild all.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
OUT="${DOCS_OUT:-docs/_build/html}"
export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore::DeprecationWarning}"
"$VENV/bin/python" -m sphinx -b html -W --keep-going -n -q -d "${DOCS_DOCTREES:-docs/_build/doctrees}" \
  docs/source "$OUT" "$@"
echo "docs: $OUT/index.html"
