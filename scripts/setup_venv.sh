#!/usr/bin/env bash
# Set up the virtual environment $VENV (default .venv) for scripts/quickstart.sh and scripts/test.sh, which source
# this file from the repository root. pip runs only when the environment is new, or when pyproject.toml or the torch
# choice below changed since the last set-up (a stamp file in $VENV keyed on both); otherwise nothing is installed.
#
# Which torch to install (the default works offline here; on a machine without a GPU the CPU-only build leaves out
# the CUDA libraries, several GB):
#   TORCH_INDEX_URL  an index to take torch from, e.g. https://download.pytorch.org/whl/cpu (the CPU-only build)
#   TORCH_SPEC       what pip installs for torch: requirements or wheel files
#                    (default: "torch==2.14.1 torchvision==0.29.1")
VENV="${VENV:-.venv}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.14.1 torchvision==0.29.1}"
TORCH_INDEX_URL="${TORCH_INDEX_URL:-}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
stamp="$VENV/.fl_lightning-setup"
wanted="$({ cat pyproject.toml; echo "torch: $TORCH_SPEC index: $TORCH_INDEX_URL"; } | cksum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
  "$VENV/bin/pip" install -q --upgrade pip >/dev/null
  # shellcheck disable=SC2086  # TORCH_SPEC is a list of requirements
  "$VENV/bin/pip" install -q ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} $TORCH_SPEC
  # setuptools' "Editable installation" notice (a dozen lines on every set-up) says nothing to act on.
  PYTHONWARNINGS="ignore:Editable installation" "$VENV/bin/pip" install -q -e ".[dev]"
  echo "$wanted" >"$stamp"
fi
