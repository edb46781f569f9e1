"""The generate route of the fake vLLM server (tests/fakes/fake_vllm.py): POST /inference/v1/generate as vLLM
0.32.0's `ServingTokens.serve_tokens` serves it (`vllm/entrypoints/scale_out/token_in_token_out/serving.py`),
with the hf engine generating where vLLM's AsyncLLM would.

The request arrives as vLLM's own `GenerateRequest` (its `SamplingParams` included, bound by FastAPI); the
answer is built from vLLM's own types: `GenerateTokensResponse`, `GenerateTokensChoice`, the log-probs by
`ServingTokens._create_tokens_logprobs`, `UsageInfo`, `WeightVersionSpan`. A PD prefill server (started with
`--kv-transfer-config`) answers a request carrying `kv_transfer_params.do_remote_decode` with the parameters
NIXL's scheduler gives the decode server (`kv_connector/v1/nixl/pull_scheduler.py: request_finished`); the
decode server recomputes the prompt (the fake moves no KV cache).

Mixed into the fake server class, which provides `cli`, `scheduler`, `generator`, `tokenizer`, `sleeping_tags`,
`abort_epoch`, `in_flight`, `engine_id` and `served_names`.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

from tests.fakes.fake_vllm import GENERATE_MARK

# vLLM SamplingParams field -> the hf engine's (SGLang-named) sampling param
SAMPLING = {
    "min_tokens": "min_new_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "seed": "sampling_seed",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",
    "ignore_eos": "ignore_eos",
    "skip_special_tokens": "skip_special_tokens",
    "spaces_between_special_tokens": "spaces_between_special_tokens",
    "include_stop_str_in_output": "no_stop_trim",
    "repetition_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}


class GenerateRoutes:
    """POST /inference/v1/generate (see the module docstring)."""

    async def generate(self, http, request) -> tuple[int, dict]:
        from tests.helpers import vllm_real

        if request.model and request.model not in self.served_names:  # OpenAIServing._check_model
            names = ", ".join(self.served_names)
            message = f"The model `{request.model}` does not exist. Valid aliases: {names}."
            return vllm_real.error(message, "NotFoundError", 404, "model")
        sp = request.sampling_params
        if sp.n != 1 or request.stream:
            raise NotImplementedError("the fake vLLM server generates one choice, without streaming")
        max_tokens = self._max_tokens(request)
        mark = {"weight_version": self.scheduler.weight_version, "max_tokens": max_tokens}
        print(
            f"{GENERATE_MARK} {json.dumps({**mark, 'kv_transfer_params': request.kv_transfer_params})}",
            file=sys.stderr,
            flush=True,
        )
        tracked = bool(self.cli.enable_server_load_tracking)  # load_aware_call counts only then
        self.in_flight += tracked
        try:
            done = await self._run(request, max_tokens)
        finally:
            self.in_flight -= tracked
        return 200, self._response(http, request, done)

    def _max_tokens(self, request) -> int:
        """The client's `max_tokens`, else what is left of the context (serve_tokens' server-side default)."""
        from vllm.entrypoints.serve.utils.api_utils import get_max_tokens

        if request.is_sampling_param_provided("max_tokens"):
            return request.sampling_params.max_tokens
        length = self.generator.context_length
        return get_max_tokens(
            max_model_len=length, max_tokens=None, input_length=len(request.token_ids), default_sampling_params={}
        )

    async def _run(self, request, max_tokens: int):
        """The request through the hf engine; while the engine sleeps it waits (EngineCore queues what arrives
        while its scheduler is paused), and ends aborted if everything is aborted meanwhile."""
        from slime.engine.hf.generator import GenerationResult
        from slime.engine.hf.protocol import parse_generate
        from slime.engine.hf.scheduler import Completion

        epoch = self.abort_epoch
        while self.sleeping_tags and self.abort_epoch == epoch:
            await asyncio.sleep(0.01)
        if self.abort_epoch != epoch:
            aborted = GenerationResult([], [], "", {"type": "abort", "message": "aborted while asleep"})
            return Completion(aborted, self.scheduler.weight_version, 0.0)
        sp = request.sampling_params
        params = {hf: getattr(sp, name) for name, hf in SAMPLING.items() if request.is_sampling_param_provided(name)}
        params = {k: v for k, v in params.items() if v is not None}
        params["max_new_tokens"] = max_tokens
        if params.get("top_k") == 0:  # vLLM's "off"; the hf engine's (SGLang's) is -1
            params["top_k"] = -1
        body = {"input_ids": list(request.token_ids), "sampling_params": params, "rid": request.request_id}
        call = parse_generate(body, self.tokenizer.encode)
        (done,) = await self.scheduler.submit(call.requests)
        return done

    def _response(self, http, request, done) -> dict[str, Any]:
        """`serve_tokens_full_generator`'s answer for one finished request."""
        from vllm.entrypoints.scale_out.token_in_token_out.protocol import GenerateTokensChoice, GenerateTokensResponse
        from vllm.entrypoints.scale_out.token_in_token_out.serving import ServingTokens
        from vllm.entrypoints.serve.engine.protocol import UsageInfo
        from vllm.logprobs import Logprob
        from vllm.outputs import WeightVersionSpan

        sp, res = request.sampling_params, done.result
        ids = [int(t) for t in res.output_ids]
        logprobs = None
        if sp.logprobs is not None:  # the engine's per-position {token id: Logprob}, sampled token only
            top = [{t: Logprob(logprob=float(lp))} for t, lp in zip(ids, res.output_logprobs)]
            # a method that reads nothing of its instance: vLLM's code shapes the entries
            logprobs = ServingTokens._create_tokens_logprobs(None, ids, top, sp.logprobs)
        finish = res.finish_reason if isinstance(res.finish_reason, dict) else {}
        matched = finish.get("matched")
        stopped_by = matched in (sp.stop_token_ids or []) or matched in (sp.stop or [])  # None on EOS
        choice = GenerateTokensChoice(
            index=0,
            logprobs=logprobs,
            finish_reason=finish.get("type") or "stop",
            stop_reason=matched if stopped_by else None,
            token_ids=ids,
            weight_versions=[WeightVersionSpan(version=done.weight_version, start=0, end=len(ids))] if ids else None,
        )
        prompt = len(request.token_ids)
        response = GenerateTokensResponse(
            request_id=f"generate-tokens-{http.headers.get('X-Request-Id', request.request_id)}",
            created=int(time.time()),
            model=self.served_names[0],
            usage=UsageInfo(prompt_tokens=prompt, completion_tokens=len(ids), total_tokens=prompt + len(ids)),
            choices=[choice],
            kv_transfer_params=self._kv_for_decode(request),
        )
        return response.model_dump(mode="json")

    def _kv_for_decode(self, request) -> dict | None:
        """A prefill server's `kv_transfer_params` for the decode server (pull_scheduler.request_finished)."""
        kv = request.kv_transfer_params
        if self.cli.kv_transfer_config is None or not (kv and kv.get("do_remote_decode")):
            return None
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": list(range(len(request.token_ids) // 16 + 1)),
            "remote_engine_id": self.engine_id,
            "remote_request_id": request.request_id,
            "remote_host": os.environ.get("VLLM_NIXL_SIDE_CHANNEL_HOST", self.cli.host),
            "remote_port": int(os.environ.get("VLLM_NIXL_SIDE_CHANNEL_PORT", "0")),
            "tp_size": self.cli.tensor_parallel_size,
        }
