"""The agent gateway against a real hf engine behind the real sglang-router, driven by plain `openai` client
agents (tests/helpers/agents.py): every turn's prompt is the episode's ids so far plus the rendered suffix, the
trained ids are the sampled ids, a re-rendering that differs is counted and not trained, and bad requests are
refused with a status and a reason."""

from __future__ import annotations

import asyncio
import copy
from types import SimpleNamespace

import aiohttp
import openai
import pytest
import requests

from slime.config.schema import AgentConfig, RouterConfig
from slime.engine.router import Router
from slime.net import free_port
from slime.rollout.agent.episode import generate, start_agent
from slime.rollout.agent.trajectory import agent_metrics
from slime.rollout.agent.turn_samples import expand_steps, split_turns
from slime.rollout.rewards import RewardFailureError, check_failures
from slime.types import SampleStatus
from tests.helpers.fake_sglang_engine import make_engine
from tests.helpers.rollout_context import context, count_prompts, served_engine

MAX_NEW = 40  # tokens of an episode's response: sampled and added


@pytest.fixture(scope="module")
def served(tiny_model_dir, tmp_path_factory):
    with served_engine(tiny_model_dir, tmp_path_factory.mktemp("agent_logs")) as served:
        yield served


def agent_context(served, entrypoint: str, tokenizer=None, **agent):
    ctx = context(served, batch_size=1, over_sampling=1, max_new_tokens=MAX_NEW, rm_type="first_word")
    ctx.sampling_params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": MAX_NEW}
    ctx.reward_key = "reward"
    ctx.agent = start_agent(AgentConfig(entrypoint=entrypoint, tool_parser="tiny", **agent))
    if tokenizer is not None:
        ctx.tokenizer = tokenizer
    return ctx


def episodes(ctx, tmp_path, num: int):
    """Run `num` episodes concurrently, one per prompt "Count to i."; the gateway is shut down after."""
    data = count_prompts(tmp_path, ctx.tokenizer, "prompts", num, n=1)
    samples = [g[0] for g in data.get_groups(num)]

    async def run():
        async with aiohttp.ClientSession() as session:
            ctx.session = session
            return await asyncio.gather(*(generate(ctx, s, ctx.sampling_params) for s in samples))

    try:
        return asyncio.run(run())
    finally:
        ctx.agent.close()


def round_trips(tokenizer, sampled: list[int]) -> bool:
    """Whether the text an answer carries gives back its ids (the tiny tokenizer spells every id back, special
    tokens included, except that the decoded text of two ids may join: "<unk>" next to a word)."""
    ids = sampled[:-1] if sampled[-1] == tokenizer.eos_token_id else sampled
    return tokenizer(tokenizer.decode(ids, skip_special_tokens=False), add_special_tokens=False)["input_ids"] == ids


def test_every_turn_trains_exactly_the_ids_it_sampled(served, tmp_path):
    """Three turns (one streamed): each turn's prompt begins with every earlier turn's prompt and sampled ids; the
    sampled ids carry loss mask 1 and the log-probs the API returned, every id the gateway added mask 0; a turn
    whose text cannot give its ids back (a sampled special token) is counted a mismatch and not trained."""
    ctx = agent_context(served, "tests.helpers.agents.chat_three_turns")
    faithful = 0
    for sample in episodes(ctx, tmp_path, 4):
        assert sample.status in (SampleStatus.COMPLETED, SampleStatus.TRUNCATED), sample.error
        sample.check_alignment()
        turns, first = sample.metadata["agent"]["turns"], sample.metadata["agent"]["first_prompt_length"]
        assert len(turns) == 3 and sample.prompt_length == first == turns[0]["prompt_length"]
        trained, sampled = [i for i, m in enumerate(sample.loss_mask) if m], []
        for k, turn in enumerate(turns):
            start = turn["prompt_length"]
            assert sample.tokens[start : start + len(turn["sampled"])] == turn["sampled"]  # byte for byte
            if k:  # the prompt grew from the last turn's ids: nothing before it was tokenized again
                assert start > turns[k - 1]["prompt_length"] + len(turns[k - 1]["sampled"])
            span = list(range(start - first, start - first + len(turn["sampled"])))
            sampled += span
            assert turn["weight_version"] == "0" and turn["mismatch"] is not round_trips(
                served.tokenizer, turn["sampled"]
            )
            faithful += not turn["mismatch"]
            assert [sample.loss_mask[i] for i in span] == [int(not turn["mismatch"])] * len(span)
        assert set(trained) <= set(sampled)
        assert all(sample.rollout_log_probs[i] == 0.0 for i in range(sample.response_length) if i not in sampled)
        seen = sample.reward["seen"]
        for k in (0, 2):  # what the API answered is what is trained
            start = turns[k]["prompt_length"] - first
            assert seen[k]["logprobs"] == sample.rollout_log_probs[start : start + len(turns[k]["sampled"])]
        assert sample.reward["reward"] == float(len("".join(s["content"] for s in seen)))
        # the conversation, rendered by the template, is the sample's ids (the tiny template renders faithfully)
        text = served.tokenizer.decode(sample.tokens, skip_special_tokens=False)
        assert text.count("what comes next ?") == 2
    assert faithful >= 3, "too few turns round-trip: the check of faithful turns was hardly exercised"


