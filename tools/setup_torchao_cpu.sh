#!/usr/bin/env bash
# Install torchao (the fp8 extra's pin) into .venv/torchao, outside .venv's site-packages: with torchao importable,
# transformers imports it in every process that loads a model (a second of start-up and its warnings on a CPU).
# Only the FP8 tests put it on their path (tests/helpers/torchao_site.py). Skipped when it is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
target=.venv/torchao
pin=torchao==0.18.0
if [ -f "$target/.pin" ] && [ "$(cat "$target/.pin")" = "$pin" ]; then
  exit 0
fi
rm -rf "$target"
.venv/bin/pip install --quiet --no-deps --target "$target" "$pin"
echo "$pin" > "$target/.pin"
