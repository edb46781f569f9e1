#!/usr/bin/env bash
# Set up (tools/setup.sh test) and run the CPU test suite. pytest's "no tests ran" (exit 5) fails.
# The test extra pulls megatron-core (the megatron backend's CPU tests); on a CPU machine tools/setup.sh
# keeps torch at the CPU build (constraints-cpu.txt), which megatron-core's torch requirement accepts.
set -uo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh test || exit 1
.venv/bin/python -c "import megatron.core" || { echo "megatron-core did not install: the megatron tests would be skipped" >&2; exit 1; }
# Two workers: one runs the end-to-end modules, the other the unit tests beside them (tests/conftest.py).
.venv/bin/python -m pytest tests -n 2 --dist loadgroup "$@"
status=$?
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$status"
