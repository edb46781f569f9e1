"""Hostile user code: reward hooks and generate functions that are wrong in every way users manage."""

from __future__ import annotations

import asyncio
import os
import textwrap
import threading
import time
import uuid

import pytest

from slime.rollout.rewards import RewardFailureError, RewardHub, check_failures
from slime.types import Sample, SampleStatus
from tests.helpers.validation import problems_for

HOOKS = """
import math, sys

import numpy as np

NOT_CALLABLE = 3

def three_args(args, sample, extra):
    return 1.0

def returns(args, sample):
    kind = sample.response
    return {
        "inf": math.inf, "-inf": -math.inf, "str": "1.0", "none": None, "np32": np.float32(0.5),
        "dict": {"acc": 1.0, "pred": "5"}, "dict_str": {"score": "high"}, "list": [1.0],
    }[kind]

def raises(args, sample):
    raise KeyError("label_field")

def exits(args, sample):
    sys.exit(1)

def group_short(args, samples):
    return [1.0] * (len(samples) - 1)
"""

BROKEN_MODULE = "import math\nVALUE = 1 / 0\n"


@pytest.fixture
def hooks(tmp_path, monkeypatch) -> str:
    """A user module of reward hooks on sys.path; returns its name (a sibling `<name>_broken` fails to import)."""
    name = f"hostile_rm_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(HOOKS))
    (tmp_path / f"{name}_broken.py").write_text(BROKEN_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


@pytest.mark.parametrize(
    "attr,text",
    [
        ("NOT_CALLABLE", "not callable"),
        ("three_args", "extra"),
    ],
)
def test_reward_hook_that_cannot_be_called_is_a_config_problem(hooks, attr, text, tmp_path):
    found = problems_for(["rollout.rm_type=null", f"rollout.custom_rm_path={hooks}.{attr}"], tmp_path / "run")
    assert text in found["rollout.custom_rm_path"], found


def test_reward_module_that_raises_on_import_is_named(hooks, tmp_path):
    found = problems_for(["rollout.rm_type=null", f"rollout.custom_rm_path={hooks}_broken.rm"], tmp_path / "run")
    assert (
        "ZeroDivisionError" in found["rollout.custom_rm_path"] and f"{hooks}_broken" in found["rollout.custom_rm_path"]
    )


def score(hooks: str, fn: str, response: str = "x", *, reward_key: str | None = None) -> Sample:
    sample = Sample(index=0, response=response, label="5")
    hub = RewardHub(rm_type=None, custom_rm_path=f"{hooks}.{fn}", reward_key=reward_key)
    asyncio.run(hub.reward_sample(None, sample))
    return sample


@pytest.mark.parametrize(
    "response,reward_key,text",
    [
        ("inf", None, "infinite reward (inf)"),
        ("-inf", None, "infinite reward (-inf)"),
        ("str", None, "returned str '1.0'; expected a number or dict"),
        ("none", None, "returned NoneType None"),
        ("list", None, "returned list [1.0]"),
        ("dict", None, "a dict with keys ['acc', 'pred']; set rollout.reward_key"),
        ("dict", "score", "(got 'score')"),
        ("dict_str", "score", "returned dict {'score': 'high'}; expected a number"),
    ],
)
def test_bad_reward_values_fail_their_sample_saying_why(hooks, response, reward_key, text):
    sample = score(hooks, "returns", response, reward_key=reward_key)
    assert sample.status == SampleStatus.FAILED and sample.reward == 0.0 and sample.remove_sample
    assert sample.error.startswith("reward: ValueError: ") and text in sample.error, sample.error


def test_numpy_scalar_reward_is_a_number(hooks):
    sample = score(hooks, "returns", "np32")
    assert sample.status != SampleStatus.FAILED and sample.reward == 0.5 and isinstance(sample.reward, float)


def test_reward_that_raises_or_exits_fails_only_its_sample(hooks):
    assert score(hooks, "raises").error == "reward: KeyError: 'label_field'"
    exited = score(hooks, "exits")  # sys.exit() in a reward used to escape the event loop
    assert exited.status == SampleStatus.FAILED and exited.error == "reward: SystemExit: 1"


def test_group_reward_of_the_wrong_length_fails_the_group_and_then_the_step(hooks):
    samples = [Sample(index=i, response="x", label="5") for i in range(4)]
    hub = RewardHub(rm_type=None, custom_rm_path=f"{hooks}.group_short", group_rm=True)
    asyncio.run(hub.reward_group(None, samples))
    assert all(s.status == SampleStatus.FAILED for s in samples)
    assert samples[0].error == "reward: ValueError: the group reward function must return a list of 4 rewards"
    with pytest.raises(
        RewardFailureError, match=r"rollout.reward.max_failure_ratio=0.05.*sample 0: reward: ValueError"
    ):
        check_failures(samples, 0.05)


def user_generate_that_hangs(release: threading.Event) -> None:
    while not release.wait(0.05):
        pass


def test_generate_function_that_hangs_is_named_in_the_watchdogs_dump(tmp_path):
    """A rollout that never returns: past runtime.phase_timeout_s the stack dump shows the user's function."""
    from slime.driver.events import EventBus, RunEvent
    from slime.driver.watchdog import PhaseLimits, Watchdog

    release, fired = threading.Event(), []
    worker = threading.Thread(target=user_generate_that_hangs, args=(release,))
    worker.start()
    try:
        events = EventBus()
        Watchdog(
            events, PhaseLimits(phase_s=5.0), tmp_path / "stacks", on_fire=fired.append, on_stuck=lambda: None
        ).start()
        events.publish(RunEvent.PHASE_STARTED, 3, phase="rollout", started=time.monotonic() - 10)  # run 10 s
        deadline = time.monotonic() + 10
        while not fired and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        release.set()
        worker.join()
    assert fired and fired[0].startswith("phase rollout of rollout 3 exceeded runtime.phase_timeout_s=5s")
    dump = (tmp_path / "stacks" / f"{os.getpid()}.txt").read_text()
    assert "user_generate_that_hangs" in dump
