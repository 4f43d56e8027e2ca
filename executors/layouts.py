"""The small value types of a run plan that every worker process reads: a role's parallel
`Layout`, its FP8 `Precision`, and the `EngineGroup` a rollout worker runs. Plain dataclasses
that import nothing of the planner, so that `executors.roles` (which every Ray worker imports,
the CPU-only environment and rule-reward workers too) does not load the plan file's pydantic
models, the cost model or numpy; `executors.runplan` builds them from a `Plan` and re-exports
them."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Layout:
    """A role's parallel layout: data-, tensor- and pipeline-parallel degrees, the HSDP
    shard group (`shard` dp ranks; 0: FSDP over all of dp), whether decoder layers recompute
    their activations in the backward pass (`recompute`), the expert-parallel degree of a
    mixture of experts (`ep`, `executors.experts`) and the context-parallel degree of a
    trainer (`cp`, `executors.cpattn`: each sequence split over cp ranks)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    shard: int = 0
    recompute: bool = field(default=False, kw_only=True)  # never from a positional tuple
    ep: int = field(default=1, kw_only=True)  # expert parallelism, over the dp (x cp x tp) ranks
    cp: int = field(default=1, kw_only=True)  # context parallelism (training)

    @property
    def hsdp(self) -> bool:
        """Whether the dp ranks form dp / shard replicas of a `shard`-rank FSDP group."""
        return 0 < self.shard < self.dp

    @property
    def world(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    def rank_of(self, p: int, d: int, c: int, t: int) -> int:
        """The rank of pipeline stage p, dp index d, cp index c, tp index t: `((p * dp + d) *
        cp + c) * tp + t` (Megatron-Core's order: tp fastest, then cp, dp, pp)."""
        return ((p * self.dp + d) * self.cp + c) * self.tp + t

    def coords(self, rank: int) -> tuple[int, int]:
        """(dp index, tp index) of a rank (`rank_of`)."""
        return rank // (self.tp * self.cp) % self.dp, rank % self.tp

    def cp_index(self, rank: int) -> int:
        """The rank's index in its context-parallel group (its slice of every sequence)."""
        return rank // self.tp % self.cp

    def stage(self, rank: int) -> int:
        """The pipeline stage of a rank."""
        return rank // (self.dp * self.cp * self.tp)

    def heads_stage(self, rank: int) -> bool:
        """Whether the rank speaks for its pipeline stage: dp, cp and tp index 0."""
        return self.coords(rank) == (0, 0) and self.cp_index(rank) == 0

    def leads(self, rank: int) -> bool:
        """Whether the rank speaks for its DP group: TP and CP index 0 on the last pipeline
        stage (where the loss is computed; a CP group's ranks all hold its sum)."""
        return (self.coords(rank)[1] == 0 and self.cp_index(rank) == 0
                and self.stage(rank) == self.pp - 1)

    @property
    def degrees(self) -> Layout:
        """dp, tp and pp alone (no shard group, no recompute): what an engine runs."""
        return Layout(self.dp, self.tp, self.pp)

    def as_dict(self) -> dict[str, int]:
        out = {"dp": self.dp, "tp": self.tp, "pp": self.pp}
        out = {**out, "shard": self.shard} if self.hsdp else out
        out = {**out, "cp": self.cp} if self.cp > 1 else out
        return {**out, "ep": self.ep} if self.ep > 1 else out

    def __str__(self) -> str:
        return (f"dp{self.dp} tp{self.tp} pp{self.pp}" + (f" cp{self.cp}" if self.cp > 1 else "")
                + (f" shard{self.shard}" if self.hsdp else "")
                + (f" ep{self.ep}" if self.ep > 1 else "") + (" recompute" if self.recompute else ""))


@dataclass(frozen=True)
class Precision:
    """The plan's FP8 choices for a role (BF16 otherwise)."""

    fp8_weights: bool = False
    fp8_kv: bool = False
    fp8_train: bool = False


@dataclass(frozen=True)
class EngineGroup:
    """Rollout engine replicas as they run (a split rollout's part, or the whole rollout on one
    pool): ranks `first` to `first + replicas - 1`, on `pool`, each engine with tensor
    parallelism `tp` and the plan's memory share of its device."""

    pool: str = ""
    first: int = 0
    replicas: int = 1
    tp: int = 1
    mem_fraction: float = 0.2
    colocated: bool = False  # shares its slot with the trainer: sleeps while it trains

    def holds(self, rank: int) -> bool:
        return self.first <= rank < self.first + self.replicas
