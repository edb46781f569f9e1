#!/usr/bin/env bash
# Install the real sglang wheel (the pinned version) without its GPU dependencies into .venv/sglang-cpu, with
# the few packages its modules need to import on CPU (tools/sglang_cpu_requirements.txt). The contract tests
# and the fake SGLang server import SGLang's own code from there (tests/helpers/sglang_real.py); nothing else
# sees it. Skipped when the directory already holds exactly these pins.
set -euo pipefail
cd "$(dirname "$0")/.."
target=.venv/sglang-cpu
pins=tools/sglang_cpu_requirements.txt
if [ -f "$target/.pins" ] && cmp -s "$pins" "$target/.pins"; then
  exit 0
fi
rm -rf "$target"
.venv/bin/pip install --quiet --no-deps --target "$target" -r "$pins"
cp "$pins" "$target/.pins"
