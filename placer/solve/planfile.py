"""The plan: the one file that `plan` writes and `simulate`, `execute` and the notebooks read.

A plan holds the job it was made for (so it stands alone), the chosen config of every role, the
colocation slots, every device named in a Ray bundle (pool, node, device indices), the weight-sync
routes, the predicted iteration time with its breakdown, and the solver's status, bound and gap.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
)

from placer.base.errors import SpecError
from placer.base.fileio import atomic_write_text
from placer.base.roles import TRAINING_ROLES, is_training
from placer.cost.calibration import CalibrationField
from placer.cost.efficiency import Calibration
from placer.cost.sharding import Parallel
from placer.spec.catalog import Resolved, resolve
from placer.spec.errorlines import format_validation_error
from placer.spec.job import Job
from placer.spec.load import read_structured
from placer.spec.pipeline import PipelineMode


class _M(BaseModel):
    # allow_inf_nan=False: a plan written as YAML could say `.inf` where JSON cannot; no plan field
    # means an infinite or undefined number.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class _Parted(_M):
    """A role or slot that may be split over pools: its `parts` (each with `pool` and
    `devices`), or none when it sits on its one `pool`."""

    if TYPE_CHECKING:  # the subclasses' fields (declared there, so they keep their order)
        pool: str
        devices: int
        parts: list[Any]

    def pool_devices(self) -> list[tuple[str, int]]:
        """(pool, devices) held: its pool, or each part's."""
        return [(p.pool, p.devices) for p in self.parts] or [(self.pool, self.devices)]

    @model_serializer(mode="wrap")
    def _without_empty_parts(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """One pool: written without `parts`, a role without HSDP without `shard`, one without a
        chosen micro-batch without `micro_batch`, one without data-parallel attention without
        `attn_dp`, a whole frozen copy without `sharded_weights`, one whose weights stay on the GPU
        without `stream_params_bytes` (plan files stay as they
        were)."""
        out: dict[str, Any] = handler(self)
        if not out.get("parts"):
            out.pop("parts", None)
        if not out.get("shard"):
            out.pop("shard", None)
        if not out.get("micro_batch", 1):
            out.pop("micro_batch", None)
        if not out.get("sharded_weights", True):
            out.pop("sharded_weights", None)
        if out.get("attn_dp") == 1:
            out.pop("attn_dp", None)
        if not out.get("stream_params_bytes", 1):
            out.pop("stream_params_bytes", None)
        if not out.get("park_optimizer", True):
            out.pop("park_optimizer", None)
            out.pop("parked_gb", None)
        return out


class RolePart(_M):
    """One part of a role split over pools (`placer.cost.split`): its own devices, layout and share."""

    pool: str
    devices: int = Field(ge=1)
    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    dp: int = Field(1, ge=1)
    ep: int = Field(1, ge=1)
    attn_dp: int = Field(1, ge=1, description="data-parallel attention groups of a replica")
    fp8_weights: bool = False
    fp8_kv: bool = False
    share: float = Field(gt=0, le=1, description="fraction of the batch's samples it generates")
    samples: int = Field(ge=1, description="samples of the batch it generates")
    time_s: float = Field(0.0, ge=0)
    stage_s: dict[str, float] = {}
    memory_gb: float = Field(0.0, ge=0)
    concurrency: int = Field(0, ge=0)

    @property
    def par(self) -> Parallel:
        return Parallel(self.tp, self.pp, self.dp, ep=self.ep, fp8_weights=self.fp8_weights,
                        fp8_kv=self.fp8_kv, attn_dp=self.attn_dp)

    @model_serializer(mode="wrap")
    def _without_default_attn_dp(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Written without `attn_dp` where it is 1 (plan files stay as they were)."""
        out: dict[str, Any] = handler(self)
        if out.get("attn_dp") == 1:
            out.pop("attn_dp", None)
        return out


class RolePlacement(_Parted):
    pool: str
    devices: int = Field(ge=0)
    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    dp: int = Field(1, ge=1)
    zero: int = Field(3, ge=0, le=3)
    recompute: bool = True
    offload: bool = False
    cp: int = Field(1, ge=1, description="context parallelism (training)")
    ep: int = Field(1, ge=1, description="expert parallelism (mixture of experts)")
    etp: int = Field(1, ge=1, description="expert tensor parallelism (with ep > 1)")
    attn_dp: int = Field(1, ge=1, description="rollout engine: data-parallel attention groups "
                         "inside one replica of tp ranks (experts split over ep = tp)")
    sharded_weights: bool = Field(False, description="a frozen model (reference, reward) on "
                                  "GPUs: weights FSDP-sharded over its dp ranks, not a whole "
                                  "copy on each tp x pp group")
    shard: int = Field(0, ge=0, description="HSDP: dp ranks of one ZeRO shard group, which the "
                       "dp / shard groups replicate (0: ZeRO over all of dp; training roles)")
    micro_batch: int = Field(0, ge=0, description="training: sequences per micro-batch on one "
                             "device, chosen and priced by the planner (0: micro-batches of a "
                             "token budget)")
    park_optimizer: bool = Field(False, description="training: the optimizer state parked in "
                                 "host memory between phases and brought back for the step, "
                                 "which runs on the GPU (unlike `offload`)")
    stream_params_bytes: float = Field(0.0, ge=0, description="a frozen model (reference) on "
                                       "GPUs: its weights held in host memory and streamed to "
                                       "the GPU per forward micro-batch (FSDP CPU offload), "
                                       "bytes a parameter of the host copy (0: on the GPU)")
    fp8_weights: bool = Field(False, description="FP8 inference weights (job precision)")
    fp8_kv: bool = Field(False, description="FP8 KV cache (job precision)")
    fp8_train: bool = Field(False, description="FP8 training GEMMs (job precision)")
    slot: str
    time_s: float = Field(0.0, ge=0)
    stage_s: dict[str, float] = {}
    memory_gb: float = Field(0.0, ge=0)
    parked_gb: float = Field(0.0, ge=0, description="GB per device of optimizer state parked in "
                             "host memory between phases (`park_optimizer`), within memory_gb")
    concurrency: int = Field(0, ge=0, description="rollout: sequences per engine replica")
    parts: list[RolePart] = Field([], description="a role split over pools: one entry per pool "
                                  "(`pool`, `devices` and the layout above are the first part's "
                                  "pool, the total and the first part's layout)")

    @property
    def par(self) -> Parallel:
        return Parallel(self.tp, self.pp, self.dp, self.zero, self.recompute, self.offload,
                        self.cp, self.ep, self.etp, self.fp8_weights, self.fp8_kv, self.fp8_train,
                        shard=self.shard, attn_dp=self.attn_dp,
                        sharded_weights=self.sharded_weights, micro_batch=self.micro_batch,
                        park_optimizer=self.park_optimizer,
                        stream_params_bytes=self.stream_params_bytes)


class SlotPart(_M):
    """The devices a split role's slot holds on one of its pools."""

    pool: str
    devices: int = Field(ge=1)
    nodes: list[int] = []


class SlotPlan(_Parted):
    name: str
    pool: str
    devices: int = Field(ge=1)
    roles: list[str]
    nodes: list[int] = []
    parts: list[SlotPart] = Field([], description="a split role's slot: its devices per pool "
                                  "(`pool` is the first part's, `devices` the total)")


class Bundle(_M):
    """One Ray placement-group bundle: devices of one node that one slot uses."""

    index: int = Field(ge=0)
    slot: str
    pool: str
    node: int = Field(ge=0)
    devices: list[int]
    resources: dict[str, float]
    group: str = Field("", description="tensor-parallel group id; a group never spans bundles")


class SyncRoute(_M):
    src: str = Field(description="pool:node of the sender")
    dst: str = Field(description="pool:node of the receiver")
    gbs: float = Field(gt=0)
    hops: list[str] = []


class SearchSpace(_M):
    """The space the solver's status and gap are relative to: every plan that picks, for each of
    `roles`, one of the `layouts` single-pool candidates (every parallel layout and device count
    the role's pools allow, less those another candidate on the same pool beats on devices,
    every stage and memory) or one of the split candidates, with any grouping into slots that
    fits the pools. `split_counts`: pairs of parts over every pair of pools, each part at every
    layout it has alone; `pruned_by_bound` of them are proven unable to be in a plan better than
    a feasible one (`placer.solve.ilp_bound.split_keep`), `dominated` are beaten by another
    split of the same pools on devices and every stage."""

    roles: int = Field(ge=0)
    layouts: int = Field(ge=0)
    split_counts: int = Field(ge=0)
    pruned_by_bound: int = Field(ge=0)
    dominated: int = Field(0, ge=0)
    relative_to: str = ""


class SolverInfo(_M):
    name: str = "cp-sat"
    status: str
    objective: float
    bound: float
    gap: float = Field(ge=0)
    solve_s: float = Field(ge=0)
    # None in plans written before it was recorded, and for plans no solver chose (baselines)
    search_space: SearchSpace | None = None

    @model_serializer(mode="wrap")
    def _without_unrecorded_space(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A plan written before the search space was recorded is written back without it."""
        out: dict[str, Any] = handler(self)
        if out.get("search_space") is None:
            out.pop("search_space", None)
        return out


class Breakdown(_M):
    stage_s: dict[str, float]
    slot_busy_s: dict[str, float]
    switch_s: dict[str, float] = {}
    sync_s: float = 0.0


class BandRow(_M):
    """A published run a band was taken from: its leave-one-out error and its tags unlike the
    plan's."""

    name: str
    error: float
    differing_tags: int = Field(ge=0)


class BandSource(_M):
    """Where a plan's band came from (`placer.cost.band`): the plan's tags, the published rows
    used and the widening their dissimilarity gave."""

    tags: dict[str, str]
    widen: float = Field(ge=0)
    rows: list[BandRow]
    table: str = Field(description="the command that wrote the residual table")


class Choice(_M):
    """How a plan was picked among alternatives (`placer.solve.robust`): by `rule` "robust", the
    smallest band upper end; `plain` is the plan the predicted-time rule would have picked, with
    its predicted time and band."""

    rule: Literal["robust"]
    chosen: str = Field(description="the chosen alternative's name (ilp or a baseline)")
    candidates: list[str] = Field(description="the alternatives it was chosen among")
    plain: str
    plain_predicted_s: float = Field(gt=0)
    plain_band: tuple[float, float]


class Plan(_M):
    version: Literal[1] = 1
    job: dict[str, Any]
    mode: Literal["sync", "async"]
    objective: Literal["time", "cost"]
    predicted_iteration_s: float = Field(gt=0)
    # [lo, hi]: the range the cost model was right within on comparable published runs,
    # leave-one-out (`placer.cost.band`); None in plans written before it was recorded.
    predicted_iteration_s_band: tuple[float, float] | None = None
    band_source: BandSource | None = None
    throughput_samples_s: float = Field(0.0, ge=0)
    cost_per_sample: float = Field(0.0, ge=0, description="USD per sample of the devices used")
    # What the plan's devices cost against what the job's cluster books (every node of every
    # pool, idle or not: `placer.solve.pricing`); 0 in plans written before they were recorded.
    used_usd_per_hour: float = Field(0.0, ge=0)
    booked_usd_per_hour: float = Field(0.0, ge=0)
    booked_cost_per_sample: float = Field(0.0, ge=0)
    breakdown: Breakdown
    roles: dict[str, RolePlacement]
    slots: list[SlotPlan]
    bundles: list[Bundle] = []
    sync_routes: list[SyncRoute] = []
    solver: SolverInfo
    # The profile the plan was priced with (its document, as read); null: the shipped factors.
    calibration: CalibrationField = None
    # How the plan was picked among alternatives; None: the ILP's plan as solved.
    choice: Choice | None = None

    # `job` stays the plain dict it is in the plan file (the JSON format is the contract); `spec`
    # and `resolved()` are its typed views, validated once per plan and cached. The cache is keyed
    # on the dict's identity, so a `model_copy(update={"job": ...})` never sees a stale view.
    _views: dict[str, tuple[Any, Any]] = PrivateAttr(default_factory=dict)

    def _view(self, name: str, make: Callable[[], Any]) -> Any:
        hit = self._views.get(name)
        if hit is None or hit[0] is not self.job:
            hit = (self.job, make())
            self._views[name] = hit
        return hit[1]

    @property
    def spec(self) -> Job:
        """The plan's job, validated: the typed view every reader uses (cached)."""
        job: Job = self._view("spec", lambda: Job.model_validate(self.job))
        return job

    @property
    def pipeline(self) -> PipelineMode:
        """What the plan's pipeline mode does (`placer.spec.pipeline`)."""
        return self.spec.pipeline.mechanism

    def resolved(self) -> Resolved:
        """The job with its cluster, device types and models looked up in the catalogs (cached)."""
        res: Resolved = self._view("resolved", lambda: resolve(self.spec, "plan.job"))
        return res

    def __eq__(self, other: object) -> bool:
        """Equal fields are equal plans, whichever cached views either has built."""
        if not isinstance(other, Plan):
            return NotImplemented
        return self.__dict__ == other.__dict__

    __hash__ = None  # type: ignore[assignment]  # the job dict is not hashable anyway

    @model_serializer(mode="wrap")
    def _without_unrecorded_band(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A plan written before bands were recorded is written back without them (its file
        stays as it was)."""
        out: dict[str, Any] = handler(self)
        if out.get("predicted_iteration_s_band") is None and out.get("band_source") is None:
            out.pop("predicted_iteration_s_band", None)
            out.pop("band_source", None)
        if out.get("choice") is None:  # a plan not chosen among alternatives has no `choice`
            out.pop("choice", None)
        return out

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)


def save_plan(plan: Plan, path: str | Path) -> None:
    atomic_write_text(path, plan.to_json())


def load_plan(path: str | Path) -> Plan:
    """Read a plan and check it against its own job; SpecError naming the field otherwise."""
    data = read_structured(path)
    if isinstance(data, dict) and "roles" not in data and {"models", "cluster"} <= data.keys():
        raise SpecError(f"{path}: this is a job file, not a plan: make one with "
                        f"`placer plan {path} -o plan.json` and pass plan.json")
    try:
        plan = Plan.model_validate(data)
    except ValidationError as e:
        raise SpecError(format_validation_error(e, f"{path}: ")) from None
    try:
        res = plan.resolved()
    except ValidationError as e:
        raise SpecError(format_validation_error(e, f"{path}: job.")) from None
    check_plan(plan, res, str(path))
    return plan


def check_plan(plan: Plan, res: Resolved, source: str = "plan") -> None:
    """A plan must place exactly its job's roles on pools that exist, within their sizes."""
    want = {str(r) for r in res.job.role_names()}
    have = set(plan.roles)
    if want != have:
        raise SpecError(f"{source}: roles: plan places {sorted(have)} but its job runs "
                        f"{sorted(want)}")
    slots = {s.name: s for s in plan.slots}
    for name, r in plan.roles.items():
        fields = [(f"roles.{name}", r.pool, r.devices)] if not r.parts else [
            (f"roles.{name}.parts.{i}", p.pool, p.devices) for i, p in enumerate(r.parts)]
        for field, pool_name, devices in fields:
            try:
                pool = res.cluster.pool(pool_name)
            except KeyError:
                raise SpecError(f"{source}: {field}.pool: no pool {pool_name!r} in the job's "
                                "cluster") from None
            if devices > pool.devices_per_node * pool.nodes:
                raise SpecError(f"{source}: {field}.devices: {devices} exceeds pool "
                                f"{pool.name}'s {pool.devices_per_node * pool.nodes}")
        if r.slot not in slots:
            raise SpecError(f"{source}: roles.{name}.slot: no slot {r.slot!r} in slots")
        if r.parts:
            _check_parts(name, r, res, source)
        if r.shard:
            _check_shard(name, r, source)
    used: dict[str, int] = {}
    for s in plan.slots:
        for pool_name, n in s.pool_devices():
            used[pool_name] = used.get(pool_name, 0) + n
    for pool_name, n in used.items():
        pool = res.cluster.pool(pool_name)
        if n > pool.devices_per_node * pool.nodes:
            raise SpecError(f"{source}: slots: pool {pool_name} given {n} devices, has "
                            f"{pool.devices_per_node * pool.nodes}")


def _check_parts(name: str, r: RolePlacement, res: Resolved, source: str) -> None:
    """A split role's parts add up: devices to the role's, samples to the batch's."""
    if len(r.parts) < 2:
        raise SpecError(f"{source}: roles.{name}.parts: a split role has at least 2 parts, "
                        f"got {len(r.parts)} (drop `parts` for a role on one pool)")
    total = sum(p.devices for p in r.parts)
    if total != r.devices:
        raise SpecError(f"{source}: roles.{name}.devices: {r.devices}, but its parts hold "
                        f"{total}")
    samples, want = sum(p.samples for p in r.parts), res.job.batch.samples
    if samples != want:
        raise SpecError(f"{source}: roles.{name}.parts: the parts' samples add up to {samples}, "
                        f"the batch has {want}")


def _check_shard(name: str, r: RolePlacement, source: str) -> None:
    """An HSDP shard group belongs to a training role and splits its dp ranks evenly."""
    if not is_training(name):
        raise SpecError(f"{source}: roles.{name}.shard: {r.shard}, but only a training role "
                        f"({', '.join(sorted(TRAINING_ROLES))}) shards its state (drop `shard`)")
    if r.dp % r.shard:
        raise SpecError(f"{source}: roles.{name}.shard: {r.shard} does not divide dp {r.dp} "
                        "(the shard groups must split the data-parallel ranks evenly)")


def calibration_of(plan: Plan) -> Calibration:
    """The factors the plan was priced with: its profile, or the shipped defaults."""
    return plan.calibration if plan.calibration is not None else Calibration()


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=False, default=str)
