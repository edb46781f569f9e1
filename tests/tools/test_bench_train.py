"""tools/bench_train.py's batch: the synthetic RL-shaped one, or a run's own rollout dump (--batch-from)."""

from __future__ import annotations

from argparse import Namespace

from slime.rollout.dumps import save_rollout_data
from slime.types import Sample
from tools.bench_train import batch_lengths
from tools.bench_train_steps import rl_batch_lengths


def test_the_bench_trains_on_a_runs_dumped_batch_in_its_order(tmp_path):
    groups = [
        [
            Sample(
                index=2 * g + i,
                group_index=g,
                tokens=list(range(p + r)),
                response_length=r,
                loss_mask=[1] * r,
                reward=0.0,
            )
            for i, (p, r) in enumerate(pair)
        ]
        for g, pair in enumerate([[(10, 1024), (10, 7)], [(33, 512), (12, 1)]])
    ]
    dump = save_rollout_data(tmp_path, 2, groups)
    assert dump == tmp_path / "rollout_data" / "2.jsonl"
    assert batch_lengths(Namespace(batch_from=str(dump), seed=0)) == [(10, 1024), (10, 7), (33, 512), (12, 1)]
    assert batch_lengths(Namespace(batch_from=None, seed=3)) == rl_batch_lengths(3)
