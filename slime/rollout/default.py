"""The default rollout function: concurrent `/generate` calls through the router, rewards per sample.

A rollout function is `fn(ctx: RolloutContext, rollout_id: int, *, evaluation: bool) -> RolloutOutput`
(configured by `rollout.function`). This one (REFERENCE.md §6.1-6.2): pull groups from the data source
until `batch_size` groups are kept, generate every sample of a group concurrently under a semaphore of
concurrency × engines, reward each sample when its generation ends, return the groups sorted by index.

With `ctx.sampling_seed` set (rollout.deterministic), every request carries SGLang's per-request
`sampling_seed`, derived from that seed, the sample index and the tokens generated so far, and groups
are judged (dynamic filter, batch full) in submission order rather than completion order, so which
groups are kept does not depend on timing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from slime.rollout.data_source import DataSource
from slime.rollout.rewards import RewardHub
from slime.types import Sample, SampleStatus

RETRIES = 5  # connection errors and 5xx only; 4xx are bugs and surface at once


@dataclasses.dataclass(kw_only=True)
class RolloutContext:
    """What a rollout function may use; built by the rollout manager."""

    router_url: str
    tokenizer: Any
    data_source: DataSource
    batch_size: int  # groups to keep
    over_sampling_batch_size: int  # groups per refill
    sampling_params: dict[str, Any]  # SGLang sampling params; max_new_tokens is the response budget
    max_in_flight: int  # concurrency × number of engines
    rewards: RewardHub  # scores samples (rollout.rm_type / custom_rm_path / group_rm)
    dynamic_filter: Callable[[list[Sample]], Any] | None = None  # group -> bool | FilterResult
    max_filter_drops: int = 0  # past this many drops in one step, groups are kept regardless (no endless loop)
    sampling_seed: int | None = None  # base of per-request seeds (rollout.deterministic); None: engine's RNG


@dataclasses.dataclass
class RolloutOutput:
    """What a rollout function returns: the kept groups (each n samples) and its metrics."""

    groups: list[list[Sample]]
    metrics: dict[str, float]


def request_seed(base: int, sample: Sample) -> int:
    """SGLang `sampling_seed` of `sample`'s next request: a 31-bit hash of (base, index, tokens so far)."""
    digest = hashlib.blake2b(f"{base}:{sample.index}:{sample.response_length}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF


async def _post_generate(session: aiohttp.ClientSession, url: str, payload: dict) -> dict:
    for attempt in range(RETRIES):
        try:
            async with session.post(f"{url}/generate", json=payload) as resp:
                if resp.status < 500:
                    body = await resp.text()
                    if resp.status != 200:
                        raise RuntimeError(f"POST {url}/generate -> {resp.status}: {body[:500]}")
                    return json.loads(body)
                error = f"{resp.status}: {(await resp.text())[:200]}"
        except aiohttp.ClientConnectionError as exc:
            error = repr(exc)
        await asyncio.sleep(min(2**attempt * 0.2, 5))
    raise RuntimeError(f"POST {url}/generate failed {RETRIES} times, last error {error}")


async def generate_sample(ctx: RolloutContext, session: aiohttp.ClientSession, sample: Sample) -> Sample:
    """Generate the response of one PENDING/ABORTED sample and record tokens, log-probs, status."""
    if not sample.tokens:
        if not isinstance(sample.prompt, str):
            raise ValueError(
                f"sample {sample.index}: the prompt is a list of chat messages; generation needs text "
                "(set data.apply_chat_template=true)"
            )
        sample.tokens = ctx.tokenizer(sample.prompt, add_special_tokens=False)["input_ids"]
    budget = ctx.sampling_params["max_new_tokens"] - sample.response_length
    if budget <= 0:
        sample.status = SampleStatus.TRUNCATED
        return sample
    params = {**ctx.sampling_params, "max_new_tokens": budget}
    if ctx.sampling_seed is not None:
        params["sampling_seed"] = request_seed(ctx.sampling_seed, sample)
    payload = {"input_ids": sample.tokens, "sampling_params": params, "return_logprob": True}
    out = await _post_generate(session, ctx.router_url, payload)
    meta = out["meta_info"]
    logprobs = meta["output_token_logprobs"]
    sample.append_response([int(t[1]) for t in logprobs], [float(t[0]) for t in logprobs], out["text"])
    sample.weight_versions.append(str(meta.get("weight_version")))
    sample.status = SampleStatus.from_finish_reason(meta["finish_reason"]["type"])
    sample.check_alignment()
    return sample


async def _generate_group(ctx, session, semaphore, group: list[Sample]) -> list[Sample]:
    async def one(sample: Sample) -> Sample:
        async with semaphore:
            await generate_sample(ctx, session, sample)
        if not ctx.rewards.group_rm:
            await ctx.rewards.reward_group(ctx, [sample])
        return sample

    group = list(await asyncio.gather(*(one(s) for s in group)))
    await ctx.rewards.reward_group(ctx, group)  # group_rm: one call for the group (a no-op otherwise)
    return group


def _filter(ctx: RolloutContext, group: list[Sample], drops: dict[str, int]) -> bool:
    """Apply the dynamic filter; count drops by reason. Keeps everything past `max_filter_drops`."""
    if ctx.dynamic_filter is None:
        return True
    result = ctx.dynamic_filter(group)
    keep, reason = (result, None) if isinstance(result, bool) else (result.keep, result.reason)
    if keep:
        return True
    if sum(drops.values()) >= ctx.max_filter_drops:
        drops["forced_keep"] = drops.get("forced_keep", 0) + 1
        return True
    key = f"drop_{reason}" if reason else "drop"
    drops[key] = drops.get(key, 0) + 1
    return False


async def _run(ctx: RolloutContext) -> tuple[list[list[Sample]], dict[str, int]]:
    semaphore = asyncio.Semaphore(ctx.max_in_flight)
    connector = aiohttp.TCPConnector(limit=ctx.max_in_flight)
    kept: list[list[Sample]] = []
    drops: dict[str, int] = {}
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        pending: list[asyncio.Task] = []  # in submission order
        leftovers: list[list[Sample]] = []
        while len(kept) < ctx.batch_size:
            if len(kept) + len(pending) < ctx.batch_size:  # slime: (submitted - dropped) < batch_size
                for group in ctx.data_source.get_groups(ctx.over_sampling_batch_size):
                    pending.append(asyncio.create_task(_generate_group(ctx, session, semaphore, group)))
            if ctx.sampling_seed is not None:  # deterministic: the oldest group first, whenever it finishes
                await asyncio.wait(pending[:1])
                done = pending[:1]
            else:
                finished, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                done = [t for t in pending if t in finished]
            pending = [t for t in pending if t not in done]
            for task in done:
                group = task.result()
                if len(kept) >= ctx.batch_size:
                    leftovers.append(group)
                elif _filter(ctx, group, drops):
                    kept.append(group)
        # Over-sampled groups still in flight are finished, reset and returned to the buffer, so no prompt is
        # lost; the next step regenerates them with the new policy.
        leftovers.extend(await asyncio.gather(*pending))
        leftovers.sort(key=lambda g: g[0].index)
        ctx.data_source.add_groups([_reset(g) for g in leftovers])
    kept.sort(key=lambda g: g[0].index)
    return kept, drops


def _reset(group: list[Sample]) -> list[Sample]:
    fresh = []
    for s in group:
        fresh.append(
            dataclasses.replace(
                s,
                tokens=[],
                response="",
                response_length=0,
                loss_mask=None,
                rollout_log_probs=None,
                reward=None,
                status=SampleStatus.PENDING,
                weight_versions=[],
                error=None,
                remove_sample=False,
            )
        )
    return fresh


def generate_rollout(ctx: RolloutContext, rollout_id: int, *, evaluation: bool = False) -> RolloutOutput:
    """Run one rollout step synchronously (an event loop per call); see the module docstring."""
    start = time.perf_counter()
    groups, drops = asyncio.run(_run(ctx))
    metrics = {"perf/rollout_time": time.perf_counter() - start}
    metrics.update({f"rollout/dynamic_filter/{reason}": float(count) for reason, count in drops.items()})
    return RolloutOutput(groups=groups, metrics=metrics)
