"""The default rollout function against one real hf engine behind the real sglang-router (no mocks).

Over-sampling + abort + partial rollout lose and duplicate no prompt; user hooks given by import path
(generate function, dynamic filter, sample hook) run inside it; eval runs two named datasets at once.
"""

from __future__ import annotations

import dataclasses
import time
from types import SimpleNamespace

import pytest

from slime.config.hooks import load_callable
from slime.registry import REWARD_TYPES
from slime.rollout.base import EvalDataset, RolloutHooks
from slime.rollout.entry_points import ROLLOUT_FN_SHAPE
from slime.rollout.eval_metrics import eval_metrics
from slime.rollout.filters import FilterResult
from slime.rollout.generate import generate
from slime.types import SampleStatus
from tests.helpers.registry import registered
from tests.helpers.rollout_context import context, count_prompts, parity_reward, register_parity, served_engine

HERE = "tests.rollout.test_default_rollout"


def slow_parity_reward(response: str, label: str, metadata=None) -> float:
    """The parity reward after a 30 ms pause of the rollout's event loop: while the last sample of the first
    finished group is scored, the engine decodes the next wave, so the abort that follows cuts it mid-response
    (cuts of 29-94 tokens measured on a 2-core machine, idle or loaded)."""
    time.sleep(0.03)
    return parity_reward(response, label, metadata)


async def tagging_generate(args, sample, sampling_params, evaluation=False):
    """A user generate function: the default one call, plus a mark of the path taken."""
    sample = await generate(args, sample, sampling_params)
    sample.metadata["generated_by"] = "user" + ("-eval" if evaluation else "")
    return sample


def drop_even_groups(args, group):
    """A user filter: drops every group whose group_index is even."""
    return FilterResult(group[0].group_index % 2 == 1, reason="even")


def count_hook(args, sample, *, rollout_id, evaluation):
    sample.metadata["hooked_at"] = rollout_id


@pytest.fixture(scope="module")
def served(tiny_model_dir, tmp_path_factory):
    """One hf engine (2 sequences per batch: requests run in waves, so an abort catches a wave mid-decode)."""
    with served_engine(tiny_model_dir, tmp_path_factory.mktemp("rollout_logs"), max_batch_size=2) as served:
        yield served


@pytest.fixture(autouse=True)
def parity_reward_type(monkeypatch):
    register_parity(monkeypatch)
    registered(monkeypatch, REWARD_TYPES, "slow_parity", f"{HERE}.slow_parity_reward")


def rollout_fn():
    return load_callable("slime.rollout.default.generate_rollout", key="rollout.function", **ROLLOUT_FN_SHAPE)


MAX_NEW = 128  # tokens: a wave of requests decodes long enough for the abort to catch it


def continued(sample, partial: dict[int, list[int]]) -> bool:
    """Whether `sample` was cut short of its budget (its tokens when cut: `partial`) and so had to be continued."""
    return sample.index in partial and len(partial[sample.index]) - sample.prompt_length < MAX_NEW


def test_over_sampling_abort_and_partial_rollout_train_each_prompt_once(served, tmp_path):
    """Batch 1 of 3 over-sampled groups, at least 4 steps: each step keeps one group and aborts the other two,
    which return to the buffer with their partial responses (off-policy tokens masked) and finish in later steps.
    Which step first cuts a response depends on the machine's timing, so the run goes on (up to 10 steps) until a
    cut response has been resumed and trained."""
    data = count_prompts(tmp_path, served.tokenizer, "train", num_prompts=5, n=2)
    fn = rollout_fn()
    kept, partial = [], {}  # partial: sample index -> its tokens when it went back to the buffer
    aborted = 0.0
    for rollout_id in range(10):
        if rollout_id >= 4 and any(continued(s, partial) for g in kept for s in g):
            break
        ctx = context(
            served,
            batch_size=1,
            over_sampling=3,
            max_new_tokens=MAX_NEW,
            rm_type="slow_parity",
            partial_rollout=True,
            mask_offpolicy_in_partial_rollout=True,
        )
        out = fn(ctx, rollout_id, data)
        assert len(out.groups) == 1 and len(out.groups[0]) == 2
        # the two groups not kept go back to the buffer; whether they were still generating (aborted) depends on
        # the machine's timing (a busy one may finish every request of a step in the same decode batch)
        assert out.metrics["perf/rollout_leftover_groups"] == 2
        aborted += out.metrics["perf/rollout_aborted_samples"]
        kept += out.groups
        for group in data.buffer:
            assert len(group) == 2 and all(s.metadata["start_rollout_id"] <= rollout_id for s in group)
            for s in group:
                if s.status == SampleStatus.ABORTED and s.response_length:
                    partial[s.index] = list(s.tokens)  # the latest cut (a group may be cut twice)
    drawn = {s.group_index for g in kept + data.buffer for s in g}
    trained = [g[0].group_index for g in kept]
    assert len(trained) == len(set(trained)) >= 4  # no group trained twice
    assert drawn == set(range(data.sample_group_index))  # and every drawn group is trained or still buffered
    assert aborted >= 1
    resumed = [s for g in kept for s in g if s.index in partial]
    assert any(continued(s, partial) for s in resumed), "no partial response was cut by the abort and resumed later"
    for s in resumed:
        s.check_alignment()
        cut = len(partial[s.index]) - s.prompt_length
        assert s.tokens[: len(partial[s.index])] == partial[s.index]  # continued, not regenerated
        assert s.loss_mask == [0] * cut + [1] * (s.response_length - cut)  # the older policy's tokens masked
        requests = 2 if continued(s, partial) else 1  # one cut after its last token needs no other request
        assert s.response_length == MAX_NEW and s.status == SampleStatus.TRUNCATED
        assert len(s.weight_versions) >= requests
    assert all(s.reward is not None and s.status == SampleStatus.TRUNCATED for g in kept for s in g)


