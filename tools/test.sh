#!/usr/bin/env bash
# Set up (tools/setup.sh test, tools/setup_sglang_cpu.sh, tools/setup_vllm_cpu.sh, tools/setup_smollm2.sh) and run the CPU test suite. pytest's "no tests ran" (exit 5) fails.
# The test extra pulls megatron-core (the megatron backend's CPU tests); on a CPU machine tools/setup.sh
# keeps torch at the CPU build (constraints-cpu.txt), which megatron-core's torch requirement accepts.
#
# Without arguments (CI), two pytest processes run side by side: the end-to-end runs (marked `slow`: pools of
# main.py runs that keep both cores of a 2-core machine busy; the process collects only the files with a slow
# test, tests/helpers/slow_files.py) and the unit tests (one core at a time); the unit tests' report is printed
# after the runs', then both processes' summaries. With arguments, one pytest process runs `tests` with them.
set -uo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh test || exit 1
bash tools/setup_sglang_cpu.sh || exit 1  # SGLang's own code for the contract tests and the fake server
bash tools/setup_vllm_cpu.sh || exit 1  # a real vLLM on CPU for the rollout=vllm tests
bash tools/setup_smollm2.sh || exit 1  # a real pretrained model (SmolLM2-135M-Instruct) for the real-weights tests
.venv/bin/python -c "import megatron.core" || { echo "megatron-core did not install: the megatron tests would be skipped" >&2; exit 1; }

no_tests() {
  echo "pytest collected no tests: failing" >&2
  exit 1
}

if [ $# -gt 0 ]; then
  .venv/bin/python -m pytest tests "$@"
  status=$?
  [ "$status" -eq 5 ] && no_tests
  exit "$status"
fi

unit_log=$(mktemp)
runs_log=$(mktemp)
# One cache for both processes (tests/conftest.py): what one imports or generates first, the other finds.
SLIME_TEST_SHARED_CACHE=$(mktemp -d -t slime-test-cache-XXXXXX)
export SLIME_TEST_SHARED_CACHE
mapfile -t slow < <(.venv/bin/python -m tests.helpers.slow_files) || exit 1
[ "${#slow[@]}" -gt 0 ] || no_tests
# the unit tests' session also checks that every slow test is in one of those files
SLIME_CHECK_SLOW_FILES=1 .venv/bin/python -m pytest tests -m "not slow" >"$unit_log" 2>&1 &
unit_pid=$!
trap 'kill "$unit_pid" 2>/dev/null; rm -f "$unit_log" "$runs_log"; rm -rf "$SLIME_TEST_SHARED_CACHE"' EXIT
.venv/bin/python -m pytest -m slow "${slow[@]}" 2>&1 | tee "$runs_log"
runs=${PIPESTATUS[0]}
wait "$unit_pid"
unit=$?
echo "========================== unit tests (they ran beside the end-to-end runs) =========================="
cat "$unit_log"
# Last, what each process ended with (its failures and its count): a reader of the output's tail sees both.
echo "=============================================== summary ==============================================="
for part in "end-to-end runs:$runs_log" "unit tests:$unit_log"; do
  echo "--- ${part%%:*}"
  if grep -q "short test summary info" "${part#*:}"; then
    sed -n '/short test summary info/,$p' "${part#*:}" | tail -n 40
  else
    tail -n 1 "${part#*:}"
  fi
done
[ "$runs" -eq 5 ] || [ "$unit" -eq 5 ] && no_tests  # each process has tests: one without is a broken selection
[ "$runs" -ne 0 ] && exit "$runs"
exit "$unit"
