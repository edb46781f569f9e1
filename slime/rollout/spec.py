"""The rollout's records (slime.registry): the reward types (`rollout.rm_type`), the rollout functions
(`rollout.function`) and the tool-call parsers (`rollout.agent.tool_parser`)."""

from slime.registry import Checks, Spec
from slime.rollout.check_rewards import check_remote_rm

REWARDS = {
    "last_number": ".tool_use.last_number_reward",
    "exact_match": ".rewards.exact_match",
    "first_word": ".rewards.first_word",
    "math": ".rm.math.math_reward",
    "deepscaler": ".rm.math.deepscaler_reward",
    "dapo": ".rm.math.dapo_reward",
    "f1": ".rm.qa.f1_reward",
    "gpqa": ".rm.qa.gpqa_reward",
    "remote_rm": ".rm.remote.RemoteRewardModel",  # the hub builds it from rollout.rm_url
}
FUNCTIONS = {"default": ".default.generate_rollout", "sft": ".sft.generate_rollout"}
TOOL_PARSERS = {"qwen25": ".agent.tool_calls.Qwen25Calls", "tiny": ".agent.tool_calls.TinyCalls"}
CHECKS = {"remote_rm": Checks(check=check_remote_rm)}

SPECS = (
    *(Spec(seam="rollout.rm_type", name=n, target=t, checks=CHECKS.get(n, Checks())) for n, t in REWARDS.items()),
    *(Spec(seam="rollout.function", name=n, target=t) for n, t in FUNCTIONS.items()),
    *(Spec(seam="rollout.agent.tool_parser", name=n, target=t) for n, t in TOOL_PARSERS.items()),
)
