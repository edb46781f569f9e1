"""Training ranks as data: parallel sizes and each rank's coordinates (docs/architecture.md#ranklayout).

Rank order, fastest-varying first: tp, cp, dp, pp (Megatron's default order with ep folded into
the data-parallel ranks, as slime runs it). So ranks 0..tp-1 are one tensor-parallel group, and the
ranks of one data-parallel shard are every rank with the same (dp) coordinate across tp, cp and pp.

The runtime uses the layout to (1) hand data-parallel shard d to every rank whose `dp_rank` is d,
and (2) read each result from the one rank that owns it (`owner_of(d)`): tp 0, cp 0 and the LAST
pipeline stage, where losses, log-probs and values exist. Weights are exported by the ranks of dp 0,
cp 0 (and every pp stage and tp rank takes part in the gather); `is_source` marks the rank that hands
them to the weight-sync object.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, kw_only=True)
class RankCoords:
    """Where one rank sits in every parallel dimension."""

    rank: int
    dp_rank: int
    tp_rank: int
    cp_rank: int
    pp_rank: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class RankLayout:
    """Sizes of every parallel dimension; world size = dp · tp · cp · pp.

    `ep` (experts per expert-parallel group) and `etp` (tensor parallel inside experts) split the MoE
    layers across ranks of the same data shard set; they do not change how data is dealt.
    """

    dp: int
    tp: int = 1
    cp: int = 1
    pp: int = 1
    ep: int = 1
    etp: int = 1

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "cp", "pp", "ep", "etp"):
            if getattr(self, name) < 1:
                raise ValueError(f"RankLayout.{name}={getattr(self, name)} must be >= 1")
        if (self.dp * self.cp * self.tp) % (self.ep * self.etp):
            raise ValueError(f"ep·etp={self.ep * self.etp} must divide dp·cp·tp={self.dp * self.cp * self.tp}")

    @classmethod
    def for_world(
        cls, world_size: int, *, tp: int = 1, cp: int = 1, pp: int = 1, ep: int = 1, etp: int = 1
    ) -> RankLayout:
        """The layout of `world_size` ranks with these model-parallel sizes; dp is what remains."""
        model_parallel = tp * cp * pp
        if model_parallel < 1 or world_size % model_parallel:
            raise ValueError(f"tp·cp·pp={model_parallel} does not divide {world_size} training ranks")
        return cls(dp=world_size // model_parallel, tp=tp, cp=cp, pp=pp, ep=ep, etp=etp)

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.cp * self.pp

    def coords(self, rank: int) -> RankCoords:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside a world of {self.world_size}")
        tp_rank, rest = rank % self.tp, rank // self.tp
        cp_rank, rest = rest % self.cp, rest // self.cp
        dp_rank, pp_rank = rest % self.dp, rest // self.dp
        return RankCoords(rank=rank, dp_rank=dp_rank, tp_rank=tp_rank, cp_rank=cp_rank, pp_rank=pp_rank)

    def rank_of(self, *, dp_rank: int, tp_rank: int = 0, cp_rank: int = 0, pp_rank: int = 0) -> int:
        return ((pp_rank * self.dp + dp_rank) * self.cp + cp_rank) * self.tp + tp_rank

    def shard_of(self, rank: int) -> int:
        """The data-parallel shard `rank` trains on."""
        return self.coords(rank).dp_rank

    def owner_of(self, dp_rank: int) -> int:
        """The rank whose results for shard `dp_rank` count: tp 0, cp 0, last pipeline stage."""
        return self.rank_of(dp_rank=dp_rank, pp_rank=self.pp - 1)

    def owners(self) -> list[int]:
        """One owner rank per data-parallel shard, in shard order."""
        return [self.owner_of(d) for d in range(self.dp)]

    def is_source(self, rank: int) -> bool:
        """The rank that hands exported weights to the weight-sync object (dp 0, tp 0, cp 0, stage 0)."""
        return rank == 0

    def model_parallel_ranks(self, dp_rank: int) -> list[int]:
        """Every rank that receives shard `dp_rank` (its tp × cp × pp group)."""
        return [r for r in range(self.world_size) if self.coords(r).dp_rank == dp_rank]

    def dp_group_ranks(self, rank: int) -> list[int]:
        """The ranks that hold the same model slice as `rank` (same tp, cp, pp coordinates): gradients
        are summed over them."""
        c = self.coords(rank)
        return [
            self.rank_of(dp_rank=d, tp_rank=c.tp_rank, cp_rank=c.cp_rank, pp_rank=c.pp_rank) for d in range(self.dp)
        ]

    def tp_group_ranks(self, rank: int) -> list[int]:
        c = self.coords(rank)
        return [
            self.rank_of(dp_rank=c.dp_rank, tp_rank=t, cp_rank=c.cp_rank, pp_rank=c.pp_rank) for t in range(self.tp)
        ]


def pipeline_stage_layers(
    num_layers: int, pp: int, *, first: int | None = None, last: int | None = None
) -> tuple[int, ...]:
    """Decoder layers per pipeline stage, in stage order: `first` and `last` where given (megatron's
    num_layers_in_first/last_pipeline_stage), the remaining layers split equally over the other stages (every
    stage equal where neither is given). ValueError where they do not split so."""
    ends = {0: first, pp - 1: last} if pp > 1 else {0: first}
    fixed = {stage: n for stage, n in ends.items() if n is not None}
    if any(n < 1 for n in fixed.values()):
        raise ValueError(f"a pipeline stage needs at least one layer: first={first}, last={last}")
    rest, middle = num_layers - sum(fixed.values()), pp - len(fixed)
    if (middle == 0 and rest != 0) or (middle > 0 and (rest < middle or rest % middle)):
        raise ValueError(
            f"{num_layers} layers over {pp} pipeline stages (first={first}, last={last}): the other "
            f"{middle} stage(s) cannot share the remaining {rest} equally"
        )
    return tuple(fixed.get(stage, rest // middle if middle else 0) for stage in range(pp))
