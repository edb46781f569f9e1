"""RankLayout: coordinates, shards, owners and groups as data (the dispatch the runtime relies on)."""

from __future__ import annotations

import pytest

from slime.train.layout import RankLayout


def test_coordinates_tp_fastest_then_cp_dp_pp():
    layout = RankLayout(dp=2, tp=2, cp=1, pp=2)
    assert layout.world_size == 8
    coords = [layout.coords(r) for r in range(8)]
    assert [(c.tp_rank, c.dp_rank, c.pp_rank) for c in coords] == [
        (0, 0, 0),
        (1, 0, 0),
        (0, 1, 0),
        (1, 1, 0),
        (0, 0, 1),
        (1, 0, 1),
        (0, 1, 1),
        (1, 1, 1),
    ]
    assert all(
        layout.rank_of(dp_rank=c.dp_rank, tp_rank=c.tp_rank, cp_rank=c.cp_rank, pp_rank=c.pp_rank) == c.rank
        for c in coords
    )


def test_every_rank_of_a_shard_gets_it_and_the_last_stage_owns_it():
    layout = RankLayout(dp=2, tp=2, cp=2, pp=2)
    assert layout.model_parallel_ranks(0) == [0, 1, 2, 3, 8, 9, 10, 11]
    assert [layout.shard_of(r) for r in range(16)] == [0] * 4 + [1] * 4 + [0] * 4 + [1] * 4
    assert layout.owners() == [8, 12]  # tp 0, cp 0, last pipeline stage
    assert layout.dp_group_ranks(9) == [9, 13] and layout.tp_group_ranks(13) == [12, 13]
    assert layout.is_source(0) and not any(layout.is_source(r) for r in range(1, 16))


def test_for_world_and_bad_sizes():
    assert RankLayout.for_world(8, tp=2, pp=2) == RankLayout(dp=2, tp=2, pp=2)
    assert RankLayout.for_world(4).owners() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="does not divide 6 training ranks"):
        RankLayout.for_world(6, tp=4)
    with pytest.raises(ValueError, match="ep·etp=4 must divide"):
        RankLayout(dp=2, ep=4)
    with pytest.raises(ValueError, match="outside a world of 2"):
        RankLayout(dp=2).coords(2)
