"""The rewards hub: built-in types, selection order, custom and group rewards, failures, the remote RM."""

from __future__ import annotations

import asyncio
import json
import textwrap
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from slime.plan.validate import collect_problems
from slime.registry import REWARD_TYPES
from slime.rollout.rewards import RewardFailureError, RewardHub, check_failures
from slime.rollout.rm.math import last_boxed
from slime.rollout.rm.remote import RemoteRewardModel
from slime.types import Sample, SampleStatus
from tests.helpers.compose import typed_config


@pytest.mark.parametrize(
    "rm_type,response,label,metadata,expected",
    [
        ("math", r"so x = \boxed{\frac{1}{2}}", "0.5", {}, 1.0),
        ("math", r"\boxed{3} then \boxed{\sqrt{2}/2}", r"\boxed{\frac{\sqrt{2}}{2}}", {}, 1.0),  # the LAST box
        ("math", r"\boxed{3}", "4", {}, 0.0),
        ("math", "34", "34", {}, 0.0),  # no box, no reward
        ("deepscaler", r"<think>\boxed{4}</think> so \boxed{5}", "5", {}, 1.0),
        ("deepscaler", r"\boxed{5}", "5", {}, 0.0),  # no </think>: no reward
        ("dapo", "work...\nAnswer: 1,000.", "1000", {}, {"score": 1.0, "acc": True, "pred": "1000"}),
        ("dapo", "Answer: 7", "8", {}, {"score": -1.0, "acc": False, "pred": "7"}),
        ("f1", "The cat sat", "cat sat on mat", {}, 2 * (2 / 2) * (2 / 4) / (2 / 2 + 2 / 4)),
        ("f1", "no", "yes", {}, 0.0),
        ("gpqa", "<think>maybe A</think> The answer is (C).", "C", {}, 1.0),
        ("gpqa", "I'd say B is correct", "green", {"choices": ["red", "green", "blue"]}, 1.0),
        ("gpqa", "the answer is a guess: D", "A", {}, 0.0),  # lower-case "a" is a word, D is the pick
        ("exact_match", " 8 ", "8", {}, 1.0),
    ],
)
def test_builtin_reward_types(rm_type, response, label, metadata, expected):
    assert REWARD_TYPES.load(rm_type)(response, label, metadata) == expected


def test_last_boxed_balances_braces():
    assert last_boxed(r"a \boxed{1} b \boxed{\frac{1}{\sqrt{2}}} c") == r"\frac{1}{\sqrt{2}}"
    assert last_boxed(r"\boxed 7$") == "7" and last_boxed(r"\boxed{unclosed") is None and last_boxed("x") is None


HOOKS = """
import math

def per_sample(args, sample):
    if sample.response == "boom":
        raise RuntimeError("judge down")
    if sample.response == "nan":
        return math.nan
    return {"score": float(len(sample.response)), "acc": True, "args": args}

async def per_group(args, samples):
    per_group.calls = getattr(per_group, "calls", 0) + 1
    return [i / len(samples) for i in range(len(samples))]

def wrong_shape(sample):
    return 1.0
"""


@pytest.fixture
def hooks(tmp_path, monkeypatch) -> str:
    name = f"user_rm_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(HOOKS))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def group(*responses: str, label: str = "5", **metadata) -> list[Sample]:
    return [Sample(index=i, response=r, label=label, metadata=dict(metadata)) for i, r in enumerate(responses)]


def test_selection_order_dicts_and_failures(hooks):
    hub = RewardHub(rm_type="exact_match", custom_rm_path=None, reward_key="score")
    samples = group("5", "6") + group(r"\boxed{5}", rm_type="math") + group("abc", custom_rm_path=f"{hooks}.per_sample")
    samples += group("boom", "nan", custom_rm_path=f"{hooks}.per_sample")
    aborted = Sample(index=9, response="5", label="5", status=SampleStatus.ABORTED)
    asyncio.run(hub.reward_group("ARGS", [*samples, aborted]))
    assert [s.reward for s in samples[:3]] == [1.0, 0.0, 1.0]  # global type, then metadata.rm_type
    assert samples[3].reward == {"score": 3.0, "acc": True, "args": "ARGS"}  # per-sample custom path, (args, sample)
    assert aborted.reward is None and aborted.status == SampleStatus.ABORTED  # aborted samples are not rewarded
    boom, nan = samples[4:]
    assert (boom.status, boom.error) == (SampleStatus.FAILED, "reward: RuntimeError: judge down")
    assert nan.status == SampleStatus.FAILED and "NaN" in nan.error
    assert boom.reward == 0.0 and boom.remove_sample and nan.remove_sample
    assert check_failures(samples, 0.5) == {"rollout/reward_failed": 2.0, "rollout/reward_failed_ratio": 2 / 6}
    with pytest.raises(
        RewardFailureError,
        match=r"2 of 6 samples \(33.3%\) failed their reward or agent episode, more than rollout.reward.max_failure_ratio=0.2",
    ):
        check_failures(samples, 0.2)
    # an eval dataset's samples are held to the same rule, under its own metric names
    assert check_failures(samples, 0.5, scope="eval/arithmetic") == {
        "eval/arithmetic/reward_failed": 2.0,
        "eval/arithmetic/reward_failed_ratio": 2 / 6,
    }
    with pytest.raises(RewardFailureError, match=r"^eval dataset 'arithmetic': 2 of 6 samples \(33.3%\) failed"):
        check_failures(samples, 0.2, scope="eval/arithmetic")


