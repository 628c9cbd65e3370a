#!/usr/bin/env bash
# Create the venv bench/e2e_bench.py runs img2dataset from (kept apart from .venv: its pins clash with ours).
#   bash bench/setup_img2dataset.sh [VENV_DIR]   (default bench/.venv-img2dataset)
set -euo pipefail
venv="${1:-$(dirname "$0")/.venv-img2dataset}"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip
"$venv/bin/pip" install --quiet "img2dataset==1.47.0"
"$venv/bin/img2dataset" --help >/dev/null
echo "img2dataset ready: $venv/bin/img2dataset"
