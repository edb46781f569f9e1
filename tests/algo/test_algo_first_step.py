"""Each algo option's rollout step on one fsdp rank driven directly, in the driver's order: the rollout side's reward
transform (`post_process_rewards`), the reference and old log-probs, the trainer's advantages and two optimizer
steps. Step 0 is on policy: the recomputed log-probs equal the old and the reference ones, so ppo_kl, the clip
fraction and the KL loss are exactly 0; step 1 is not. The options whose runs differ beyond their estimator record
also run through `python main.py` (tests/helpers/algo_options.py)."""

from __future__ import annotations

import pytest
import torch

from slime.rollout.postprocess import post_process_rewards, split_for_data_parallel
from tests.helpers.algo_options import IN_PROCESS
from tests.helpers.fsdp_rank import make_backend, make_samples, make_setup, train_rollout

GROUP = 4  # samples a prompt (make_samples: group_index = i // 4)
SIZES = [
    "rollout.batch_size=4",
    f"rollout.n_samples_per_prompt={GROUP}",
    "train.global_batch_size=8",
    "train.num_steps_per_rollout=2",
    "algo.use_kl_loss=true",
    "algo.kl_loss_coef=0.001",
]
TRAIN_METRICS = {"train/pg_loss", "train/entropy_loss", "train/kl_loss", "train/grad_norm"}
POLICY_METRICS = TRAIN_METRICS | {"train/pg_clipfrac", "train/ppo_kl", "train/train_rollout_logprob_abs_diff"}


@pytest.mark.parametrize("algo", IN_PROCESS)
def test_the_first_step_is_on_policy_and_the_second_is_not(algo, tiny_model_dir):
    setup = make_setup(tiny_model_dir, [f"algo={algo}", f"checkpoint.ref_load={tiny_model_dir}", *SIZES])
    samples = make_samples(16, seed=3)
    for sample in samples:  # each response ends in a trained token (reinforce++ rewards the last one)
        sample.loss_mask[-1] = 1
    raw = torch.tensor([s.reward for s in samples])
    rewards = post_process_rewards(raw, setup.algo, GROUP)
    (batch,) = split_for_data_parallel(samples, raw.tolist(), rewards.tolist(), step_sizes=[8] * 2, dp_size=1)
    steps = train_rollout(make_backend(setup), batch)["steps"]
    assert len(steps) == 2
    first, second = steps
    assert first["train/kl_loss"] == 0.0 and second["train/kl_loss"] != 0.0
    if algo == "sft":  # its NLL falling: the end-to-end run on chat data
        assert TRAIN_METRICS <= set(first)
        return
    assert POLICY_METRICS <= set(first)
    assert first["train/ppo_kl"] == 0.0 and first["train/pg_clipfrac"] == 0.0
    assert second["train/ppo_kl"] != 0.0