def test_group_rm_calls_once_per_group(hooks):
    hub = RewardHub(rm_type=None, custom_rm_path=f"{hooks}.per_group", group_rm=True)
    first, second = group("a", "b", "c", "d"), group("e", "f")
    asyncio.run(hub.reward_group(None, first))
    asyncio.run(hub.reward_group(None, second))
    assert [s.reward for s in first] == [0.0, 0.25, 0.5, 0.75] and [s.reward for s in second] == [0.0, 0.5]
    assert hub._load(f"{hooks}.per_group", "k").calls == 2


def test_reward_hooks_are_validated_at_start_up(hooks):
    cfg = typed_config(["rollout.rm_type=null", f"rollout.custom_rm_path={hooks}.wrong_shape"])
    problems = {p.key: str(p) for p in collect_problems(cfg)}
    assert "fn(args, sample)" in problems["rollout.custom_rm_path"]
    cfg.rollout.custom_rm_path, cfg.rollout.group_rm = f"{hooks}.per_group", True
    assert "rollout.custom_rm_path" not in {p.key for p in collect_problems(cfg)}
    cfg.rollout.custom_rm_path, cfg.rollout.rm_type = None, "remote_rm"
    problems = {p.key: str(p) for p in collect_problems(cfg)}
    assert (
        "needs rollout.custom_rm_path" in problems["rollout.group_rm"]
        and "needs the reward model's URL" in problems["rollout.rm_url"]
    )


class _RewardModel(BaseHTTPRequestHandler):
    """Scores len(response); the first request of each response fails with 503 (a restarting server), or for "slow"
    answers after 2 s (an overloaded one), past the client's timeout."""

    seen: dict[str, int] = {}

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        attempts = self.seen[body["response"]] = self.seen.get(body["response"], 0) + 1
        if body["response"] == "bad request":
            self._reply(400, {"error": "no"})
        elif body["response"] == "slow" and attempts == 1:
            time.sleep(2.0)
            self._reply(200, {"score": -1, "label": "late", "prompt": ""})
        elif attempts == 1:
            self._reply(503, {"error": "warming up"})
        else:
            self._reply(200, {"score": len(body["response"]), "label": body["label"], "prompt": body["prompt"]})

    def _reply(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def reward_server():
    _RewardModel.seen = {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RewardModel)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/score"
    server.shutdown()
    server.server_close()


def test_remote_rm_retries_5xx_not_4xx(reward_server):
    hub = RewardHub(
        rm_type="remote_rm",
        custom_rm_path=None,
        reward_key="score",
        rm_url=reward_server,
        remote_options=dict(timeout_s=0.5, max_retries=3, max_connections=4, backoff_s=0.01),
    )
    samples = group("abc", "hello", "bad request", "slow")
    for s in samples:
        s.prompt = "p"
    try:
        asyncio.run(hub.reward_group(None, samples))  # one event loop per rollout step...
        # each 503 and the timeout retried once and counted; the 400 failed at once (the failure ratio judges it)
        assert hub.remote_metrics("rollout") == {"rollout/reward_retries": 3.0, "rollout/reward_gave_up": 0.0}
        again = group("xy")
        asyncio.run(hub.reward_group(None, again))  # ...and the next step's loop shares the pooled session
        assert hub.remote_metrics("eval") == {"eval/reward_retries": 1.0, "eval/reward_gave_up": 0.0}
    finally:
        hub.close()
    assert samples[0].reward == {"score": 3, "label": "5", "prompt": "p"} and samples[1].reward["score"] == 5
    assert again[0].reward["score"] == 2
    assert samples[3].reward["score"] == 4  # the second answer, not the late first one
    assert _RewardModel.seen == {"abc": 2, "hello": 2, "bad request": 1, "slow": 2, "xy": 2}  # 400 never retried
    assert samples[2].status == SampleStatus.FAILED and "-> 400" in samples[2].error


def test_remote_rm_gives_up_after_its_retries():
    model = RemoteRewardModel("http://127.0.0.1:9/none", timeout_s=1, max_retries=2, max_connections=1, backoff_s=0.01)
    try:
        with pytest.raises(RuntimeError, match="failed 3 times; last error"):
            asyncio.run(model.score(Sample(response="x")))
        assert model.take_counts() == {"retries": 2, "gave_up": 1}
        assert model.take_counts() == {"retries": 0, "gave_up": 0}
    finally:
        model.close()
