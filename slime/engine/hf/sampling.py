"""SGLang-compatible sampling parameters and the per-step logits → token transform.

`SamplingParams.from_dict` accepts exactly the keys of SGLang's `SamplingParams` (0.5.x) and rejects
anything else with `SamplingParamsError` naming the key, as SGLang's constructor would. Keys SGLang
knows but this engine does not implement (grammars, logit bias, n > 1, ...) are accepted only at their
neutral default, and a non-default value is an error rather than being silently ignored.

Order of operations per decode step (mirrors SGLang's sampler):
  1. raw logits (float32) → penalties (repetition over prompt + output, frequency/presence over
     output) → min_new_tokens mask (stop tokens set to -inf while too few tokens were generated);
  2. divide by the temperature T (T = 1 for greedy rows);
  3. log-probs = log_softmax(logits / T): this is what `output_token_logprobs` reports, i.e. BEFORE
     top-k / top-p / min-p truncation;
  4. greedy rows take the argmax; other rows sample from softmax(logits / T) truncated by top-k,
     top-p and min-p (renormalised implicitly by `torch.multinomial`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from slime.engine.hf import batch_invariant

GREEDY_EPS = 1e-6  # temperatures below this mean greedy, as in SGLang
# the seed of a row without `sampling_seed` in deterministic mode, as SGLang's (sampling_batch_info.py)
DEFAULT_SAMPLING_SEED = 42


class SamplingParamsError(ValueError):
    """An invalid or unsupported sampling parameter (the server answers HTTP 400)."""


# SGLang SamplingParams fields that this engine does not implement, with their neutral values.
_UNSUPPORTED_NEUTRAL: dict[str, Any] = {
    "n": 1,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
    "structural_tag": None,
    "stop_regex": None,
    "logit_bias": None,
    "custom_params": None,
    "stream_interval": None,
}


@dataclass
class SamplingParams:
    """Per-request sampling parameters (SGLang names and defaults). Lengths are in tokens."""

    max_new_tokens: Optional[int] = 128  # None: up to the context length
    min_new_tokens: int = 0
    temperature: float = 1.0  # 0 (< 1e-6) = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 = off
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)  # stop strings, matched on decoded output text
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False  # as SGLang: disables ALL token-based stops (EOS and stop_token_ids)
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: Optional[int] = None  # per-request RNG seed (else the server's generator)

    @classmethod
    def from_dict(cls, d: Optional[dict]) -> SamplingParams:
        """Build from a request's `sampling_params` dict; raise SamplingParamsError on bad keys/values."""
        d = dict(d or {})
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in d.items():
            if key in known:
                kwargs[key] = value
            elif key in _UNSUPPORTED_NEUTRAL:
                if value != _UNSUPPORTED_NEUTRAL[key]:
                    raise SamplingParamsError(
                        f"sampling_params.{key}={value!r} is not supported by the hf engine "
                        f"(only {_UNSUPPORTED_NEUTRAL[key]!r})"
                    )
            else:
                raise SamplingParamsError(f"SamplingParams got an unexpected keyword argument '{key}'")
        if isinstance(kwargs.get("stop"), str):
            kwargs["stop"] = [kwargs["stop"]]
        for key in ("stop", "stop_token_ids"):
            if kwargs.get(key) is None:
                kwargs.pop(key, None)
        params = cls(**kwargs)
        params.stop = [str(s) for s in params.stop if s]
        params.stop_token_ids = [int(t) for t in params.stop_token_ids]
        params.verify()
        return params

    @property
    def greedy(self) -> bool:
        """Temperature 0 (< 1e-6): argmax, and log-probs use T = 1 (SGLang's convention)."""
        return self.temperature < GREEDY_EPS

    def verify(self) -> None:
        """Range checks matching SGLang's `SamplingParams.verify`."""
        if self.temperature < 0:
            raise SamplingParamsError(f"temperature must be non-negative, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise SamplingParamsError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise SamplingParamsError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.top_k < 1 and self.top_k != -1:
            raise SamplingParamsError(f"top_k must be -1 (disable) or at least 1, got {self.top_k}")
        if not -2 <= self.frequency_penalty <= 2:
            raise SamplingParamsError(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        if not -2 <= self.presence_penalty <= 2:
            raise SamplingParamsError(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        if not 0 < self.repetition_penalty <= 2:
            raise SamplingParamsError(f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}")
        if self.max_new_tokens is not None and self.max_new_tokens < 0:
            raise SamplingParamsError(f"max_new_tokens must be at least 0, got {self.max_new_tokens}")
        if self.min_new_tokens < 0:
            raise SamplingParamsError(f"min_new_tokens must be at least 0, got {self.min_new_tokens}")
        if self.max_new_tokens is not None and self.min_new_tokens > self.max_new_tokens:
            raise SamplingParamsError(
                f"min_new_tokens must be <= max_new_tokens, got {self.min_new_tokens} > {self.max_new_tokens}"
            )


class LogitsSampler:
    """Vectorised penalties, temperature, log-probs and truncated sampling for one decode batch.

    Built from the rows' params; `select(keep)` drops finished rows, `extend(other)` appends another sampler's
    rows (requests joining a running batch). Each row counts its own generated tokens (for min_new_tokens). Token
    counts for the penalties are tracked only when some row uses a penalty (the others' neutral values leave their
    logits unchanged, bit for bit).

    A row with `sampling_seed` draws from its own generator seeded with it, so the requests batched with it never
    shift its draws; with `default_seed` (the generator's batch-invariant mode) so does every other sampled row,
    seeded with it; otherwise those draw from the shared `generator`.
    """

    def __init__(
        self,
        params: Sequence[SamplingParams],
        prompts: Sequence[Sequence[int]],
        *,
        vocab_size: int,
        device: torch.device,
        stop_ids_per_row: Sequence[Sequence[int]],
        generator: torch.Generator,
        default_seed: Optional[int] = None,
    ):
        self.params = list(params)
        self.vocab_size = vocab_size
        self.device = device
        self.generator = generator
        self.batch_invariant = default_seed is not None
        temps = [1.0 if p.greedy else float(p.temperature) for p in params]
        self.temperature = torch.tensor(temps, dtype=torch.float32, device=device)
        self.top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device)
        self.top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab_size for p in params], device=device)
        self.min_p = torch.tensor([p.min_p for p in params], dtype=torch.float32, device=device)
        self.row_generators: list[Optional[torch.Generator]] = []
        for p in params:
            seed = p.sampling_seed if p.sampling_seed is not None else default_seed
            gen = None
            if seed is not None and not p.greedy:
                gen = torch.Generator(device=device)
                gen.manual_seed(int(seed))
            self.row_generators.append(gen)
        # Stop tokens masked while fewer than min_new_tokens were generated.
        self.min_new = torch.tensor([p.min_new_tokens for p in params], device=device)
        self.generated = [0] * len(self.params)  # tokens each row sampled so far
        self.stop_mask = torch.zeros(len(params), vocab_size, dtype=torch.bool, device=device)
        for i, ids in enumerate(stop_ids_per_row):
            ids = [t for t in ids if 0 <= t < vocab_size]
            if ids:
                self.stop_mask[i, ids] = True
        self.use_penalties = any(
            p.frequency_penalty != 0 or p.presence_penalty != 0 or p.repetition_penalty != 1 for p in params
        )
        if self.use_penalties:
            f32 = {"dtype": torch.float32, "device": device}
            self.freq = torch.tensor([float(p.frequency_penalty) for p in params], **f32).unsqueeze(1)
            self.pres = torch.tensor([float(p.presence_penalty) for p in params], **f32).unsqueeze(1)
            self.rep = torch.tensor([float(p.repetition_penalty) for p in params], **f32).unsqueeze(1)
            self.out_counts = torch.zeros(len(params), vocab_size, dtype=torch.float32, device=device)
            self.seen = torch.zeros(len(params), vocab_size, dtype=torch.bool, device=device)
            for i, ids in enumerate(prompts):
                ids = [t for t in ids if 0 <= t < vocab_size]
                if ids:
                    self.seen[i, ids] = True

    def select(self, keep: list[int]) -> None:
        """Keep only the given row positions (in the current order)."""
        idx = torch.tensor(keep, device=self.device)
        for name in self._row_tensors():
            setattr(self, name, getattr(self, name)[idx])
        self.params = [self.params[i] for i in keep]
        self.row_generators = [self.row_generators[i] for i in keep]
        self.generated = [self.generated[i] for i in keep]

    def extend(self, other: LogitsSampler) -> None:
        """Append `other`'s rows (same vocabulary, device and shared generator) after this sampler's."""
        if self.use_penalties or other.use_penalties:
            self._track_penalties()
            other._track_penalties()
        for name in self._row_tensors():
            setattr(self, name, torch.cat([getattr(self, name), getattr(other, name)]))
        self.params += other.params
        self.row_generators += other.row_generators
        self.generated += other.generated

    def _row_tensors(self) -> tuple[str, ...]:
        """Names of the per-row tensors (first dimension B)."""
        names = ("temperature", "top_p", "top_k", "min_p", "min_new", "stop_mask")
        return names + ("freq", "pres", "rep", "out_counts", "seen") if self.use_penalties else names

    def _track_penalties(self) -> None:
        """Penalty state for rows without penalties: neutral values (x / 1, x * 1, x - 0 leave logits unchanged)."""
        if self.use_penalties:
            return
        rows, f32 = len(self.params), {"dtype": torch.float32, "device": self.device}
        self.freq, self.pres = torch.zeros(rows, 1, **f32), torch.zeros(rows, 1, **f32)
        self.rep = torch.ones(rows, 1, **f32)
        self.out_counts = torch.zeros(rows, self.vocab_size, **f32)
        self.seen = torch.zeros(rows, self.vocab_size, dtype=torch.bool, device=self.device)
        self.use_penalties = True

    def step(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """logits [B, V'] of the current rows → (token ids [B] int64, their log-probs [B] float32)."""
        logits = logits[:, : self.vocab_size].float()
        if self.use_penalties:
            rep_applied = torch.where(logits > 0, logits / self.rep, logits * self.rep)
            logits = torch.where(self.seen, rep_applied, logits)
            logits = logits - self.freq * self.out_counts - self.pres * (self.out_counts > 0).float()
        if any(n < p.min_new_tokens for n, p in zip(self.generated, self.params)):  # no tensor work otherwise
            too_few = self.min_new > torch.tensor(self.generated, device=self.device)
            logits = logits.masked_fill(self.stop_mask & too_few.unsqueeze(1), float("-inf"))
        logits = logits / self.temperature.unsqueeze(1)
        logprobs = torch.log_softmax(logits, dim=-1)
        tokens = torch.argmax(logits, dim=-1)
        sample_rows = [i for i, p in enumerate(self.params) if not p.greedy]  # from the host: no device sync
        if sample_rows:
            tokens[sample_rows] = self._sample(logprobs[sample_rows], sample_rows)
        token_logprobs = logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1)
        if self.use_penalties:
            ones = torch.ones_like(tokens, dtype=torch.float32).unsqueeze(1)
            self.out_counts.scatter_add_(1, tokens.unsqueeze(1), ones)
            self.seen.scatter_(1, tokens.unsqueeze(1), True)
        self.generated = [n + 1 for n in self.generated]
        return tokens, token_logprobs

    def _truncates(self, params: SamplingParams) -> bool:
        """Whether a row's top-k, top-p or min-p removes any token (the test of its `top_k`, `top_p`, `min_p`)."""
        return 0 < params.top_k < self.vocab_size or params.top_p < 1 or params.min_p > 0

    def _sample(self, logprobs: torch.Tensor, rows: list[int]) -> torch.Tensor:
        """Token ids [len(rows)] drawn from the rows' `logprobs` [len(rows), V]. Rows that truncate (top-k, top-p,
        min-p) draw from their sorted, truncated distribution and the others from the plain one, decided per row: a
        row draws as it would alone."""
        probs = batch_invariant.aligned(torch.exp, logprobs) if self.batch_invariant else logprobs.exp()
        idx = torch.tensor(rows, device=self.device)
        top_k, top_p, min_p = self.top_k[idx], self.top_p[idx], self.min_p[idx]
        truncated = [j for j, r in enumerate(rows) if self._truncates(self.params[r])]  # from the host: no sync
        order = None
        if len(truncated):
            order = torch.arange(probs.shape[1], device=self.device).expand_as(probs).clone()
            sorted_probs, order[truncated] = probs[truncated].sort(dim=-1, descending=True)
            rank = torch.arange(probs.shape[1], device=self.device).unsqueeze(0)
            drop = rank >= top_k[truncated].unsqueeze(1)
            drop |= (sorted_probs.cumsum(dim=-1) - sorted_probs) > top_p[truncated].unsqueeze(1)  # keeps the top token
            drop |= sorted_probs < min_p[truncated].unsqueeze(1) * sorted_probs[:, :1]
            probs = probs.clone()
            probs[truncated] = sorted_probs.masked_fill(drop, 0.0)
        choice = torch.empty(len(rows), dtype=torch.long, device=self.device)
        shared = [j for j, r in enumerate(rows) if self.row_generators[r] is None]
        if shared:
            choice[shared] = torch.multinomial(probs[shared], 1, generator=self.generator).squeeze(1)
        for j, r in enumerate(rows):
            gen = self.row_generators[r]
            if gen is not None:
                choice[j] = torch.multinomial(probs[j : j + 1], 1, generator=gen).squeeze()
        if order is not None:
            choice = order.gather(1, choice.unsqueeze(1)).squeeze(1)
        return choice
