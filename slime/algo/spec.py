"""The advantage estimators' records (slime.registry): `algo.advantage_estimator=grpo|gspo|...`, each its three
functions (relative to this package, slime/algo/estimator_functions.py), its facts and the estimators' checks."""

from slime.algo.estimators import Estimator
from slime.registry import Spec


def _estimator(name: str, reward_transform: str, token_advantages: str, policy_loss: str, **facts) -> Spec:
    functions = dict(reward_transform=reward_transform, token_advantages=token_advantages, policy_loss=policy_loss)
    return Estimator(name=name, **functions, **facts).spec()


GROUP_NORMALIZED = ".estimator_functions.group_normalized_rewards"
RAW = ".estimator_functions.raw_rewards"
BROADCAST = ".estimator_functions.broadcast_advantages"
CLIPPED = ".estimator_functions.clipped_surrogate_loss"

SPECS = (
    _estimator("grpo", GROUP_NORMALIZED, BROADCAST, CLIPPED),
    _estimator(
        "gspo",
        GROUP_NORMALIZED,
        BROADCAST,
        ".estimator_functions.sequence_clipped_surrogate_loss",
        needs_old_log_probs=True,
    ),
    _estimator("cispo", GROUP_NORMALIZED, BROADCAST, ".estimator_functions.clipped_weight_loss"),
    _estimator("rloo", ".estimator_functions.leave_one_out_rewards", BROADCAST, CLIPPED, min_samples_per_prompt=2),
    _estimator(
        "reinforce_plus_plus",
        RAW,
        ".estimator_functions.reinforce_plus_plus_advantages",
        CLIPPED,
        reward_kl=True,
        needs_whitening=True,
    ),
    _estimator(
        "reinforce_plus_plus_baseline",
        ".estimator_functions.group_centred_rewards",
        ".estimator_functions.centred_minus_kl_advantages",
        CLIPPED,
        reward_kl=True,
        needs_whitening=True,
    ),
    _estimator(
        "ppo",
        RAW,
        ".estimator_functions.gae_advantages",
        CLIPPED,
        needs_critic=True,
        needs_old_log_probs=True,
        reward_kl=True,
    ),
    _estimator(
        "sft",
        RAW,
        ".estimator_functions.no_advantages",
        ".estimator_functions.negative_log_likelihood_loss",
        uses_advantages=False,
        generates=False,
        rollout_function="sft",
    ),
)
