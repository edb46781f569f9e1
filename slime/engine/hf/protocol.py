"""SGLang's `/generate` wire format: request body → `GenerationRequest`s, results → response dicts.

Request: `{input_ids: [int] | [[int]], text?: str | [str], sampling_params: {...} | [{...}],
return_logprob?: bool | [bool], return_text_in_logprobs?: bool, rid?: str | [str], return_routed_experts?: bool,
routed_experts_start_len?: int, lora_path?: str | [str], image_data?: str | [str] | [[str]], ...}` (`lora_path`:
the name of a loaded LoRA adapter, `lora_routes.py`; `image_data`: a prompt's image references, one list per input
of a batch, `vision.py`). Any other
top-level key (the router adds model, stream, log_metrics, return_hidden_states, background, no_logs,
return_bytes, return_entropy, ...) is ignored; `stream: true` is refused (no streaming here).
A list input is a batch and is answered with a list, in order.

Response per item: `{"text", "output_ids", "meta_info": {"id", "finish_reason", "prompt_tokens",
"completion_tokens", "cached_tokens" (prefix-cache hits, `Generator.generate`), "weight_version",
"weight_versions": [{version, start, end}] (which version sampled which output tokens; several for a request an
in-place pause held across a weight update, `request.version_spans`), "queue_time" (s), "e2e_latency" (s),
"output_token_logprobs": [[logprob, token_id, token_text | None], ...] (only with return_logprob),
"routed_experts": base64 of int32 [prompt + output - 1 - routed_experts_start_len, MoE layers, top-k] (only with
return_routed_experts on a server started with --enable-return-routed-experts, as SGLang)}}`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slime.engine.hf.generator import GenerationError, GenerationRequest
from slime.engine.hf.sampling import SamplingParams
from slime.models.moe.routes import encode_routes


@dataclass
class GenerateCall:
    """A parsed `/generate` body: one entry per input, plus whether the input was a batch."""

    requests: list[GenerationRequest]
    return_logprob: list[bool]
    text_in_logprobs: list[bool]
    batch: bool
    routes_from: list[int | None]  # per input: the first position whose routed experts are returned (None: none)


def _per_item(value: Any, n: int, name: str, batch: bool) -> list:
    """Broadcast a scalar/dict field to n items, or check a per-item list of a batch."""
    if batch and isinstance(value, list):
        if len(value) != n:
            raise GenerationError(f"{name} has {len(value)} entries for {n} inputs")
        return value
    return [value] * n


def parse_generate(body: dict, encode: Callable[[str], list[int]]) -> GenerateCall:
    """Validate and split a body; `encode(text) -> ids` tokenises `text` inputs. Raises ValueError."""
    if body.get("stream"):
        raise GenerationError("stream=true is not supported by the hf engine")
    input_ids, text = body.get("input_ids"), body.get("text")
    if input_ids is not None:
        batch = isinstance(input_ids, list) and bool(input_ids) and isinstance(input_ids[0], list)
        prompts = input_ids if batch else [input_ids]
    elif text is not None:
        batch = isinstance(text, list)
        prompts = [encode(str(t)) for t in (text if batch else [text])]
    else:
        raise GenerationError("Either text or input_ids should be provided.")
    n = len(prompts)
    params = _per_item(body.get("sampling_params") or {}, n, "sampling_params", batch)
    logprob = _per_item(body.get("return_logprob", False), n, "return_logprob", batch)
    text_lp = _per_item(body.get("return_text_in_logprobs", False), n, "return_text_in_logprobs", batch)
    rids = _per_item(body.get("rid"), n, "rid", batch)
    routed = _per_item(body.get("return_routed_experts", False), n, "return_routed_experts", batch)
    starts = _per_item(body.get("routed_experts_start_len", 0), n, "routed_experts_start_len", batch)
    adapters = _per_item(body.get("lora_path"), n, "lora_path", batch)
    images = _images(body.get("image_data"), n, batch)
    requests = []
    for prompt, sp, rid, adapter, refs in zip(prompts, params, rids, adapters, images):
        if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
            raise GenerationError("input_ids must be a list of ints or a list of lists of ints")
        if not isinstance(sp, dict):
            raise GenerationError("sampling_params must be a JSON object")
        rid = rid if rid is not None else uuid.uuid4().hex
        if adapter is not None and not isinstance(adapter, str):
            raise GenerationError("lora_path must name a loaded LoRA adapter")
        requests.append(GenerationRequest(prompt, SamplingParams.from_dict(sp), rid, lora=adapter, images=refs))
    routes_from = [_routes_start(int(start)) if want else None for want, start in zip(routed, starts)]
    return GenerateCall(requests, [bool(x) for x in logprob], [bool(x) for x in text_lp], batch, routes_from)


def _images(value: Any, n: int, batch: bool) -> list[list[str] | None]:
    """Per input, its image references: SGLang's `image_data` of one input is a reference or a list of them; a
    batch's is one such entry per input."""
    if value is None:
        return [None] * n
    entries = value if batch else [value]
    if batch and (not isinstance(value, list) or len(value) != n):
        raise GenerationError(f"image_data needs one entry per input ({n} inputs)")
    out = []
    for entry in entries:
        refs = [entry] if isinstance(entry, str) else entry
        if refs is not None and (not isinstance(refs, list) or not all(isinstance(r, str) and r for r in refs)):
            raise GenerationError("image_data must hold image references (paths, URLs or base64 strings)")
        out.append(refs or None)
    return out


def _routes_start(start: int) -> int:
    """SGLang 0.5.23 `state_capturer/base.py:BaseTopkCapturer.get_topk`: a negative start is an error."""
    if start < 0:
        raise GenerationError(f"start_len={start} must be non-negative")
    return start


def generate_response(call: GenerateCall, completions: list, decode_token: Callable[[int], str], arrived: float):
    """Response body (a dict, or a list for a batch). `arrived` is the request's `time.perf_counter()`."""
    out = []
    for i, (req, done) in enumerate(zip(call.requests, completions)):
        res = done.result
        meta = {
            "id": req.rid,
            "finish_reason": res.finish_reason,
            "prompt_tokens": len(req.input_ids),
            "completion_tokens": len(res.output_ids),
            "cached_tokens": res.cached_tokens,
            "weight_version": done.weight_version,
            "weight_versions": done.weight_versions,
            "queue_time": done.queue_time_s,
            "e2e_latency": time.perf_counter() - arrived,
        }
        if call.return_logprob[i]:
            with_text = call.text_in_logprobs[i]
            meta["output_token_logprobs"] = [
                [lp, tid, decode_token(tid) if with_text else None]
                for lp, tid in zip(res.output_logprobs, res.output_ids)
            ]
        start = call.routes_from[i]
        if start is not None and res.routes is not None:  # clamped to the last fed token, as get_topk does
            meta["routed_experts"] = encode_routes(res.routes[min(start, len(res.routes)) :].numpy())
        out.append({"text": res.text, "output_ids": res.output_ids, "meta_info": meta})
    return out if call.batch else out[0]
