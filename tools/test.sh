#!/usr/bin/env bash
# Set up (tools/setup.sh test) and run the CPU test suite. pytest's "no tests ran" (exit 5) fails.
set -uo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh test || exit 1
.venv/bin/python -m pytest tests "$@"
status=$?
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$status"
