#!/usr/bin/env bash
# Create .venv and install the project. On a machine without CUDA, torch is pinned to the CPU build
# (constraints-cpu.txt); with nvidia-smi present, pip keeps/installs the CUDA torch of your choice.
# Usage: bash tools/setup.sh [extras]   e.g. bash tools/setup.sh test
# A second call with the same (or fewer) extras, pyproject.toml and constraints is a no-op: .venv/.setup/ holds a
# stamp per extras set (the project is installed editable: code changes need no new install).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
constraint=()
command -v nvidia-smi >/dev/null 2>&1 || constraint=(-c constraints-cpu.txt)
stamp_dir=.venv/.setup
inputs=$(cat pyproject.toml constraints-cpu.txt; python3 --version; echo "${constraint[*]}")
digest=$(printf '%s' "$inputs" | sha256sum | cut -d' ' -f1)
if [ -x .venv/bin/python ] && [ -d "$stamp_dir" ]; then
  # the same extras, or none asked and any set installed
  if grep -qx "$digest" "$stamp_dir/${extras:-base}" 2>/dev/null || { [ -z "$extras" ] && grep -qxr "$digest" "$stamp_dir"; }; then
    exit 0
  fi
fi
python3 -m venv .venv
if [ ${#constraint[@]} -gt 0 ]; then
  .venv/bin/pip install --quiet "${constraint[@]}" torch
fi
spec="."
[ -n "$extras" ] && spec=".[$extras]"
.venv/bin/pip install --quiet "${constraint[@]}" -e "$spec"
if [ "$extras" = test ]; then  # its megatron-core: without it the megatron backend's tests would be skipped
  .venv/bin/python -W ignore -c "import megatron.core" || { echo "megatron-core did not install" >&2; exit 1; }
fi
mkdir -p "$stamp_dir"
echo "$digest" >"$stamp_dir/${extras:-base}"
