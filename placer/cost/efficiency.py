"""Efficiency factors: the achieved fractions of peak and the fixed overheads the cost model
multiplies its first-principles work by, and the calibration profile that overrides them.

Every factor is a named field of `Efficiency` with a default from a public source;
docs/cost-model.md lists each with its value, unit, source and how `placer calibrate` refits it
(tests/test_cost_model_doc.py keeps that table and these fields in step).

`Calibration` is the one type of a calibration profile, wherever it travels (a profile file, a
plan's `calibration`, the pricing context, `placer calibrate`'s output): the factor sets it
resolves to per device type (`for_device` picks the set a device type runs with), the factors
as the profile wrote them (`overrides`), and how `placer calibrate` fitted them (`fit`, a
`FitReport`). Its JSON/YAML form (`to_dict()`) is the profile document, exactly as it was read
or written (`placer.cost.calibration` reads it, with one message per mistake):

    default: {mfu_train: 0.35, decode_bw_eff: 0.6}
    devices:
      H100-SXM: {mfu_train: 0.45}
    fit: {...}                      # placer calibrate's report (FitReport)
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    ValidatorFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from placer.spec.hardware import DeviceType


@dataclass(frozen=True)
class Efficiency:
    """Achieved fractions of peak and fixed overheads (docs/cost-model.md: sources)."""

    mfu_train: float = 0.86  # GEMM ceiling of training passes, before memory-bound kernels (`device_ceiling`)
    # GEMM ceiling of an inference engine's forward (prefill, frozen model off-GPU), with its
    # half ridge below: fitted on Vidur's operator profiles (commit 7d47513), out-of-sample for
    # the published runs (workflows/operators.py --fit)
    mfu_prefill: float = 0.68
    # the FlashAttention kernel (placer/cost/flash.py): fraction of BF16 peak its score FLOPs
    # reach on the share of the device its grid fills, fitted with `attn_kernel_s`,
    # `attn_split_s` and `attn_append_factor` on Vidur's A100 attention kernels (commit
    # e2d00e9afba96cec9f0e7ea560bbfc4a539fae6a, data/profiling/a100/attention.csv;
    # workflows/operators.py --fit), out-of-sample for the published runs
    mfu_attention: float = 0.599
    # GEMM ceiling of a training framework's forward-only passes on a GPU: training's. verl runs
    # them on the training module's own forward (docs/cost-model.md, Scoring), and within each
    # published run (where its unpublished lengths cancel) the log-prob pass over the update
    # prices as published at 0.86 (median of rows r01-r09b: in-sample, workflows.published)
    mfu_score: float = 0.86
    nongemm_bytes_per_flop: float = 0.0045  # HBM bytes of training's non-GEMM kernels per GEMM FLOP
    gemm_half_ridge: float = 1.0  # tokens per device at half the ceiling, in ridge points (peak / bandwidth)
    prefill_half_ridge: float = 0.525  # `gemm_half_ridge` of an inference engine's forward
    # the decode step's weight-read curve: fitted on Vidur's operator profiles (commit 7d47513),
    # out-of-sample for the published runs (workflows/operators.py --fit)
    decode_bw_eff: float = 0.768  # achieved fraction of HBM bandwidth of a large-batch decode step
    decode_tp_bw_loss: float = 0.144  # decode bandwidth efficiency lost per doubling of TP
    decode_bw_half_batch: float = 0.0  # batch at which a decode step's weight read is half as efficient
    attn_kernel_s: float = 9.63e-6  # fixed GPU time of one layer's attention kernel per step
    attn_split_s: float = 5.84e-6  # a split-KV attention kernel's combine step, per layer
    # cost of a key tile a prefill kernel also writes into the paged cache, per cached tile
    attn_append_factor: float = 2.78
    decode_flops_eff: float = 0.50  # achieved fraction of peak of a compute-bound decode step
    linear_state_bytes: float = 4.0  # bytes per element of a hybrid model's Gated DeltaNet recurrent state
    # output columns of one fused-MoE tile (vLLM's default config; 0: the grid fills the device)
    fused_moe_block_n: float = 32.0
    link_eff: float = 0.80  # achieved fraction of NVLink / NIC bandwidth in collectives and transfers
    coll_base_s: float = 6.6e-6  # launch latency of one collective call
    gather_call_s: float = 0.0  # per-call cost of a whole-tensor gather where probed (0: `coll_base_s`)
    tp_call_s: float = 0.0  # per-call cost of a TP layer's all-reduce where probed (0: `tp_base_s`)
    # the TP all-reduce's own alpha-beta, a ring inside one node: fitted on Vidur's NCCL
    # all-reduce kernels (commit 7d47513) in the mode a step sees (every rank's call issued
    # before its data is needed; workflows/opfit.py), out-of-sample for the published runs
    tp_base_s: float = 4.48e-6  # per-call cost of a TP all-reduce on NVLink
    tp_hop_s: float = 1.81e-6  # per ring step of a TP all-reduce on NVLink (NCCL ratio to tp_base_s)
    tp_link_eff: float = 0.498  # achieved fraction of NVLink bandwidth of a TP all-reduce
    # per-call cost of NCCL's NVLS all-reduce (NVLink SHARP, `DeviceType.nvlink_sharp`)
    nvls_base_s: float = 2.45e-5
    # per-call cost of an engine's decode all-reduce inside a node (custom all-reduce in a CUDA graph)
    engine_ar_base_s: float = 6.6e-6
    # per-call cost of an FSDP unit's gather or reduce-scatter where probed (0: `coll_base_s`)
    fsdp_call_s: float = 0.0
    nvlink_hop_s: float = 0.6e-6  # per-hop latency of a collective over NVLink
    net_hop_s: float = 2.7e-6  # per-hop latency of a collective over the network
    # fixed time of one NCCL send/recv between two nodes (the proxy-driven RDMA write and its
    # completion): fitted on Vidur's two-node send/recv kernels (commit 7d47513), each node
    # pair on its own testbed's calibrated NIC rate (workflows/opfit.py `fit_send_recv`)
    p2p_net_s: float = 2.04e-5
    step_overhead_s: float = 0.0015  # fixed host time of one engine step
    step_overhead_per_seq_s: float = 1.0e-5  # host time per running sequence of one engine step
    eager_layer_s: float = 3.4e-4  # host time per dense layer of a decode step without CUDA graphs
    train_overhead_s: float = 0.05  # per optimizer step (optimizer, launch, sync)
    checkpoint_overhead_s: float = 0.0  # a checkpoint's fixed cost beyond gathering and writing its bytes
    # cores behind an emulated device (0: unknown, no oversubscription); a trace says it
    host_cores: float = 0.0
    engine_mem_gb: float = 2.0  # CUDA context, activations and graphs of an inference engine
    kv_mem_fraction: float = 0.90  # share of device memory an engine may use (gpu_memory_utilization)
    # sequences an engine replica runs at once at most (float: factors override as numbers)
    max_num_seqs: float = 1024
    kv_block_tokens: float = 16  # tokens per KV page: capacity counts whole pages
    lpu_hop_s: float = 3.36e-6  # per chip a token passes through
    lpu_step_s: float = 1.11e-3  # per LPU decode step, whatever the chip count
    lpu_kv_reserve: float = 0.10  # SRAM share kept for KV beyond the weights
    lpu_reload_s: float = 5.0  # fixed cost to re-push weights onto LPU chips
    offload_gbs: float = 25.0  # host <-> device copy rate
    # G fp32 parameters per second at which the host steps one trainer rank's optimizer shard
    # when the framework runs the step there (Megatron's HybridDeviceOptimizer); 0: the GPU steps
    # and `offload` only moves the state out and back (`model.offload_time`)
    host_adam_gparams_s: float = 0.0
    # CPU seconds per image patch a rank spends preparing an image on the host (decode, resize,
    # normalize, patchify: the HF image processor) where the framework's profile re-runs it
    # within the step (`FrameworkProfile.host_image_prep`, `placer.cost.vision.host_prep_s`);
    # 0: images reach the model prepared (the data loader's workers, ahead of the step)
    host_image_prep_s_per_patch: float = 0.0
    # seconds per token per MoE layer a GPU routes in a training framework's forward-only pass
    # (old and reference log-probs) beyond what its FLOPs and collectives price
    # (`model.moe_route_time`), where the framework's profile measured one; 0: none priced
    moe_route_token_layer_s: float = 0.0
    engine_sleep_s: float = 11.2  # a colocated engine's fixed sleep cost beyond copying its weights out
    engine_wake_s: float = 3.7  # its fixed wake cost beyond copying them back
    tool_overhead_s: float = 0.0  # fixed cost per tool call on top of its drawn latency
    sync_latency_s: float = 0.01  # per weight-sync transfer (setup, NCCL/RPC)
    # raw GB/s of one bucketed weight-refresh sender over the NIC: fitted on the five rows whose
    # sender is a serial walk-and-send loop (verl's checkpoint engine on H100 and GH200, NeMo-RL's
    # NCCL pairs; workflows.loo), in-sample
    sync_sender_gbs: float = 13.4
    sync_local_gbs: float = 31.0  # raw GB/s of one replica loading weights from a co-located actor
    sync_call_s: float = 2.5e-4  # each bucket call of a refresh after the first
    # an unbucketed refresh's per-tensor call: s per entry of the engine's loader walk
    # (`roofline.engine_load_entries`; vLLM's load_weights rebuilds its parameter dict and expert
    # mapping every call), fitted on verl's unbucketed NCCL rows (fully_async.md): ~1 us
    sync_load_entry_s: float = 1.0e-6
    sync_bucket_gb: float = 1.0  # bucket of a streamed refresh (0: one call per tensor, one sender)
    # a paired refit's trainer-side export: GB/s at which a sender assembles the full weights
    # from its PP / EP shards (NeMo-RL checkpoint-engine-refit.md, DeepSeek-V3: docs/cost-model.md)
    sync_export_gbs: float = 165.0
    # NeMo-RL's nccl_reshard refit (`placer.cost.refit`), per item beside the wire: each misc
    # tensor's export and load, and each grouped-expert `xferdtensor` call on an engine stream;
    # fitted on the published nccl_reshard rows (NeMo-RL nccl-reshard-refit.md and pull request
    # 2971's DGX-H100 table: workflows.loo), in-sample
    reshard_misc_tensor_s: float = 4.8e-4
    reshard_grouped_call_s: float = 4.0e-3
    dispatch_bytes_per_token: float = 56.0  # bytes a single controller ships per padded token of a pass
    dispatch_gbs: float = 0.4  # the driver's dispatch rate
    train_mem_gb: float = 1.0  # per training device: CUDA context, allocator fragmentation
    rule_reward_s: float = 0.005  # CPU seconds to verify one sample with an in-process rule
    sandbox_batch_s: float = 0.05  # per sandbox started to run answers as code
    sandbox_sample_s: float = 0.002  # per answer run in a sandbox

    def override(self, values: dict[str, float]) -> Efficiency:
        known = {f.name for f in fields(self)}
        bad = sorted(set(values) - known)
        if bad:
            raise KeyError(f"unknown efficiency factor(s) {bad}; known: {sorted(known)}")
        return replace(self, **values)


Factors = Mapping[str, float]  # factor name -> value, as a profile writes it (an int stays one)
SECTIONS = ("default", "devices", "fit")  # the keys of a profile document


@dataclass(frozen=True)
class Overrides:
    """The factors a profile sets, as its document wrote them: `default` (every device type)
    and `devices` (per device type, on top of `default`), each None where the document said
    `null`, and the document's keys in its order (`SECTIONS`), so that writing a profile back
    gives the text it was read from."""

    default: Factors | None = None
    devices: Mapping[str, Factors | None] | None = None
    keys: tuple[str, ...] = ("default", "devices")

    def resolve(self) -> tuple[Efficiency, dict[str, Efficiency]]:
        """The factor sets they give: (every device type's, per device type). KeyError naming
        an unknown factor."""
        default = Efficiency().override({k: float(v) for k, v in (self.default or {}).items()})
        return default, {name: default.override({k: float(v) for k, v in (f or {}).items()})
                         for name, f in (self.devices or {}).items()}


@dataclass(frozen=True)
class Calibration:
    """A calibration profile: per-device-type efficiency overrides (fitted from traces by
    `placer calibrate`, or written by hand) and, for a fitted one, how (`fit`). See the module
    docstring; `to_dict()` is its document."""

    default: Efficiency = field(default_factory=Efficiency)
    per_device: dict[str, Efficiency] = field(default_factory=dict)
    fit: FitReport | None = None
    # the document's own spelling of its overrides (`Overrides`); None for factors set in code,
    # whose `overrides` are the fields that differ from the defaults
    written: Overrides | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, overrides: Overrides, fit: FitReport | None = None) -> Calibration:
        """The profile with these overrides (KeyError naming an unknown factor)."""
        default, per_device = overrides.resolve()
        keys = overrides.keys if fit is None or "fit" in overrides.keys else (
            *overrides.keys, "fit")
        return cls(default, per_device, fit, replace(overrides, keys=keys))

    def for_device(self, dev: DeviceType) -> Efficiency:
        return self.per_device.get(dev.name, self.default)

    @property
    def is_default(self) -> bool:
        """The shipped factors and nothing else, not read from a profile: what a plan made
        without a profile records (its `calibration` is null)."""
        return (self.written is None and self.fit is None and not self.per_device
                and self.default == Efficiency())

    @property
    def overrides(self) -> Overrides:
        """The factors this profile sets: as its document wrote them, else (set in code) every
        factor that differs from the defaults, per device type from `default`."""
        if self.written is not None and self.written.resolve() == (self.default, self.per_device):
            return self.written
        base = Efficiency()
        return Overrides(_differing(self.default, base),
                         {name: _differing(e, self.default) for name, e in self.per_device.items()},
                         ("default", "devices") + (("fit",) if self.fit is not None else ()))

    def with_factor(self, device: str, name: str, value: float) -> Calibration:
        """The profile with one device type's factor set (added to its `devices` section)."""
        o = self.overrides
        devices = dict(o.devices or {})
        devices[device] = {**(devices.get(device) or {}), name: value}
        keys = o.keys if "devices" in o.keys else (*o.keys, "devices")
        return Calibration.of(Overrides(o.default, devices, keys), self.fit)

    def with_fit(self, fit: FitReport) -> Calibration:
        return Calibration.of(self.overrides, fit)

    def to_dict(self) -> dict[str, Any]:
        """The profile document (`placer.cost.calibration` reads it back to an equal profile)."""
        o = self.overrides
        values: dict[str, Any] = {
            "default": None if o.default is None else dict(o.default),
            "devices": None if o.devices is None else {
                k: None if v is None else dict(v) for k, v in o.devices.items()},
            "fit": None if self.fit is None else self.fit.to_dict()}
        keys = o.keys if self.fit is None or "fit" in o.keys else (*o.keys, "fit")
        return {k: values[k] for k in keys}


def _differing(e: Efficiency, base: Efficiency) -> dict[str, float]:
    return {f.name: getattr(e, f.name) for f in fields(e)
            if getattr(e, f.name) != getattr(base, f.name)}


# ------------------------------------------------------------------- the fit report
class _AsWritten(BaseModel):
    """A section of a profile's `fit` report: typed where `placer calibrate` writes it, other
    keys kept; written back with the keys it was given, in their order."""

    model_config = ConfigDict(frozen=True, extra="allow")
    _keys: tuple[str, ...] | None = PrivateAttr(default=None)

    @model_validator(mode="wrap")
    @classmethod
    def _remember_keys(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        made = handler(data)
        if isinstance(data, Mapping) and made is not data:
            made._keys = tuple(data)
        return made

    @model_serializer(mode="wrap")
    def _as_given(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        keys = self._keys if self._keys is not None else tuple(out)
        return {k: out[k] for k in keys if k in out}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = self.model_dump(mode="python")
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        return cls.model_validate(data)


class FactorReport(_AsWritten):
    """One factor on one device type: fitted (or measured), or why it kept its prior."""

    value: float
    prior: float
    events: int
    """events where its term is at least 1% of the time"""
    rel_rms: float | None
    """relative RMS of the residuals over those events (None: not fitted)"""
    rel_stderr: float | None
    """relative standard error from the least-squares covariance (None: not fitted)"""
    status: str  # "fitted", where a measured value came from, or "prior: <why it kept it>"


class GroupReport(_AsWritten):
    """One group of unknowns fitted together on one device type (`fit_events.GROUPS`)."""

    events: int
    rel_rms: float


class ToolLatencyReport(_AsWritten):
    """The tool calls' latency distribution fitted to the tool events."""

    distribution: dict[str, str | float]
    """a length distribution of the job format: lognormal (median, sigma) or fixed (value)"""
    events: int
    ks: float
    """Kolmogorov-Smirnov distance to the empirical distribution"""
    mean_measured_s: float
    mean_fitted_s: float


class StageReport(_AsWritten):
    """A stage-level factor (workflows/stagefit.py): the stage it was fitted on, its value and
    the stage's measured and simulated seconds after the fit."""

    stage: str
    value: float
    measured_s: float
    simulated_s: float


class FitReport(_AsWritten):
    """How `placer calibrate` fitted a profile: where from (the provenance keys), the events it
    used, each factor, each group, the tool latency, what it skipped and the stage factors."""

    trace: str | None = None
    plan: str | None = None
    trace_source: str | None = None
    method: str | None = None
    counts: dict[str, int] = {}
    """events used per "category@device type" (and "tool")"""
    factors: dict[str, dict[str, FactorReport]] = {}
    """device type -> factor -> its fit"""
    groups: dict[str, GroupReport] = {}
    """"device type/group" -> its fit"""
    tool_latency_s: ToolLatencyReport | None = None
    skipped: dict[str, int] = {}
    """why -> events not used"""
    stages: dict[str, StageReport] = {}
    """"device type.factor" -> the stage-level fit"""

    def with_stages(self, stages: Mapping[str, StageReport]) -> FitReport:
        """The report with its `stages` section (added last, or replaced where it is)."""
        doc = self.to_dict()
        doc["stages"] = {k: v.to_dict() for k, v in stages.items()}
        return FitReport.from_dict(doc)
