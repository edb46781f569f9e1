"""One sample: the default generate function and generate -> hooks -> reward
(docs/data-and-rewards.md#generating-one-sample).

`generate(args, sample, sampling_params)` is the default of `rollout.generate_function`: one
`/generate` call through the router that continues from the sample's tokens (a partial sample resumes
where it stopped). Custom generate functions build on `call_engine` + `append_engine_output`, which
keep the alignment invariants (docs/architecture.md#alignment-invariants).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
from typing import Any

import aiohttp

from slime.engine.router import DROPPED_REQUEST_FIELDS, DROPPED_SAMPLING_PARAMS, Router
from slime.registry import generate_protocol
from slime.rollout.base import RolloutContext, accepts_keyword, call_maybe_async
from slime.rollout.staleness import as_version, token_versions
from slime.types import Sample, SampleStatus

RETRIES = 5  # connection errors and 5xx only; 4xx are bugs and surface at once


def request_seed(base: int, sample: Sample) -> int:
    """SGLang `sampling_seed` of `sample`'s next request: a 31-bit hash of (base, index, tokens so far)."""
    digest = hashlib.blake2b(f"{base}:{sample.index}:{sample.response_length}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF


async def post_json(session: aiohttp.ClientSession, url: str, payload: dict, timeout_s: float | None = None) -> dict:
    """POST with retries on connection errors, timeouts (a dead or hung engine) and 5xx (a 4xx is raised at
    once with its body); `timeout_s` bounds each attempt."""
    error = ""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    for attempt in range(RETRIES):
        try:
            async with session.post(url, json=payload, timeout=timeout) as resp:
                if resp.status < 500:
                    body = await resp.text()
                    if resp.status != 200:
                        raise RuntimeError(f"POST {url} -> {resp.status}: {body[:500]}")
                    return json.loads(body)
                error = f"{resp.status}: {(await resp.text())[:200]}"
        except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as exc:
            error = repr(exc)
        if attempt + 1 < RETRIES:
            await asyncio.sleep(min(2**attempt * 0.2, 5))
    raise RuntimeError(f"POST {url} failed {RETRIES} times, last error {error}")


def prompt_ids(args: RolloutContext, sample: Sample) -> list[int]:
    """The sample's tokens so far; a fresh sample's prompt tokenised (the chat template added special tokens; an
    image's placeholder repeated once per image token)."""
    if not sample.tokens:
        if not isinstance(sample.prompt, str):
            raise ValueError(
                f"sample {sample.index}: the prompt is a list of chat messages; generation needs text "
                "(set data.apply_chat_template=true)"
            )
        if sample.images:
            if args.prompt_images is None:
                raise ValueError(f"sample {sample.index} has images, and the policy model reads none")
            sample.tokens = args.prompt_images.prompt_ids(args.tokenizer, sample.prompt, sample.images)
        else:
            sample.tokens = list(args.tokenizer(sample.prompt, add_special_tokens=False)["input_ids"])
    return sample.tokens


async def call_engine(args: RolloutContext, sample: Sample, sampling_params: dict[str, Any]) -> dict | None:
    """POST router /generate continuing `sample` for the rest of its budget; None when no budget is left
    (the sample is then TRUNCATED). `sampling_params["max_new_tokens"]` is the budget of the whole response.
    With rollout.engine=vllm the call is vLLM's /inference/v1/generate; the answer has SGLang's shape either way."""
    budget = sampling_params["max_new_tokens"] - sample.response_length
    if budget <= 0:
        sample.status = SampleStatus.TRUNCATED
        return None
    params = {**sampling_params, "max_new_tokens": budget}
    if args.sampling_seed is not None:
        params["sampling_seed"] = request_seed(args.sampling_seed, sample)
    protocol = generate_protocol(args.config.engine)
    if protocol is not None:  # e.g. vLLM's token-level endpoint, answered in the SGLang shape (as vime does)
        payload = protocol.generate_payload(prompt_ids(args, sample), params, args.lora_adapter)
        out = await post_json(args.session, args.router_url + protocol.GENERATE_PATH, payload, args.request_timeout_s)
        skip = params.get("skip_special_tokens", True)  # the text SGLang would return for these params
        return protocol.as_sglang_output(out, lambda ids: args.tokenizer.decode(ids, skip_special_tokens=skip))
    dropped = sorted(DROPPED_SAMPLING_PARAMS.intersection(params))
    if dropped:  # the engine would sample without them, and nothing would say so
        raise ValueError(
            f"sampling params {dropped} do not reach the engine: sglang-router drops them from /generate "
            "(slime.engine.router.DROPPED_SAMPLING_PARAMS); remove them from the generate function's sampling params"
        )
    payload = {"input_ids": prompt_ids(args, sample), "sampling_params": params, "return_logprob": True}
    if sample.images:  # SGLang's `image_data`: the references, the ids holding each image's tokens already
        payload["image_data"] = list(sample.images)
    if args.return_routed_experts:  # the whole sequence's (routed_experts_start_len 0): a resumed sample's too
        payload["return_routed_experts"] = True
    if args.lora_adapter is not None:  # the engines serve the policy's adapter under this name (slime.sync.adapter)
        payload["lora_path"] = args.lora_adapter
    url = await _worker_url(args, sample) if DROPPED_REQUEST_FIELDS.intersection(payload) else args.router_url
    return await post_json(args.session, f"{url}/generate", payload, args.request_timeout_s)


async def _worker_url(args: RolloutContext, sample: Sample) -> str:
    """The worker a request the router would strip goes to directly: one of the router's workers (listed once per
    rollout call), the same for every sample of a group (they share the prompt: its cached prefix)."""
    if not args.worker_urls:
        workers = await asyncio.to_thread(Router(args.router_url).list_workers)
        args.worker_urls = sorted(w["url"] for w in workers)
    if not args.worker_urls:
        raise RuntimeError(f"the router at {args.router_url} lists no workers")
    return args.worker_urls[(sample.group_index or 0) % len(args.worker_urls)]


def append_engine_output(sample: Sample, out: dict) -> None:
    """Append an engine response: its tokens (loss mask 1), log-probs, text, weight version (the call's, and each
    token's), status and, when the engine returned them, the routes of the whole sequence so far."""
    meta = out["meta_info"]
    logprobs = meta["output_token_logprobs"]
    version = str(meta.get("weight_version"))
    ids, lps = [int(t[1]) for t in logprobs], [float(t[0]) for t in logprobs]
    per_token = token_versions(meta.get("weight_versions") or [], len(ids), version)
    # one append per run of equal versions (at least one: an empty answer still records no token's version);
    # the text goes with the last
    runs = [(v, len(list(run))) for v, run in itertools.groupby(per_token)] or [(version, 0)]
    start = 0
    for i, (token_version, count) in enumerate(runs):
        text = out["text"] if i == len(runs) - 1 else ""
        end = start + count
        sample.append_response(ids[start:end], lps[start:end], text, weight_version=as_version(token_version))
        start = end
    sample.weight_versions.append(version)
    sample.status = SampleStatus.from_finish_reason(meta["finish_reason"]["type"])
    if meta.get("routed_experts") is not None:
        sample.routed_experts = meta["routed_experts"]
    sample.check_alignment()


async def generate(args: RolloutContext, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """The default generate function: one engine call for the rest of the sample's budget."""
    out = await call_engine(args, sample, sampling_params)
    if out is not None:
        append_engine_output(sample, out)
        if args.return_routed_experts and sample.routed_experts is None:
            raise RuntimeError(
                "algo.routing_replay=rollout: the engine returned no routed experts (meta_info.routed_experts); "
                "its server must run with --enable-return-routed-experts and serve an MoE model"
            )
    return sample


def mask_older_tokens(sample: Sample) -> None:
    """Loss mask 0 for the response tokens an older weight version sampled than its newest tokens' (a request an
    in-place pause held across a push: the engine's per-token versions say which)."""
    if sample.token_versions:
        newest = max(sample.token_versions)
        sample.loss_mask = [0 if v < newest else m for v, m in zip(sample.token_versions, sample.loss_mask)]


async def generate_and_reward(
    args: RolloutContext, sample: Sample, sampling_params: dict[str, Any], *, rollout_id: int, evaluation: bool
) -> Sample:
    """Generate a PENDING/ABORTED sample (unless the rollout aborted), run the sample hooks, reward it (a hub
    call that skips rewarded and ABORTED samples)."""
    if sample.status in (SampleStatus.PENDING, SampleStatus.ABORTED):
        if args.aborted:
            sample.status = SampleStatus.ABORTED
            return sample
        if sample.response_length and args.config.mask_offpolicy_in_partial_rollout:
            sample.loss_mask = [0] * sample.response_length  # an older policy produced them
        fn = args.hooks.generate or generate
        extra = {"evaluation": evaluation} if accepts_keyword(fn, "evaluation") else {}
        result = await fn(args, sample, sampling_params, **extra)
        if not isinstance(result, Sample):
            raise TypeError(f"rollout.generate_function returned {type(result).__name__}; expected the Sample")
        sample = result
        if args.config.mask_offpolicy_in_partial_rollout:
            mask_older_tokens(sample)
    if sample.status == SampleStatus.ABORTED:
        return sample
    for hook in args.hooks.sample_hooks:
        sample = await call_maybe_async(hook, args, sample, rollout_id=rollout_id, evaluation=evaluation) or sample
    if not args.rewards.group_rm:  # with a group RM, the group is rewarded once all its samples are done
        await args.rewards.reward_group(args, [sample], rm_type=args.rm_type)
    return sample
