"""The generate function of agentic rollouts: one episode of the user's `rollout.agent.entrypoint` per sample.

The entrypoint is called as `fn(base_url, api_key, record)` (a plain def runs on a worker thread, an async def on
the rollout's event loop) with the episode's session URL, the gateway's key and the data record (`prompt`: the
record's messages or text, `label`, `metadata`, `index`). It returns the episode's reward (a number, or a dict
with `rollout.reward_key`), or None to leave it to the run's reward (`rollout.rm_type` / `custom_rm_path`, on the
sample's whole response text). An entrypoint that raises, or runs past `rollout.agent.timeout_s`, fails its sample
(reward 0, no loss of its own), which `rollout.reward.max_failure_ratio` judges as a failed reward; the run goes
on. A turn the engine failed (its retries spent: a dead engine or router) is answered 502 and, once the entrypoint
returns or raises, fails the rollout as any generate's engine error does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from slime.config.hooks import load_callable
from slime.registry import TOOL_PARSERS
from slime.rollout.agent.gateway import AgentGateway, on_loop
from slime.rollout.agent.openai_api import RequestError
from slime.rollout.agent.session import EpisodeSession
from slime.rollout.agent.trajectory import Template, apply_turns
from slime.rollout.base import RolloutContext
from slime.rollout.default import reset_sample
from slime.rollout.entry_points import AGENT_SHAPE, agent_entrypoint_path, chat_template_text
from slime.rollout.generate import call_engine
from slime.rollout.rewards import checked_reward
from slime.types import Sample, SampleStatus


@dataclasses.dataclass(kw_only=True)
class AgentService:
    """What the rollout manager keeps for agentic rollouts: the gateway, the loaded entrypoint, its config
    (`rollout.agent`), the tool parser it names."""

    gateway: AgentGateway
    entrypoint: Any
    config: Any  # AgentConfig
    tool_parser: Any
    chat_template: str | None = None  # what the gateway renders with; None: the tokenizer's own
    # plain-def entrypoints run here, not on the event loop's default executor, which asyncio.run would wait for
    # at the rollout's end: an episode past its timeout cannot hold the step
    threads: ThreadPoolExecutor = dataclasses.field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=256, thread_name_prefix="agent-episode")
    )

    def close(self) -> None:
        self.gateway.shutdown()
        self.threads.shutdown(wait=False, cancel_futures=True)


def start_agent(config: Any) -> AgentService:
    """Load `rollout.agent`'s entrypoint and tool parser and start the gateway (validation checked both)."""
    entrypoint = load_callable(agent_entrypoint_path(config.entrypoint), key="rollout.agent.entrypoint", **AGENT_SHAPE)
    gateway = AgentGateway(host=config.host)
    gateway.start()
    parser = TOOL_PARSERS.load(config.tool_parser)()
    template = chat_template_text(config.chat_template) if config.chat_template is not None else None
    return AgentService(
        gateway=gateway, entrypoint=entrypoint, config=config, tool_parser=parser, chat_template=template
    )


def record_of(sample: Sample) -> dict[str, Any]:
    """The data record an entrypoint is given."""
    prompt = sample.messages if sample.messages is not None else sample.prompt
    return {"prompt": prompt, "label": sample.label, "metadata": dict(sample.metadata), "index": sample.index}


async def generate(args: RolloutContext, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """Run one episode; the sample's tokens are the episode's (slime.rollout.agent.session)."""
    agent: AgentService = args.agent
    sample = reset_sample(sample)  # an episode cut by the rollout's end runs again whole: the agent kept no state
    record = record_of(sample)
    episode = EpisodeSession(
        sample,
        template=Template(args.tokenizer, agent.chat_template),
        sampling_params=sampling_params,
        tool_parser=agent.tool_parser,
        max_turns=agent.config.max_turns,
    )

    engine_failures: list[Exception] = []

    async def engine(turn_sample: Sample, params: dict[str, Any]) -> dict | None:
        if args.aborted:
            raise RequestError("the rollout step has ended: this episode is not trained", status=503)
        if engine_failures:
            raise RequestError(f"the engine failed this episode: {engine_failures[0]}", status=502)
        try:
            return await call_engine(args, turn_sample, params)
        except Exception as exc:
            engine_failures.append(exc)
            raise RequestError(f"the engine failed this episode: {exc}", status=502) from exc

    session_id, base_url = agent.gateway.open(episode, on_loop(asyncio.get_running_loop(), engine))
    try:
        reward = await asyncio.wait_for(_call(agent, base_url, agent.gateway.api_key, record),
                                        timeout=agent.config.timeout_s)  # fmt: skip
    except asyncio.TimeoutError:
        _raise_engine_failure(engine_failures)
        return _failed(sample, f"timed out after rollout.agent.timeout_s={agent.config.timeout_s} s")
    except Exception as exc:  # noqa: BLE001 - user code may raise anything; the failure ratio decides
        if args.aborted:
            sample.status = SampleStatus.ABORTED
            return sample
        _raise_engine_failure(engine_failures)
        return _failed(sample, f"{type(exc).__name__}: {exc}")
    finally:
        agent.gateway.close(session_id)
    _raise_engine_failure(engine_failures)
    if args.aborted and sample.status == SampleStatus.ABORTED:
        return sample
    if not episode.turns:
        return _failed(sample, "the episode sent no request to its base_url")
    episode.check_last_turn()
    apply_turns(sample, episode.turns, agent.config.on_mismatch)
    sample.check_alignment()
    if reward is not None:
        try:
            sample.reward = checked_reward(reward, args.reward_key)
        except (TypeError, ValueError) as exc:
            return _failed(sample, f"the entrypoint returned {reward!r}: {exc}")
    return sample


async def _call(agent: AgentService, *args: Any) -> Any:
    fn = agent.entrypoint
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "func", None)):
        return await fn(*args)
    return await asyncio.get_running_loop().run_in_executor(agent.threads, fn, *args)


def _raise_engine_failure(failures: list[Exception]) -> None:
    """An engine (or its router) that failed a turn fails the rollout as a plain generate's request would, whatever
    the agent made of its 502: the rollout manager then names a dead engine (EngineDied, which fault tolerance
    recovers from), and an engine error is never an agent's failed sample."""
    if failures:
        raise failures[0]


def _failed(sample: Sample, why: str) -> Sample:
    """FAILED with the agent's error: reward 0.0 and no loss of its own (its group keeps n samples)."""
    sample.status = SampleStatus.FAILED
    sample.error = f"agent: {why}"
    sample.reward = 0.0
    sample.remove_sample = True
    sample.loss_mask = [0] * sample.response_length if sample.response_length else sample.loss_mask
    return sample