def test_each_turn_as_a_sample_is_the_episode_cut_after_its_sampled_ids(served, tmp_path):
    """rollout.agent.samples=turns: turn t's sample is the episode's ids up to the end of its sampled ids; its
    response is exactly those ids with the log-probs the API answered; together the turns train exactly the ids the
    episode trains; the optimizer steps keep their episodes, and each carries its episode's rewards."""
    samples = episodes(agent_context(served, "tests.helpers.agents.chat_three_turns"), tmp_path, 4)
    for sample in samples:
        turns, first = sample.metadata["agent"]["turns"], sample.metadata["agent"]["first_prompt_length"]
        pieces = split_turns(sample)
        assert len(pieces) == 3 and [p.metadata["agent_turn"] for p in pieces] == [0, 1, 2]
        trained = []
        for piece, turn in zip(pieces, turns):
            end = turn["prompt_length"] + len(turn["sampled"])
            assert piece.tokens == sample.tokens[:end] and piece.tokens[piece.prompt_length :] == turn["sampled"]
            assert piece.loss_mask == [int(not turn["mismatch"])] * len(turn["sampled"])
            trained += [(piece.prompt_length + i, t) for i, t in enumerate(turn["sampled"]) if piece.loss_mask[i]]
        assert trained == [(first + i, sample.tokens[first + i]) for i, m in enumerate(sample.loss_mask) if m]
        seen = sample.reward["seen"]
        assert pieces[0].rollout_log_probs == seen[0]["logprobs"] and pieces[2].rollout_log_probs == seen[2]["logprobs"]
        assert pieces[2].status == sample.status and pieces[0].status == SampleStatus.COMPLETED
    failed = copy.deepcopy(samples[0])
    failed.remove_sample = True
    out, raw, rewards, steps = expand_steps([*samples, failed, failed], [1.0] * 6, [0.5, -0.5] * 3,
                                            global_batch_size=2, num_steps=3)  # fmt: skip
    assert steps == [6, 6, 2] and len(out) == len(raw) == len(rewards) == 14
    assert rewards[:6] == [0.5] * 3 + [-0.5] * 3 and out[-1] is failed


def test_completions_continue_the_session_ids(served, tmp_path):
    """A text prompt, then that prompt plus its answer plus more text: the second prompt is the first's ids, the
    sampled ids, then only the new text's ids. No reward returned: the run's reward type scores the response."""
    ctx = agent_context(served, "tests.helpers.agents.completions_two_turns")
    for sample in episodes(ctx, tmp_path, 3):
        turns = sample.metadata["agent"]["turns"]
        assert len(turns) == 2
        assert [t["mismatch"] for t in turns] == [not round_trips(served.tokenizer, t["sampled"]) for t in turns]
        first_end = turns[0]["prompt_length"] + len(turns[0]["sampled"])
        added = sample.tokens[first_end : turns[1]["prompt_length"]]
        assert served.tokenizer.convert_ids_to_tokens(added) == ["next"]
        assert sample.reward is None  # left to the reward type (generate_and_reward scores it)


def drifting(tokenizer):
    """The tiny tokenizer with a template that renders an assistant's earlier turn with a ":" after its role, which
    its generation prompt does not have: no sampled answer is what the template renders back."""
    drifted = copy.deepcopy(tokenizer)
    turn = "{{ '<|im_start|>' + message['role'] + '\n' + opening + (message['content'] or '') }}"
    assert tokenizer.chat_template.count(turn) == 1
    drifted.chat_template = tokenizer.chat_template.replace(
        turn,
        "{{ '<|im_start|>' + message['role'] + (' :' if message['role'] == 'assistant' else '') + '\n' "
        "+ opening + (message['content'] or '') }}",
    )
    return drifted


def test_a_planted_drift_is_counted_and_nothing_of_its_turn_is_trained(served, tmp_path):
    tokenizer = drifting(served.tokenizer)
    history = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "3"}]
    assert "assistant :\n3" in tokenizer.apply_chat_template(history, tokenize=False)  # the planted separator
    ctx = agent_context(served, "tests.helpers.agents.chat_three_turns", tokenizer=tokenizer)
    samples = episodes(ctx, tmp_path, 3)
    for sample in samples:
        first = sample.metadata["agent"]["first_prompt_length"]
        for turn in sample.metadata["agent"]["turns"]:
            assert turn["mismatch"] is (turn["sampled"][0] != tokenizer.convert_tokens_to_ids(":"))
            start = turn["prompt_length"] - first
            mask = sample.loss_mask[start : start + len(turn["sampled"])]
            assert mask == [int(not turn["mismatch"])] * len(turn["sampled"])  # drop_turn: context, not trained
    mismatched = sum(t["mismatch"] for s in samples for t in s.metadata["agent"]["turns"])
    assert mismatched >= 8 and agent_metrics(samples)["agent/retokenization_mismatch"] == mismatched