def test_without_partial_rollout_leftovers_return_fresh(served, tmp_path):
    data = count_prompts(tmp_path, served.tokenizer, "fresh", num_prompts=4, n=2)
    out = rollout_fn()(context(served, batch_size=1, over_sampling=3, max_new_tokens=8), 0, data)
    assert len(out.groups) == 1 and len(data.buffer) == 2
    assert {g[0].group_index for g in out.groups + data.buffer} == {0, 1, 2}
    for s in (s for g in data.buffer for s in g):
        assert s.status == SampleStatus.PENDING and s.tokens == [] and s.reward is None and s.loss_mask is None


def test_bounded_source_last_steps_take_what_is_left_then_run_out(served, tmp_path):
    """train.num_epoch bounds the source at 3 groups: the later steps draw fewer than over-sampled, the last
    keeps the last group, and a step past the bound is an error naming the cause (never a silent short batch)."""
    data = count_prompts(tmp_path, served.tokenizer, "bounded", num_prompts=5, n=2)
    data.max_groups = 3
    fn = rollout_fn()
    ctx = lambda: context(served, batch_size=1, over_sampling=3, max_new_tokens=4, partial_rollout=True)  # noqa: E731
    trained = [fn(ctx(), rollout_id, data).groups for rollout_id in range(3)]
    assert sorted(g[0].group_index for groups in trained for g in groups) == [0, 1, 2] and data.buffer == []
    with pytest.raises(RuntimeError, match=r"rollout 3: the data source ran out with 0 of rollout.batch_size=1"):
        fn(ctx(), 3, data)


def test_deterministic_partial_rollout_finishes_leftovers_and_returns_them_whole(served, tmp_path):
    """Where an abort cuts a response depends on timing: a deterministic run lets the leftovers finish, and the
    next step keeps them as they are (rewarded, not generated again)."""
    data = count_prompts(tmp_path, served.tokenizer, "det", num_prompts=4, n=2)
    ctx = context(served, batch_size=1, over_sampling=3, max_new_tokens=6, partial_rollout=True)
    ctx.sampling_seed = 1234
    first = rollout_fn()(ctx, 0, data)
    assert [g[0].group_index for g in first.groups] == [0]  # submission order, whatever finished first
    assert [g[0].group_index for g in data.buffer] == [1, 2] and first.metrics["perf/rollout_aborted_samples"] == 0
    finished = {s.index: (list(s.tokens), s.reward) for g in data.buffer for s in g}
    assert all(s.status == SampleStatus.TRUNCATED and s.response_length == 6 for g in data.buffer for s in g)
    second = rollout_fn()(dataclasses.replace(ctx, batch_size=2), 1, data)
    assert [g[0].group_index for g in second.groups] == [1, 2]
    assert {s.index: (s.tokens, s.reward) for g in second.groups for s in g} == finished
    assert all(s.weight_versions == ["0"] for g in second.groups for s in g)  # one engine call each


