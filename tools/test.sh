#!/usr/bin/env bash
# Set up .venv and run the CPU test suite. pytest's "no tests ran" (exit 5) fails.
#
#   bash tools/test.sh                          the whole suite, as CI runs it (below)
#   bash tools/test.sh tests/config -m "not slow"   exactly these paths, with these pytest options
#
# Set-up: always tools/setup.sh test (the project, pytest, ruff, megatron-core for the megatron backend's CPU tests,
# the Optuna sweeper; torch stays at the CPU build on a CPU machine: constraints-cpu.txt); then what the chosen
# tests need of SGLang's CPU wheel (tools/setup_sglang_cpu.sh), vLLM on CPU (tools/setup_vllm_cpu.sh, ~2.5 GB) and
# SmolLM2 (tools/setup_smollm2.sh): all three for the whole suite, for paths what tests/helpers/setup_needs.py
# finds. Each set-up is skipped when already done. SLIME_TEST_SETUP=none skips them all (use .venv as it is).
#
# Without arguments (CI), two lanes run side by side: the end-to-end runs (marked `slow`: pools of main.py runs
# that keep both cores of a 2-core machine busy; the process collects only the files with a slow test,
# tests/helpers/slow_files.py), and the unit tests (one core at a time) followed by the few end-to-end files
# slow_files.py gives that lane; the unit lane's reports are printed after the runs', then every process's summary,
# then the metric-history gate's table (the learning runs' figures against tests/metric_baseline.json: a
# regression fails; the timings scaled by this machine's speed, timed first). With arguments, one pytest process
# gets exactly them (no path: pytest's own default, the tests/ folder).
set -uo pipefail
cd "$(dirname "$0")/.."

set_up() {
  [ "${SLIME_TEST_SETUP:-all}" = none ] && return 0
  bash tools/setup.sh test || exit 1
  local script
  for script in $(.venv/bin/python -m tests.helpers.setup_needs "$@"); do
    echo "tools/test.sh: the chosen tests need $script" >&2
    bash "$script" || exit 1
  done
}

no_tests() {
  echo "pytest collected no tests: failing" >&2
  exit 1
}

set_up "$@"
if [ $# -gt 0 ]; then
  .venv/bin/python -m pytest "$@"
  status=$?
  [ "$status" -eq 5 ] && no_tests
  exit "$status"
fi

unit_log=$(mktemp)
late_log=$(mktemp)
runs_log=$(mktemp)
lane_status=$(mktemp)
# One cache for every process (tests/conftest.py): what one imports or generates first, the others find.
SLIME_TEST_SHARED_CACHE=$(mktemp -d -t slime-test-cache-XXXXXX)
export SLIME_TEST_SHARED_CACHE
# The learning runs' figures, for the metric-history gate at the end (tests/helpers/metric_history.py): a small
# file kept after the run, so that the baseline can be refreshed from it (SLIME_METRIC_REPORT chooses its path).
SLIME_METRIC_REPORT=${SLIME_METRIC_REPORT:-$(mktemp -t slime-metric-report-XXXXXX.jsonl)}
: >"$SLIME_METRIC_REPORT"
export SLIME_METRIC_REPORT
# The machine's speed first, on an idle machine: the gate compares timings scaled to the baseline's machine.
.venv/bin/python -m tests.helpers.metric_history calibrate "$SLIME_METRIC_REPORT" || exit 1
mapfile -t slow < <(.venv/bin/python -m tests.helpers.slow_files --lane runs) || exit 1
mapfile -t late < <(.venv/bin/python -m tests.helpers.slow_files --lane after-unit) || exit 1
[ "${#slow[@]}" -gt 0 ] && [ "${#late[@]}" -gt 0 ] || no_tests
# The unit tests, then the end-to-end files that tests/helpers/slow_files.py hands that lane: when the unit tests
# end, a core would otherwise idle under the runs' single-run modules. The unit tests' session also checks that every
# slow test is in one of the listed files.
unit_lane() {
  SLIME_CHECK_SLOW_FILES=1 .venv/bin/python -m pytest tests -m "not slow" >"$unit_log" 2>&1
  local unit=$?
  .venv/bin/python -m pytest -m slow "${late[@]}" >"$late_log" 2>&1
  echo "$unit $?" >"$lane_status"
}
unit_lane &
unit_pid=$!
trap 'kill "$unit_pid" 2>/dev/null; rm -f "$unit_log" "$late_log" "$runs_log" "$lane_status"; rm -rf "$SLIME_TEST_SHARED_CACHE"' EXIT
.venv/bin/python -m pytest -m slow "${slow[@]}" 2>&1 | tee "$runs_log"
runs=${PIPESTATUS[0]}
wait "$unit_pid"
read -r unit late_runs <"$lane_status" || { unit=1; late_runs=1; }
echo "========================== unit tests (they ran beside the end-to-end runs) =========================="
cat "$unit_log"
echo "===================== end-to-end runs of the unit tests' lane (after the unit tests) ====================="
cat "$late_log"
# Last, what each process ended with (its failures and its count): a reader of the output's tail sees all three.
echo "=============================================== summary ==============================================="
for part in "end-to-end runs:$runs_log" "unit tests:$unit_log" "end-to-end runs after the unit tests:$late_log"; do
  echo "--- ${part%%:*}"
  if grep -q "short test summary info" "${part#*:}"; then
    sed -n '/short test summary info/,$p' "${part#*:}" | tail -n 40
  else
    tail -n 1 "${part#*:}"
  fi
done
echo "--- metric history"
.venv/bin/python -m tests.helpers.metric_history check "$SLIME_METRIC_REPORT"
gate=$?
for status in "$runs" "$unit" "$late_runs"; do
  [ "$status" -eq 5 ] && no_tests  # each process has tests: one without is a broken selection
done
for status in "$runs" "$unit" "$late_runs"; do
  [ "$status" -ne 0 ] && exit "$status"
done
exit "$gate"
