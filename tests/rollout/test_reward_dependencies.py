"""A reward whose dependency is missing stops the run in validation (exit 2, its install command), for built-in
reward types (the training rollout's and an eval dataset's) and custom rewards alike: never a rollout's failure
later, nor an eval's zeros."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.helpers.compose import ROOT
from tests.helpers.validation import problems_for

# `math_verify` imported anywhere raises ModuleNotFoundError(name='math_verify'), as on a machine without it.
WITHOUT_MATH_VERIFY = "import sys; sys.modules['math_verify'] = None"


@pytest.fixture
def no_math_verify(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)
    monkeypatch.delitem(sys.modules, "slime.rollout.rm.math", raising=False)


def test_a_built_in_reward_types_missing_dependency_names_the_key_and_the_install_command(no_math_verify, tmp_path):
    found = problems_for(["rollout.rm_type=math"], tmp_path / "run")
    assert set(found) == {"rollout.rm_type"}
    problem = found["rollout.rm_type"]
    assert problem.startswith("rollout.rm_type='math': reward type 'math' (slime.rollout.rm.math.math_reward)")
    assert "it imports 'math_verify', which is not installed" in problem
    assert problem.endswith("Fix: install it: pip install math-verify")


def test_an_eval_datasets_reward_type_is_imported_too(no_math_verify, tmp_path):
    found = problems_for(["eval=arithmetic", "+eval.datasets.arithmetic.rm_type=math"], tmp_path / "run")
    assert set(found) == {"eval.datasets.arithmetic.rm_type"}
    assert "pip install math-verify" in found["eval.datasets.arithmetic.rm_type"]


def test_a_custom_rewards_missing_dependency_names_it_and_the_install_command(no_math_verify, monkeypatch, tmp_path):
    (tmp_path / "my_judge.py").write_text("import math_verify\n\n\ndef score(args, sample):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = problems_for(["rollout.rm_type=null", "rollout.custom_rm_path=my_judge.score"], tmp_path / "run")
    assert set(found) == {"rollout.custom_rm_path"}
    assert (
        "importing 'my_judge' failed: it imports 'math_verify', which is not installed"
        in found["rollout.custom_rm_path"]
    )
    assert found["rollout.custom_rm_path"].endswith("Fix: install it: pip install math-verify")


def test_an_unknown_missing_dependency_says_which_module_to_provide(monkeypatch, tmp_path):
    (tmp_path / "my_other_judge.py").write_text("import judge_client_xyz\n\n\ndef score(args, sample):\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = problems_for(["rollout.rm_type=null", "rollout.custom_rm_path=my_other_judge.score"], tmp_path / "run")
    assert found["rollout.custom_rm_path"].endswith(
        "Fix: install the package that provides the module 'judge_client_xyz' into this environment"
    )


def test_the_cli_exits_2_before_anything_starts(tmp_path):
    run_dir = tmp_path / "run"
    main = textwrap.dedent(
        f"""
        {WITHOUT_MATH_VERIFY}
        import runpy
        sys.argv = ["main.py", "hydra.run.dir={run_dir}", "rollout.rm_type=math"]
        runpy.run_path("main.py", run_name="__main__")
        """
    )
    proc = subprocess.run([sys.executable, "-c", main], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "rollout.rm_type='math': reward type 'math'" in proc.stderr
    assert "pip install math-verify" in proc.stderr and "Traceback" not in proc.stderr
    assert not (run_dir / "logs").exists()  # no Ray, no rollout manager
