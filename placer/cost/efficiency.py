"""Efficiency factors: the achieved fractions of peak and the fixed overheads the cost model
multiplies its first-principles work by.

Every factor is a named field with a default from a public source; docs/cost-model.md lists each
with its value, unit, source and how `placer calibrate` refits it (tests/test_cost_model_doc.py
keeps that table and these fields in step). A calibration profile (`placer.cost.calibration`)
overrides them per device type, and `Calibration.for_device` picks the set a device type runs
with.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from placer.spec.hardware import DeviceType


@dataclass(frozen=True)
class Efficiency:
    """Achieved fractions of peak and fixed overheads (docs/cost-model.md: sources)."""

    mfu_train: float = 0.86  # GEMM ceiling of training passes, before memory-bound kernels (`device_ceiling`)
    mfu_prefill: float = 0.40  # GEMM ceiling of an inference engine's forward (prefill, frozen model off-GPU)
    mfu_score: float = 0.60  # GEMM ceiling of a training framework's forward-only passes on a GPU
    nongemm_bytes_per_flop: float = 0.0045  # HBM bytes of training's non-GEMM kernels per GEMM FLOP
    gemm_half_ridge: float = 1.0  # tokens per device at half the ceiling, in ridge points (peak / bandwidth)
    decode_bw_eff: float = 0.70  # achieved fraction of HBM bandwidth of a large-batch decode step
    decode_tp_bw_loss: float = 0.12  # decode bandwidth efficiency lost per doubling of TP
    decode_bw_half_batch: float = 0.15  # batch at which a decode step's weight read is half as efficient
    decode_flops_eff: float = 0.50  # achieved fraction of peak of a compute-bound decode step
    linear_state_bytes: float = 4.0  # bytes per element of a hybrid model's Gated DeltaNet recurrent state
    # expert columns per rank at which fused-MoE reads are half as efficient
    expert_read_half_width: float = 341.0
    link_eff: float = 0.80  # achieved fraction of NVLink / NIC bandwidth in collectives and transfers
    coll_base_s: float = 6.6e-6  # launch latency of one collective call
    gather_call_s: float = 0.0  # per-call cost of a whole-tensor gather where probed (0: `coll_base_s`)
    tp_call_s: float = 0.0  # per-call cost of a TP layer's all-reduce where probed (0: `coll_base_s`)
    # per-call cost of an FSDP unit's gather or reduce-scatter where probed (0: `coll_base_s`)
    fsdp_call_s: float = 0.0
    nvlink_hop_s: float = 0.6e-6  # per-hop latency of a collective over NVLink
    net_hop_s: float = 2.7e-6  # per-hop latency of a collective over the network
    step_overhead_s: float = 0.0015  # fixed host time of one engine step
    step_overhead_per_seq_s: float = 1.0e-5  # host time per running sequence of one engine step
    eager_layer_s: float = 3.4e-4  # host time per layer of a decode step without CUDA graphs
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
    engine_sleep_s: float = 11.2  # a colocated engine's fixed sleep cost beyond copying its weights out
    engine_wake_s: float = 3.7  # its fixed wake cost beyond copying them back
    tool_overhead_s: float = 0.0  # fixed cost per tool call on top of its drawn latency
    sync_latency_s: float = 0.01  # per weight-sync transfer (setup, NCCL/RPC)
    sync_sender_gbs: float = 10.3  # raw GB/s of one weight-refresh sender over the NIC
    sync_local_gbs: float = 31.0  # raw GB/s of one replica loading weights from a co-located actor
    sync_call_s: float = 2.5e-4  # each call of a refresh after the first
    sync_bucket_gb: float = 1.0  # bucket of a streamed refresh (0: one call per tensor, one sender)
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


@dataclass(frozen=True)
class Calibration:
    """Per-device-type efficiency overrides (fitted from traces by `placer calibrate`)."""

    default: Efficiency = field(default_factory=Efficiency)
    per_device: dict[str, Efficiency] = field(default_factory=dict)

    def for_device(self, dev: DeviceType) -> Efficiency:
        return self.per_device.get(dev.name, self.default)
