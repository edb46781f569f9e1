#!/usr/bin/env bash
# Create .venv and install the project. On a machine without CUDA, torch is pinned to the CPU build
# (constraints-cpu.txt); with nvidia-smi present, pip keeps/installs the CUDA torch of your choice.
# Usage: bash tools/setup.sh [extras]   e.g. bash tools/setup.sh test
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python3 -m venv .venv
constraint=()
if ! command -v nvidia-smi >/dev/null 2>&1; then
  constraint=(-c constraints-cpu.txt)
  .venv/bin/pip install --quiet "${constraint[@]}" torch
fi
spec="."
[ -n "$extras" ] && spec=".[$extras]"
.venv/bin/pip install --quiet "${constraint[@]}" -e "$spec"
