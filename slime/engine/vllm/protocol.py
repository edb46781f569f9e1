"""vLLM 0.32.0's token-level generate endpoint and packed IPC update, translated to and from the framework's.

Generation (what vime's rollout sends through vllm-router): POST `/inference/v1/generate`

    request   {"token_ids": [int], "sampling_params": {max_tokens, temperature, ..., "logprobs": 0}}
    response  {"request_id", "choices": [{"index", "finish_reason": "stop"|"length"|"abort", "token_ids",
               "logprobs": {"content": [{"token_id", "logprob", ...}]}, "weight_versions": [{version, start, end}]}],
               "usage", "kv_transfer_params"}

`generate_payload` turns the rollout's SGLang sampling params into vLLM's `SamplingParams` fields (an
SGLang-only key raises ValueError naming it); `as_sglang_output` turns the response into the SGLang shape
(`text`, `meta_info.output_token_logprobs` = [[logprob, token id]], `finish_reason.type`, `weight_version`, and
`weight_versions`: vLLM's per-token spans, which have SGLang's span shape)
that `slime.rollout.generate.append_engine_output` records on a Sample, so log-probs, status and weight
version are recorded exactly as with SGLang. `logprobs: 0` asks for the sampled token's log-prob only.
A server started with `--enable-return-routed-experts` adds `choices[0].routed_experts`: base64 of a `.npy` file
(`vllm/utils/serial_utils.py:numpy2base64`) of `[prompt + output - 1, MoE layers, top-k]` expert ids in uint8,
uint16 or int32 (`entrypoints/scale_out/token_in_token_out/protocol.py`); it becomes SGLang's
`meta_info.routed_experts` (base64 of raw int32, `slime.models.moe.routes`).
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from slime.models.moe.routes import encode_routes

GENERATE_PATH = "/inference/v1/generate"

# SGLang sampling-param name -> vLLM SamplingParams field (None: same name).
_RENAMED = {
    "max_new_tokens": "max_tokens",
    "min_new_tokens": "min_tokens",
    "no_stop_trim": "include_stop_str_in_output",
    "sampling_seed": "seed",
}
_SAME = {
    "n",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
}


def sampling_params(sglang: dict[str, Any]) -> dict[str, Any]:
    """vLLM SamplingParams fields for SGLang sampling params; ValueError names keys vLLM has no field for."""
    unknown = sorted(k for k in sglang if k not in _RENAMED and k not in _SAME)
    if unknown:
        raise ValueError(
            f"sampling params {unknown} have no vLLM SamplingParams field; vLLM 0.32.0 takes "
            f"{sorted(_SAME | set(_RENAMED))} (SGLang names)"
        )
    params = {_RENAMED.get(k, k): v for k, v in sglang.items() if v is not None}
    if params.get("top_k") == -1:  # SGLang's "off"; vLLM's is 0
        params["top_k"] = 0
    params["logprobs"] = 0
    return params


def generate_payload(
    token_ids: Sequence[int], sglang_params: dict[str, Any], lora: str | None = None
) -> dict[str, Any]:
    """The body of POST /inference/v1/generate continuing `token_ids`; with `lora`, generated with that LoRA adapter
    (vLLM names an adapter as a served model: `GenerateRequest.model`, `serving.py:_maybe_get_adapters`)."""
    payload = {"token_ids": list(token_ids), "sampling_params": sampling_params(sglang_params)}
    if lora is not None:
        payload["model"] = lora
    return payload


def as_sglang_output(response: dict[str, Any], decode: Callable[[list[int]], str]) -> dict[str, Any]:
    """The response of /inference/v1/generate in the SGLang /generate shape (`decode` gives the text)."""
    choice = response["choices"][0]
    ids = [int(t) for t in choice.get("token_ids") or []]
    content = (choice.get("logprobs") or {}).get("content") or []
    if [int(e["token_id"]) for e in content] != ids:
        raise ValueError(
            f"vLLM returned {len(ids)} token ids and {len(content)} log-probs that do not match; the request must "
            "set sampling_params.logprobs=0"
        )
    spans = choice.get("weight_versions") or []
    usage = response.get("usage") or {}
    routes = choice.get("routed_experts")
    extra = {} if routes is None else {"routed_experts": encode_routes(np.load(io.BytesIO(base64.b64decode(routes))))}
    return {
        "text": decode(ids) if ids else "",
        "meta_info": {
            "finish_reason": {"type": choice.get("finish_reason") or "stop"},
            "output_token_logprobs": [[float(e["logprob"]), int(e["token_id"])] for e in content],
            "weight_version": spans[-1]["version"] if spans else None,
            "weight_versions": [{k: span[k] for k in ("version", "start", "end")} for span in spans],
            "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": len(ids),
            **extra,
        },
    }
