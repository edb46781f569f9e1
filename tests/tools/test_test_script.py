"""tools/test.sh with arguments: pytest gets exactly them, and only the set-ups the chosen tests need run."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers.compose import ROOT
from tests.helpers.setup_needs import NEEDS, needed_setups

SGLANG, VLLM, SMOLLM2, TORCHAO = NEEDS


def _collected(command: list[str]) -> list[str]:
    """The node ids a `--collect-only -q` run of `command` prints (run from the checkout's root)."""
    env = dict(os.environ, SLIME_TEST_SETUP="none")  # the venv this test runs in is set up already
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_a_path_given_to_the_script_is_the_only_one_collected():
    args = ["tests/config", "-m", "not slow", "--collect-only", "-q"]
    through_script = _collected(["bash", "tools/test.sh", *args])
    direct = _collected([sys.executable, "-m", "pytest", *args])
    assert through_script == direct
    assert len(direct) > 100  # tests/config holds hundreds of tests: a path that selected nothing would show
    assert all(node.startswith("tests/config/") for node in through_script)


def test_a_selection_without_tests_fails():
    env = dict(os.environ, SLIME_TEST_SETUP="none")
    done = subprocess.run(
        ["bash", "tools/test.sh", "tests/config/test_objective.py", "-k", "no_test_has_this_name", "-q"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1 and "pytest collected no tests" in done.stderr


def test_the_optional_set_ups_follow_the_chosen_tests():
    assert needed_setups([]) == [SGLANG, VLLM, SMOLLM2, TORCHAO]  # the whole suite
    assert needed_setups(["-m", "not slow"]) == [SGLANG, VLLM, SMOLLM2, TORCHAO]  # options only: the whole suite
    assert needed_setups(["tests/train/test_fp8.py"]) == [TORCHAO]
    assert needed_setups(["tests/algo", "tests/plan", "-m", "not slow"]) == []
    assert needed_setups(["tests/config"]) == [SMOLLM2]  # its recipe tests validate recipe=smollm2_arithmetic
    assert needed_setups(["tests/e2e/test_vllm_real.py::test_anything"]) == [VLLM]  # a node id counts as its file
    assert needed_setups(["tests/engine/sglang"]) == [SGLANG]
    assert needed_setups(["tests/e2e/test_smollm2_recipe.py"]) == [SMOLLM2]
    # through a helper the test imports: the fake vLLM server runs vLLM's own code
    assert VLLM in needed_setups(["tests/engine/vllm/test_fake_vllm.py"])
    # an option's value that is a path outside the checkout names no tests
    assert needed_setups(["--basetemp", "/tmp", "tests/algo"]) == []
