"""A vLLM logits processor that leaves the logits as they are and holds every sampling step for `STEP_S` seconds.

Loaded by a real vLLM server through its own `--logits-processors tests.helpers.vllm_slow_step:SlowStep`
(vllm/v1/sample/logits_processor/__init__.py, `_load_logitsprocs_by_fqcns`), so a response of a few hundred
tokens decodes for seconds even on an idle machine: a test that pauses or aborts "mid-decode" then catches it
mid-decode whatever the machine's load does to its polling. The log-probs the server returns are unchanged:
vLLM computes them from the raw logits before any processor runs (vllm/v1/sample/sampler.py, `Sampler.forward`).
"""

from __future__ import annotations

import time

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor

STEP_S = 0.015  # seconds per decode step: 400 tokens take at least 6 s


class SlowStep(LogitsProcessor):
    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        del vllm_config, device, is_pin_memory

    def is_argmax_invariant(self) -> bool:
        return False  # applied on every step, greedy or not (Sampler.apply_logits_processors)

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        del batch_update

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        time.sleep(STEP_S)
        return logits
