"""The fsdp backend with tensor parallelism: a group whose world size exceeds its data-parallel size.

Every rank of a shard's tp group receives the same shard (as the runtime deals them by `RankLayout`),
and the step equals the single-rank step: same log-probs, losses, gradient norm and parameters.
"""

from __future__ import annotations

import torch

from slime.train.layout import RankLayout
from tests.helpers.fsdp_rank import (
    TP_OVERRIDES,
    make_samples,
    make_setup,
    run_tp_group,
)


def test_tp2_and_dp2_tp2_equal_one_rank(tiny_model_dir, tmp_path):
    setup = make_setup(tiny_model_dir, [*TP_OVERRIDES, f"checkpoint.ref_load={tiny_model_dir}"])
    samples = make_samples(16, seed=7)
    (single,) = run_tp_group(setup, samples, RankLayout(dp=1), tmp_path / "one", 29531)
    for layout, port in ((RankLayout(dp=1, tp=2), 29532), (RankLayout(dp=2, tp=2), 29533)):
        ranks = run_tp_group(setup, samples, layout, tmp_path / f"dp{layout.dp}", port)
        assert ranks[0]["sharded"] and "model.layers.0.self_attn.q_proj.weight" in ranks[0]["sharded"]
        for rank, out in enumerate(ranks):
            # the ranks of one tp group saw identical data and compute identical results
            twin = ranks[layout.tp_group_ranks(rank)[0]]
            assert torch.equal(out["log_probs"], twin["log_probs"])
            for a, b in zip(out["result"]["steps"], twin["result"]["steps"]):
                assert a == b, {k: (a[k], b[k]) for k in a if a[k] != b[k]}
        if layout.dp == 1:
            torch.testing.assert_close(ranks[0]["log_probs"], single["log_probs"], rtol=0, atol=1e-5)
        for mine, ref in zip(ranks[0]["result"]["steps"], single["result"]["steps"]):
            for key in ("train/pg_loss", "train/kl_loss", "train/entropy_loss", "train/grad_norm", "train/ppo_kl"):
                assert abs(mine[key] - ref[key]) <= 1e-5 * max(1.0, abs(ref[key])), (layout, key, mine[key], ref[key])
        # As in the data-parallel test: Adam moves an element with a near-zero gradient by about lr whatever
        # its size, so fp32 summation order shows there; compare at 1% of lr.
        for name, param in single["params"].items():
            torch.testing.assert_close(ranks[0]["params"][name], param, rtol=1e-4, atol=0.01 * setup.train.lr)
