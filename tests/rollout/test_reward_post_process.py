"""rollout.reward_post_process replaces the algorithm's reward normalisation in the rollout manager."""

from __future__ import annotations

import pytest

from slime.driver.rollout_setup import rollout_setup
from slime.plan.derive import derive
from slime.plan.run_plan import plan_run
from slime.rollout.base import RolloutHooks
from slime.rollout.step_result import step_rewards
from slime.types import Sample
from tests.helpers.compose import typed_config


def doubled(args, samples):
    """A user reward post-process: raw rewards as they are, training rewards doubled."""
    raw = [s.scalar_reward(args.reward_key) for s in samples]
    return raw, [2 * r for r in raw]


@pytest.mark.parametrize("hook", [None, doubled])
def test_reward_post_process_hook_or_the_algorithms(hook):
    cfg = typed_config(["rollout.batch_size=2", "rollout.n_samples_per_prompt=2", "train.global_batch_size=2"])
    setup = rollout_setup(cfg, plan_run(cfg, derive(cfg)))
    samples = [Sample(reward={"score": r}) for r in (1.0, 0.0, 1.0, 1.0)]
    args = type("Args", (), {"reward_key": "score"})()
    setup.rollout.reward_key = "score"
    hooks = RolloutHooks(reward_post_process=hook)
    raw, rewards, _ = step_rewards(samples, hooks=hooks, ctx=args, algo=setup.algo, rollout=setup.rollout)
    assert raw.tolist() == [1.0, 0.0, 1.0, 1.0]
    if (
        hook is None
    ):  # grpo: group mean-centred, divided by the group std (n = 2: ±0.7071 up to its epsilon; zero std: 0)
        assert rewards.tolist() == pytest.approx([0.7071068, -0.7071068, 0.0, 0.0], abs=1e-5)
    else:
        assert rewards.tolist() == [2.0, 0.0, 2.0, 2.0]
