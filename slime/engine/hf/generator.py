"""Batched autoregressive generation on a transformers causal LM, with SGLang's output semantics.

One `Generator.generate(requests)` call runs one static batch (`batch.RunningBatch`): prompts are left-padded,
the prefill uses an attention mask and per-row position ids, decoding reuses a `DynamicCache`, and finished rows
are dropped from the cache and the batch as soon as they finish (they cost no further compute). `new_batch()`
gives the scheduler a batch that requests join between decode steps. A batch of one request takes its prefill,
and the decode step of its first token, from the prefix cache when a request decoded alone got there before
(`prefix_cache.py`: the same computation, so the same bits); the owner clears that cache whenever the weights
change.

On a CUDA device (with `cuda_graphs`, where `static_cache.unsupported` finds nothing) batches decode on the fast
path, `static_batch.StaticBatch`: a preallocated KV cache of slots written in place, each decode step one CUDA graph
replay. Elsewhere, and for what it does not cover (route capture, batch-invariant mode, images, sliding-window or
other non-plain layers), they decode on the DynamicCache as above. Both give the same output semantics.

Output semantics (as SGLang):
- `output_ids` / `output_logprobs` hold every generated token, including a matched EOS / stop token
  (slime trains on it). The text excludes the matched stop token or stop string unless `no_stop_trim`.
- `finish_reason` is `{"type": "stop", "matched": <token id | stop string>}`,
  `{"type": "length", "length": <max_new_tokens>}` or `{"type": "abort", "message": ...}`. The length
  check comes first, so a stop token sampled as the last allowed token reports "length".
- Log-probs are natural-log probabilities of the sampled token under softmax(logits / T) (T = 1 for
  greedy), before top-k/top-p/min-p truncation (see `sampling.py`).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
from collections.abc import Iterable, Sequence
from typing import Any, Optional

import torch
from transformers import DynamicCache

from slime.engine.hf import batch_invariant as batch_invariant_ops
from slime.engine.hf.batch import RunningBatch, joinable
from slime.engine.hf.prefix_cache import DEFAULT_MAX_TOKENS, PrefixCache
from slime.engine.hf.request import GenerationError, GenerationRequest, GenerationResult
from slime.engine.hf.sampling import SamplingParams
from slime.engine.hf.static_batch import StaticBatch
from slime.engine.hf.static_cache import SlotDecoder, unsupported
from slime.models.hf_model import text_config
from slime.models.moe.hf_routers import RouterTap

# the engine's modules import the request types from here
__all__ = ["GenerationError", "GenerationRequest", "GenerationResult", "Generator"]

logger = logging.getLogger(__name__)


def _as_id_set(value: Any) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, int):
        return {value}
    return {int(v) for v in value}


class Generator:
    """Serves `GenerationRequest`s on `model` (already on its device, in eval mode).

    Args:
        model: a transformers `*ForCausalLM`.
        tokenizer: its tokenizer (decoding text and stop strings).
        seed: seed of the shared `torch.Generator` used by rows without `sampling_seed`.
        context_length: max prompt + output tokens; default `model.config.max_position_embeddings`.
        prefix_cache_tokens: tokens the prefix cache may hold (0: no cache).
        capture_routes: record every fed token's MoE experts (SGLang's `enable_return_routed_experts`); the
            prefix cache is then off (a cached prefill would skip the forward whose routes are returned).
        batch_invariant: run every forward pass batch-invariant (`batch_invariant.py`) and seed every sampled row
            on its own (SGLang's deterministic mode: a row without `sampling_seed` gets `DEFAULT_SAMPLING_SEED`):
            a request's tokens and log-probs do not depend on the requests batched with it. Needs what
            `batch_invariant.unsupported` checks (a CPU model, one torch thread, full-attention layers).
        vision: a vision-language model's `vision.EngineVision` (requests with images); None: text only.
        cuda_graphs: on a CUDA device, decode on the static cache with each step a CUDA graph replay (`graphs.py`),
            where `static_cache.unsupported` allows it; False: the dynamic cache (the path of every other device).
        static_decode: None: the static cache where `cuda_graphs` puts it; True: the static cache on any device
            (eager off CUDA; an error where unsupported); False: never.
    """

    def __init__(
        self,
        model,
        tokenizer,
        *,
        seed: int = 0,
        context_length: Optional[int] = None,
        prefix_cache_tokens: int = DEFAULT_MAX_TOKENS,
        capture_routes: bool = False,
        batch_invariant: bool = False,
        vision=None,
        cuda_graphs: bool = True,
        static_decode: Optional[bool] = None,
    ):
        reason = batch_invariant_ops.unsupported(model) if batch_invariant else None
        if reason:
            raise ValueError(reason)
        self.model = model
        self.vision = vision
        self.batch_invariant = batch_invariant
        self.router_tap = RouterTap(model) if capture_routes else None
        self.prefix_cache = PrefixCache(0 if capture_routes else prefix_cache_tokens)
        self.num_generated_tokens = 0  # tokens sampled since start, over all requests (progress, for /server_info)
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(int(seed))
        config = text_config(model.config)
        self.vocab_size = int(config.vocab_size)
        self.context_length = int(context_length or getattr(config, "max_position_embeddings", 1 << 30))
        gen_config = getattr(model, "generation_config", None)
        self.eos_token_ids = (
            _as_id_set(getattr(config, "eos_token_id", None))
            | _as_id_set(getattr(gen_config, "eos_token_id", None))
            | _as_id_set(getattr(tokenizer, "eos_token_id", None))
        )
        pad = getattr(tokenizer, "pad_token_id", None)
        if pad is None:
            pad = min(self.eos_token_ids) if self.eos_token_ids else 0
        self.pad_token_id = int(pad)
        # transformers >= 5.2x renamed `past_key_values` to `cache` (the old name warns).
        forward_params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in forward_params else "past_key_values"
        # requests may join a running batch: its KV cache rows can be merged, and no forward's routes are returned
        self.joinable = not capture_routes and joinable(DynamicCache(config=model.config))
        self.slots = self._slot_decoder(cuda_graphs and self.device.type == "cuda", static_decode, capture_routes)

    def _slot_decoder(self, graphs: bool, static_decode: Optional[bool], capture_routes: bool):
        """The static cache's `SlotDecoder` when the options and the model allow it, else None."""
        if not (graphs if static_decode is None else static_decode):
            return None
        reason = unsupported(
            self.model, capture_routes=capture_routes, batch_invariant=self.batch_invariant, vision=self.vision
        )
        if reason and static_decode:
            raise ValueError(f"static_decode: {reason}")
        if reason:
            logger.info("decoding on the dynamic cache: %s", reason)
            return None
        return SlotDecoder(self.model, cache_kwarg=self._cache_kwarg, graphs=graphs)

    # ---------------------------------------------------------------- validation
    def validate(self, req: GenerationRequest) -> None:
        """Raise GenerationError for an empty, out-of-vocabulary or too long prompt."""
        ids = req.input_ids
        if not ids:
            raise GenerationError("input_ids is empty")
        if min(ids) < 0 or max(ids) >= self.vocab_size:
            raise GenerationError(f"input_ids contain a token id outside [0, {self.vocab_size})")
        if len(ids) >= self.context_length:
            raise GenerationError(
                f"The input ({len(ids)} tokens) is longer than the model's context length "
                f"({self.context_length} tokens)."
            )
        if req.images and self.vision is None:
            raise GenerationError("image_data: this model reads no images (it has no vision tower)")
        if req.images and req.vision is None:
            req.vision = self.vision.prompt(ids, req.images)

    def max_new_tokens(self, req: GenerationRequest) -> int:
        """The request's token budget, capped so that prompt + output fits the context length."""
        room = self.context_length - len(req.input_ids)
        wanted = req.params.max_new_tokens
        return room if wanted is None else min(int(wanted), room)

    def stop_ids(self, params: SamplingParams) -> set[int]:
        """The token ids that end a request with these params (none with ignore_eos, as SGLang)."""
        if params.ignore_eos:
            return set()
        return set(params.stop_token_ids) | self.eos_token_ids

    # ---------------------------------------------------------------- generation
    @torch.inference_mode()
    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Generate for all requests as one batch; returns results in request order.

        `cached_tokens` of a result whose prefill came from the prefix cache is prompt length - 1, the
        count SGLang reports for a whole-prompt hit (it recomputes the last prompt token; its stored
        result is reused here, which is the same computation); 0 otherwise.
        """
        for req in requests:
            self.validate(req)
        results: list[Optional[GenerationResult]] = [None] * len(requests)
        batch = self.new_batch()
        with self.capturing_routes():
            finished = batch.add(requests, range(len(requests)))
            while batch:
                finished += batch.step()
        for index, result in finished:
            results[index] = result
        return results

    def new_batch(self) -> RunningBatch:
        """An empty batch on this model: `add` requests, `step` until it is empty."""
        return StaticBatch(self, self.slots) if self.slots is not None else RunningBatch(self)

    def forward_mode(self):
        """The context of every forward pass: batch-invariant ops when `batch_invariant`, else none."""
        return batch_invariant_ops.BatchInvariantOps(self.model) if self.batch_invariant else contextlib.nullcontext()

    def capturing_routes(self):
        """The context in which forwards record MoE routes (a no-op without route capture)."""
        return self.router_tap.capture() if self.router_tap else contextlib.nullcontext()

    def flush_cache(self) -> None:
        """Forget every stored prefill, and free the static cache and its graphs unless a batch decodes on them:
        call whenever the weights change or memory is released."""
        self.prefix_cache.clear()
        if self.slots is not None:
            self.slots.reset()

    def prefill(self, prompts, ids, mask, position_ids, images: Optional[dict] = None):
        """(KV cache, last-position logits [B, V], whether they came from the prefix cache) of the left-padded
        prompts `ids` [B, W] (`mask` [B, W], `position_ids` [B, W], or [3, B, W] with `images`: the rows' pixels,
        `pixel_values` and `image_grid_thw`). A lone text prompt's cache is the prefix cache's (shared):
        `decode_step` copies it before extending it; a prompt with images is never cached (its ids alone do not
        say what it holds)."""
        alone = len(prompts) == 1 and self.prefix_cache.enabled and not images
        hit = self.prefix_cache.get(prompts[0]) if alone else None
        if hit is not None:
            return hit.cache, hit.logits, True

        cache = DynamicCache(config=self.model.config)
        with self.forward_mode():
            out = self.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=position_ids,
                use_cache=True,
                logits_to_keep=1,
                **{self._cache_kwarg: cache},
                **(images or {}),
            )
        logits = out.logits[:, -1, :]
        if alone:
            self.prefix_cache.put(prompts[0], cache, logits)
        return cache, logits, False

    def decode_step(self, prompt, generated, tokens, mask, positions, state):
        """(KV cache, logits [B, V], whether that cache is the prefix cache's) after feeding `tokens` [B] at
        `positions` [B] (`mask` [B, W + 1]) to `state` (the cache of W positions, and whether it is the prefix
        cache's: then a copy is extended, never it). A lone request's state after `prompt` and `generated` (None:
        not cached) comes from the prefix cache when it is there."""
        cache, shared = state
        cacheable = generated is not None and self.prefix_cache.enabled
        hit = self.prefix_cache.get(prompt, generated) if cacheable else None
        if hit is not None:
            return hit.cache, hit.logits, True
        if shared:
            cache = copy.deepcopy(cache)
        with self.forward_mode():
            out = self.model(
                input_ids=tokens.unsqueeze(1),
                attention_mask=mask,
                position_ids=positions.unsqueeze(1),
                use_cache=True,
                **{self._cache_kwarg: cache},
            )
        logits = out.logits[:, -1, :]
        if cacheable:
            self.prefix_cache.put(prompt, cache, logits, generated)
        return cache, logits, cacheable

    def finish_reason(self, req: GenerationRequest, ids: list[int], budget: int, stop_ids: set[int]) -> Optional[dict]:
        """SGLang's order: abort, length, (nothing before min_new_tokens), stop token, stop string."""
        if req.aborted:
            return {"type": "abort", "message": "Aborted by request"}
        if len(ids) >= budget:
            return {"type": "length", "length": budget}
        params = req.params
        if len(ids) < params.min_new_tokens:
            return None
        if ids[-1] in stop_ids:
            return {"type": "stop", "matched": ids[-1]}
        if params.stop:
            window = max(len(s) for s in params.stop) + 1  # every token decodes to >= 1 character
            tail = self.decode(ids[-window:], skip_special_tokens=False, spaces_between_special_tokens=True)
            for s in params.stop:
                if s in tail:
                    return {"type": "stop", "matched": s}
        return None

    def final_text(self, params: SamplingParams, ids: list[int], reason: dict) -> str:
        matched = reason.get("matched") if reason.get("type") == "stop" else None
        trim = not params.no_stop_trim
        if trim and isinstance(matched, int):
            ids = ids[:-1]
        text = self.decode(ids, params.skip_special_tokens, params.spaces_between_special_tokens)
        if trim and isinstance(matched, str):
            pos = text.find(matched)
            if pos != -1:
                text = text[:pos]
        return text

    def decode(
        self, ids: Iterable[int], skip_special_tokens: bool = True, spaces_between_special_tokens: bool = True
    ) -> str:
        ids = list(ids)
        if not ids:
            return ""
        try:
            return self.tokenizer.decode(
                ids,
                skip_special_tokens=skip_special_tokens,
                spaces_between_special_tokens=spaces_between_special_tokens,
            )
        except TypeError:  # tokenizers without the spacing option
            return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