def test_drop_episode_trains_nothing_of_a_drifting_episode(served, tmp_path):
    ctx = agent_context(served, "tests.helpers.agents.chat_three_turns", tokenizer=drifting(served.tokenizer),
                        on_mismatch="drop_episode")  # fmt: skip
    for sample in episodes(ctx, tmp_path, 3):
        if sample.metadata["agent"]["mismatched_turns"]:
            assert sample.remove_sample and not any(sample.loss_mask)


def test_failed_agents_fail_their_samples_and_the_ratio_judges_them(served, tmp_path):
    """An agent that raises for one prompt in ten, one that outlives its timeout, one that never calls: FAILED
    samples (reward 0, no loss), counted by check_failures against rollout.reward.max_failure_ratio."""
    samples = episodes(agent_context(served, "tests.helpers.agents.raises_in_one_of_ten"), tmp_path, 20)
    failed = [s for s in samples if s.status == SampleStatus.FAILED]
    assert len(failed) == 2 and all(s.error == "agent: RuntimeError: the agent's tool crashed" for s in failed)
    assert all(s.reward == 0.0 and s.remove_sample for s in failed)
    assert check_failures(samples, 0.3)["rollout/reward_failed"] == len(failed)
    assert agent_metrics(samples)["agent/failed_episodes"] == len(failed)
    with pytest.raises(RewardFailureError, match="failed their reward or agent episode"):
        check_failures(samples, 0.0)
    (slow,) = episodes(agent_context(served, "tests.helpers.agents.sleeps", timeout_s=0.5), tmp_path, 1)
    assert slow.status == SampleStatus.FAILED and slow.error == "agent: timed out after rollout.agent.timeout_s=0.5 s"
    (idle,) = episodes(agent_context(served, "tests.helpers.agents.no_request"), tmp_path, 1)
    assert idle.error == "agent: the episode sent no request to its base_url"


def test_an_engine_that_fails_a_turn_fails_the_rollout_not_the_sample(served, tmp_path):
    """The router gone (a closed port): the turn's request spends its retries, the agent is answered 502 naming the
    engine's error, and the episode raises that error (the rollout manager then names a dead engine) instead of
    returning a FAILED sample the failure ratio would count as the agent's."""
    ctx = agent_context(served, "tests.helpers.agents.chat_three_turns")
    ctx.router_url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RuntimeError, match=r"POST http://127\.0\.0\.1:\d+/generate failed 5 times") as failed:
        episodes(ctx, tmp_path, 1)
    answered = failed.value.__context__  # what the agent's client raised while the episode's error was raised
    assert isinstance(answered, openai.InternalServerError) and answered.status_code == 502
    assert "the engine failed this episode: POST" in answered.message


def test_requests_outside_an_episode_are_refused_with_why(served, tmp_path):
    ctx = agent_context(served, "tests.helpers.agents.no_request")
    gateway = ctx.agent.gateway
    try:
        auth = {"Authorization": f"Bearer {gateway.api_key}"}
        body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
        r = requests.post(f"{gateway.url}/v1/chat/completions", json=body, headers=auth, timeout=10)
        assert r.status_code == 400 and "no session" in r.json()["error"]["message"]
        r = requests.post(f"{gateway.url}/sessions/abc/v1/chat/completions", json=body, headers=auth, timeout=10)
        assert r.status_code == 404 and "session abc is not open" in r.json()["error"]["message"]
        r = requests.post(f"{gateway.url}/sessions/abc/v1/chat/completions", json=body, timeout=10)
        assert r.status_code == 401
    finally:
        gateway.shutdown()


def test_episodes_through_sglangs_own_request_types(tiny_model_dir, tmp_path):
    """The same episodes against the fake SGLang server behind the router: every turn's /generate body is built into
    SGLang 0.5.23's GenerateReqInput and SamplingParams (tests/fakes/fake_sglang.py refuses what SGLang would), and
    its answer (output_token_logprobs, weight_version, finish_reason) is read into the turns."""
    from transformers import AutoTokenizer

    router = Router.launch(cfg=RouterConfig(startup_timeout_s=120), log_path=tmp_path / "router.log")
    engine = make_engine(tiny_model_dir, tmp_path / "logs")
    try:
        engine.start()
        router.add_worker(engine.url)
        served = SimpleNamespace(url=router.url, tokenizer=AutoTokenizer.from_pretrained(tiny_model_dir))
        samples = episodes(agent_context(served, "tests.helpers.agents.chat_three_turns"), tmp_path, 3)
    finally:
        engine.shutdown()
        router.shutdown()
    for sample in samples:
        assert sample.status != SampleStatus.FAILED, sample.error
        turns = sample.metadata["agent"]["turns"]
        assert len(turns) == 3 and all(t["weight_version"] for t in turns)
        for turn in turns:
            start = turn["prompt_length"]
            assert sample.tokens[start : start + len(turn["sampled"])] == turn["sampled"]
            assert turn["mismatch"] is not round_trips(served.tokenizer, turn["sampled"])
