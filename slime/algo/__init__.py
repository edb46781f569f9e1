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

Functions are pure (tensors in, tensors or dicts of tensors out) and import only torch. Import them from
their modules (advantages, estimator_functions, kl, logprobs, passk, policy_loss, reduction, rewards,
value_loss): this package imports nothing itself, so `slime.algo.estimators` (the algorithm registry,
standard library only) reads without torch.
"""
