"""Pure-torch RL algorithms: rewards, advantages, losses, KL, log-probs, reduction, pass@k.

Data layout (used by every function here):
    * A micro-batch of B samples is described by ``response_lengths: list[int]`` (length B).
    * Per-token quantities (log-probs, KL, advantages, values, losses, loss masks) are flat
      1-D tensors of length T = sum(response_lengths): sample 0's response tokens, then
      sample 1's, and so on. Loss masks are float tensors of 0/1.
    * Per-sample quantities (rewards) are 1-D tensors of length B; for group operations
      the n samples of one prompt are contiguous.
    * Log-probs and KL are in nats. Functions keep the input dtype (log-prob computation
      upcasts half precision to float32). Per-token losses are NOT reduced; use
      ``token_weights`` + ``reduce`` for micro-batch- and DP-invariant step values.

Functions are pure (tensors in, tensors or dicts of tensors out) and import only torch.
"""

from slime.algo.advantages import (
    broadcast_to_tokens,
    gae,
    reinforce_plus_plus_baseline_advantages,
    reinforce_plus_plus_returns,
    whiten,
)
from slime.algo.kl import KL_TYPES, approx_kl
from slime.algo.logprobs import chunked_log_probs_and_entropy, log_probs_and_entropy, response_logits_slice
from slime.algo.passk import pass_at_k
from slime.algo.policy_loss import (
    TIS_MODES,
    cispo_loss,
    gspo_log_ratio,
    ppo_clip_loss,
    sft_loss,
    tis_weights,
)
from slime.algo.reduction import REDUCTION_MODES, reduce, sample_mask_sums, token_weights
from slime.algo.rewards import group_normalize, rloo_advantages
from slime.algo.value_loss import clipped_value_loss

__all__ = [
    "KL_TYPES",
    "REDUCTION_MODES",
    "TIS_MODES",
    "approx_kl",
    "broadcast_to_tokens",
    "chunked_log_probs_and_entropy",
    "cispo_loss",
    "clipped_value_loss",
    "gae",
    "group_normalize",
    "gspo_log_ratio",
    "log_probs_and_entropy",
    "pass_at_k",
    "ppo_clip_loss",
    "reduce",
    "reinforce_plus_plus_baseline_advantages",
    "reinforce_plus_plus_returns",
    "response_logits_slice",
    "rloo_advantages",
    "sample_mask_sums",
    "sft_loss",
    "tis_weights",
    "token_weights",
    "whiten",
]