def test_user_generate_function_filter_and_sample_hook(served, tmp_path):
    hooks = RolloutHooks(
        generate=load_callable(f"{HERE}.tagging_generate", key="rollout.generate_function"),
        dynamic_filter=load_callable(f"{HERE}.drop_even_groups", key="algo.dynamic_filter"),
        sample_hooks=[load_callable(f"{HERE}.count_hook", key="rollout.sample_hooks[0]")],
    )
    data = count_prompts(tmp_path, served.tokenizer, "hooks", num_prompts=6, n=2)
    ctx = context(served, batch_size=2, over_sampling=2, max_new_tokens=4, hooks=hooks)
    ctx.sampling_seed = 1234  # deterministic: groups are judged in submission order, so groups 0 and 2 are dropped
    out = rollout_fn()(ctx, 7, data)
    assert sorted(g[0].group_index for g in out.groups) == [1, 3]
    assert out.metrics["rollout/dynamic_filter/drop_even"] == 2.0
    for s in (s for g in out.groups for s in g):
        assert s.metadata["generated_by"] == "user" and s.metadata["hooked_at"] == 7 and s.response_length == 4


def test_eval_runs_two_named_datasets_with_their_own_settings(served, tmp_path):
    datasets = []
    for name, n, max_new in (("short", 4, 3), ("long", 4, 6)):
        data = count_prompts(tmp_path, served.tokenizer, name, num_prompts=3, n=n)
        params = {"temperature": 1.0, "max_new_tokens": max_new, "ignore_eos": True}
        datasets.append(
            EvalDataset(
                name=name,
                source=data,
                num_prompts=3,
                n_samples_per_prompt=n,
                sampling_params=params,
                rm_type="parity",
                reward_key=None,
            )
        )
    ctx = context(served, batch_size=1, over_sampling=1, max_new_tokens=1)
    ctx.eval_datasets = datasets
    out = rollout_fn()(ctx, 0, None, evaluation=True)
    assert set(out.datasets) == {"short", "long"}
    for name, max_new in (("short", 3), ("long", 6)):
        groups = out.datasets[name]
        assert len(groups) == 3 and all(len(g) == 4 for g in groups)
        assert all(s.response_length == max_new and s.status == SampleStatus.TRUNCATED for g in groups for s in g)
        metrics = eval_metrics(name, groups, None)
        rewards = [s.reward for g in groups for s in g]
        assert metrics[f"eval/{name}"] == pytest.approx(sum(rewards) / 12)
        assert metrics[f"eval/{name}/truncated_ratio"] == 1.0 and metrics[f"eval/{name}/response_len/mean"] == max_new
        assert {k for k in metrics if "pass@" in k} == {f"eval/{name}/pass@{k}" for k in (1, 2, 4)}
        assert metrics[f"eval/{name}/pass@1"] == pytest.approx(metrics[f"eval/{name}"])
        solved = sum(any(s.reward == 1 for s in g) for g in groups) / 3
        assert metrics[f"eval/{name}/pass@4"] == pytest.approx(solved)


def test_eval_metrics_pass_at_k_on_dict_rewards():
    from slime.types import Sample

    def group(correct: int, n: int):
        return [Sample(reward={"score": float(i < correct), "acc": True}, response_length=2) for i in range(n)]

    metrics = eval_metrics("m", [group(1, 4), group(2, 4)], "score")
    assert metrics["eval/m"] == pytest.approx(3 / 8)
    assert metrics["eval/m/pass@1"] == pytest.approx((0.25 + 0.5) / 2)
    assert metrics["eval/m/pass@2"] == pytest.approx((0.5 + 5 / 6) / 2)
    assert metrics["eval/m/pass@4"] == 1.0 and "eval/m/pass@8" not in metrics
    with pytest.raises(KeyError, match="reward_key"):
        eval_metrics("m", [group(1, 4)], None)


def test_filter_drops_are_counted_and_bounded():
    from slime.rollout.default import _judge, _Step
    from slime.types import Sample

    def ctx(filter_fn):
        return SimpleNamespace(hooks=RolloutHooks(dynamic_filter=filter_fn), batch_size=2, max_filter_drops=2)

    group, step = [Sample(reward=1.0), Sample(reward=1.0)], _Step()
    zero_std = ctx(lambda args, g: FilterResult(False, "zero_std_1.0"))
    assert [_judge(zero_std, group, step) for _ in range(3)] == [False, False, True]  # past 2 drops: kept
    assert step.drops == {"drop_zero_std_1.0": 2, "forced_keep": 1}
    fallback, step = ctx(lambda args, g: FilterResult(False, "x", keep_when_insufficient=True)), _Step()
    step.pending = ["in flight"]
    assert _judge(fallback, group, step) is True  # kept 0 + 1 in flight < 2: dropping forces another round
    step.pending = ["in flight", "in flight"]
    assert _judge(fallback, group, step) is False and step.drops == {"kept_when_insufficient": 1, "drop_x": 1}
    assert _judge(ctx(lambda args, g: False), group, _Step()) is False
