"""Efficiency factors: the achieved fractions of peak and the fixed overheads the cost model
(`placer.cost.model`) multiplies its first-principles work by.

Every factor is a named field with a default from a public source (cited beside it); a
calibration profile (`placer calibrate`, `placer.calibrate.fit`) overrides them per device type, and
`Calibration.for_device` picks the set a device type runs with. The formulas that use each factor
are in `placer.cost.model`'s docstring.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from placer.spec.hardware import DeviceType


@dataclass(frozen=True)
class Efficiency:
    """Achieved fractions of peak and fixed overheads. Defaults are public rules of thumb."""

    # Ceilings of the saturating GEMM efficiency (`gemm_eff`): what the matmuls of large
    # per-device batches reach before the pass's memory-bound kernels are added
    # (`device_ceiling`). With `nongemm_bytes_per_flop` two anchors fix both: 0.40 of peak on an
    # H100 (Llama 3's 38-43% BF16 MFU on H100s, Dubey et al. 2024, table 4; Megatron-LM's 52-56%
    # on 0.5-1T GPTs is the large-model upper end, Narayanan et al. 2021) and 0.75 on an H20
    # (published rows 1-9, verl's FSDP2 and Megatron updates on 12-128 H20s, once the driver's
    # dispatch, `dispatch_gbs`, is taken out: the H20 value that prices each row's update
    # exactly has a median of 0.80 over the ten H20 rows, 0.46 on the 30B-A3B MoE to > 0.9 on
    # the 7B FSDP2 rows; 0.75 leans toward the 0.55 the rows gave before the dispatch was
    # priced). An H20 has 37 FLOP per byte of HBM, so its GEMMs run near their ceiling.
    mfu_train: float = 0.86
    # An inference engine's forward passes (prefill; a frozen model served off the GPUs): 0.40,
    # set when the trainer's log-prob passes shared it (verl's old_log_prob on H20 measures
    # 0.51-0.54 of the 2N FLOPs once the driver's dispatch is taken out, rows 1-3 and 5; those
    # passes are `mfu_score`'s now); the rollout rows (tail-bound generation, rows 1-3 priced
    # 13-46% short) do not support more.
    mfu_prefill: float = 0.40
    # GEMM ceiling of a training framework's forward-only passes on a GPU (old log-probs,
    # reference, reward model, critic values: `costmodel.score_time`), taken through
    # `device_ceiling` like training's. verl runs them on the training module itself, not on an
    # engine: `compute_log_prob` / `compute_ref_log_prob` (verl/workers/fsdp_workers.py,
    # megatron_workers.py) call the actor's `_forward_micro_batch` (verl/workers/actor/
    # dp_actor.py: the remove-padding flash-attn varlen forward of `update_policy`, no
    # backward), in dynamic micro-batches of `log_prob_max_token_len_per_gpu`, which the DAPO
    # scripts set to 3 x (prompt + response), above training's 2 x (verl/experimental/
    # {fully_async,one_step_off}_policy/shell/dapo_7b_math_*.sh). Below `mfu_train`: no
    # backward to hide FSDP's gathers and the fp32 log-softmax and entropy over the vocabulary
    # (the actor's pass computes entropy, `calculate_entropy=True`; the reference's does not) --
    # ~10 vocabulary-sized fp32 passes, ~6 MB a token of a 152k vocabulary: < 1% of a 7B
    # forward on an H20, ~4% on an H100, so not priced apart. 0.60: the values that price the
    # published verl old_log_prob passes exactly once the dispatch is taken out (rows 1-3, 5,
    # 7-9: FSDP2 and Megatron, 12-128 H20) are 0.56-1.0, median 0.59 (the two 30B-A3B reference
    # passes would need > 1: the MoE forward is over-priced elsewhere, so they are left out):
    # 0.54 of an H20's peak, 0.33 of an H100's, 0.39 of an H200's (Miles' row-10 actor log-prob
    # pass on H200 prices at 0.48 with its stand-in model).
    mfu_score: float = 0.60
    # Memory traffic of training's non-GEMM kernels (norms, activations, rotary, residuals and
    # their backward, the recomputed forward, casts) per GEMM FLOP, in bytes/FLOP: they run at
    # HBM bandwidth, so a device with little compute per byte (an H20: 37 FLOP/byte; an H100:
    # 295) loses less of its peak to them (`device_ceiling`). Set so that one GEMM ceiling gives
    # both the H100 and the H20 figures of `mfu_train`: 1 / (1/0.86 + 0.0045 * 295.2) = 0.40,
    # 1 / (1/0.86 + 0.0045 * 37) = 0.75.
    nongemm_bytes_per_flop: float = 0.0045
    # Tokens per device at which a pass reaches half its ceiling, in units of the device's ridge
    # point peak/bandwidth (FLOP per byte): a [t x h] x [h x k] BF16 GEMM with t << h, k does
    # ~t FLOP per byte of weights read, so it is memory-bound below t ~ ridge (the roofline,
    # Williams et al. 2009): 295 tokens on an H100, 37 on an H20.
    gemm_half_ridge: float = 1.0
    decode_bw_eff: float = 0.70  # decode achieves ~70% of HBM bandwidth (vLLM/TRT-LLM measurements)
    # Bandwidth efficiency lost per doubling of TP: each rank's weight shard, hence each GEMV,
    # is smaller and ends sooner after its ramp. 0.12 reconciles vLLM's H200 latency anchors
    # (Llama-3.1-8B TP1 6.5 ms and Llama-3-70B TP4 16.2 ms per decode step at batch 8, vLLM
    # performance dashboard build 9515) with the same `decode_bw_eff`.
    decode_tp_bw_loss: float = 0.12
    # Batch size at which the per-step weight read is half as efficient as at large batch: a
    # batch of 1 runs GEMV kernels, which stream weights less efficiently than the skinny GEMMs
    # of a few sequences (vLLM and TRT-LLM batch-1 decoding reaches ~60-70% of HBM bandwidth
    # where batch >= 8 reaches ~70-80%). 0.15: batch 1 at 87% of the large-batch efficiency.
    decode_bw_half_batch: float = 0.15
    decode_flops_eff: float = 0.50
    # Bytes per element of a hybrid model's Gated DeltaNet recurrent state (`costmodel.
    # linear_state_bytes`; its convolution window stays BF16). 4: SGLang keeps it in float32 by
    # default (python/sglang/srt/configs/mamba_utils.py `mamba2_state_dtype`: temporal float32
    # unless SGLANG_MAMBA_SSM_DTYPE or the config's mamba_ssm_dtype says otherwise, conv
    # bfloat16; Qwen3.5's config.json sets mamba_ssm_dtype float32), which is Miles' 151 MB per
    # sequence of a 27B Qwen3.5-shape model (docs/models/qwen/qwen3-8.md). vLLM keeps the model
    # dtype (2) unless --mamba-ssm-cache-dtype float32 (vllm/model_executor/layers/mamba/
    # mamba_utils.py `MambaStateDtypeCalculator`, "auto").
    linear_state_bytes: float = 4.0
    # Routed experts in a decode step stream their weights through fused-MoE kernels (one small
    # GEMM per expert hit), which read less efficiently the narrower each rank's slice of an
    # expert is: `expert_read_eff` = w / (w + expert_read_half_width), w = expert_mlp /
    # expert_tp columns per rank. 341 reproduces SGLang's Qwen3-235B-A22B TP8 TPOT of 6.70 ms at
    # concurrency 1 on 8 B200 (w = 1536 / 8 = 192: 0.36; BenHamm's SGLang 0.5.8 benchmark gist,
    # published-runs decode table); vLLM's Mixtral-8x7B TP2 batch-8 step on H200 (w = 14336 / 2:
    # 0.95; 15.0 ms, buildkite build 9515) checks it: +14% (+9% with the factor at 1).
    expert_read_half_width: float = 341.0
    link_eff: float = 0.80  # achieved fraction of NVLink / NIC bandwidth in collectives
    # Collective latencies (`placer.cost.collectives`): NCCL's tuning model, src/graph/tuning.cc
    # (baseLat ring LL 6.6 us; hwLat LL 0.6 us per NVLink hop, 2.7 us per network hop).
    coll_base_s: float = 6.6e-6
    # Per-call latency of a whole-tensor gather (`DTensor.full_tensor`: the weight sync's and a
    # checkpoint's gathers, one per tensor; `layercomm.gather_link`) where it differs from a
    # collective's `coll_base_s`: gloo's latency is per ring step, so a plain all-gather costs
    # about half the all-reduce and FSDP calls that fit `coll_base_s`. 0: not measured, the
    # gather pays `coll_base_s` (NCCL's per-call launch dominates either way). The trainers'
    # timed probe measures it (executors/collprobe.py, kind `gather`).
    gather_call_s: float = 0.0
    # Per-call cost of a tensor-parallel layer's all-reduce as the training framework issues it
    # (`layercomm.tp_link`: DTensor's dispatch and redistribution around each call, on top of
    # the call) where it was measured; 0: a collective's `coll_base_s` (NCCL's launch dominates
    # on a GPU). The trainers' probe measures it (executors/collprobe.py, kind `tp_pair`).
    tp_call_s: float = 0.0
    # Per-call cost of an FSDP unit's gather or reduce-scatter with the framework's work around
    # it (copy-in, copy-out, hooks: `layercomm.zero3_gathers`) where it was measured; 0: a
    # collective's `coll_base_s`. The trainers' probe measures it (executors/collprobe.py, kind
    # `fsdp_unit`); on gloo it is steadier than a plain all-reduce, whose latency on a small
    # host swings 0.3-1.8 ms a call with the scheduling of its two processes.
    fsdp_call_s: float = 0.0
    nvlink_hop_s: float = 0.6e-6
    net_hop_s: float = 2.7e-6
    # Host overhead of one engine step: a fixed part (scheduler, CUDA-graph launch) plus a part
    # per running sequence (input preparation, sampling, detokenization). vLLM v0.6.0's
    # performance blog (2024-09) measured CPU work at up to ~1/3 of a Llama-3-8B H100 step at
    # large batch before its multi-step scheduling; 1.5 ms + 10 us per sequence gives ~4 ms at
    # batch 256 and matches the ~1.7 ms left of vLLM's 6.5 ms batch-8 H200 step after reading
    # the 8B weights.
    step_overhead_s: float = 0.0015
    step_overhead_per_seq_s: float = 1.0e-5
    # Host time per layer of a decode step run eagerly (no CUDA graphs: `Parallel.cuda_graphs`
    # False, vLLM's enforce_eager): every kernel launched from Python. 0.34 ms: Qwen2.5-Omni-7B's
    # thinker (a 28-layer Qwen2.5-7B) decodes at ~22.5 ms per token eager and ~13 ms with CUDA
    # graphs on 2 A800s (vllm-project/vllm-omni issue #7960, 2026-09): 9.5 ms / 28 layers.
    eager_layer_s: float = 3.4e-4
    train_overhead_s: float = 0.05  # per optimizer step (optimizer, launch, sync)
    # A checkpoint's fixed cost (`hostmem.checkpoint_time`) beyond gathering sharded state and
    # writing its bytes at `Cluster.storage_gbs`: the call into every trainer rank, creating,
    # syncing and renaming the file. No public figure separates it from the write, so the prior
    # is 0; an executed trace's `checkpoint` events fit it (`placer calibrate`).
    checkpoint_overhead_s: float = 0.0
    # Cores of the host behind an emulated device (`DeviceType.host_backed`, e.g. emu-gpu): its
    # ranks are processes on those cores, so a layout with more ranks than cores time-shares
    # them and every rank's compute and collectives stretch by ranks / cores
    # (`costmodel.oversubscription`). 0: unknown, no stretch. Not a prior: an executed trace's
    # metadata says it (`host_cores`, executors/run.py: the embedded cluster's cores), and
    # `placer calibrate` copies it into the profile of the trace's host-backed device types.
    host_cores: float = 0.0
    engine_mem_gb: float = 2.0  # CUDA context, activations and graphs of an inference engine
    kv_mem_fraction: float = 0.90  # share of device memory an engine may use (gpu_memory_util)
    # Engine admission (`placer.cost.batching.KvBudget`): a rollout engine admits a waiting sequence
    # while free KV covers its prompt and it runs fewer than `max_num_seqs` sequences; running
    # sequences take KV as they grow and the newest is preempted (recomputed later) when the KV
    # is full (vLLM v1 vllm/v1/core/sched/scheduler.py). 1024: verl's rollout default
    # (verl/trainer/config/rollout/rollout.yaml max_num_seqs), also vLLM's own default on GPUs of
    # >= 70 GiB other than A100 (vllm/engine/arg_utils.py get_batch_defaults; 256 below).
    # KV is allocated in pages of `kv_block_tokens` (vLLM CacheConfig.block_size, 16 on CUDA):
    # the capacity is counted in whole blocks.
    max_num_seqs: float = 1024  # a count (float: every factor overrides as a number)
    kv_block_tokens: float = 16
    # LPU batch-1 token time = lpu_step_s + chips * lpu_hop_s, solved from two public figures
    # with this model's chip counts: Llama-2-70B (660 chips) ~300 tok/s, Llama-2-7B (65) ~750.
    lpu_hop_s: float = 3.36e-6  # per chip a token passes through
    lpu_step_s: float = 1.11e-3  # per LPU decode step, whatever the chip count
    lpu_kv_reserve: float = 0.10  # SRAM share kept for KV beyond the weights
    lpu_reload_s: float = 5.0  # fixed cost to re-push weights onto LPU chips (assumption)
    offload_gbs: float = 25.0  # host<->device copy (PCIe Gen5 x16 ~ 50 GB/s, half achieved)
    # A colocated rollout engine sleeps after each generation and wakes before the next
    # (`costmodel.engine_swap_time`): verl's sharding managers call `sleep(level=1)` on exit and
    # `wake_up(tags=["weights"])`, the weight update, then `wake_up(tags=["kv_cache"])` on enter
    # when `free_cache_engine` is on, its default (verl v0.5.0 verl/workers/sharding_manager/
    # fsdp_vllm.py, megatron_vllm.py; rollout.yaml). vLLM's CuMemAllocator.sleep copies every
    # weight allocation to a freshly allocated pinned host tensor, unmaps and releases every
    # allocation (the KV pool is discarded, not copied), then runs gc.collect() and
    # empty_cache(); wake_up re-creates and maps the physical memory of every allocation (the KV
    # pool included) and copies the weights back (vllm/device_allocator/cumem.py). The weights'
    # bytes cross the host link at `offload_gbs`; what does not scale with them is a fixed cost
    # per call: 11.2 s to sleep and 3.7 s to wake, vime PR #445's Qwen3-0.6B on one GPU (sleep
    # 11.23 s, wake 3.77 s, of which its 1.2 GB of weights are 0.05 s each way; published row 12).
    engine_sleep_s: float = 11.2
    engine_wake_s: float = 3.7
    tool_overhead_s: float = 0.0  # fixed cost per tool call on top of its drawn latency
    sync_latency_s: float = 0.01  # per weight-sync transfer (setup, NCCL/RPC)
    # Weight refresh (`placer.cost.timing.sync_links`), raw GB/s that `link_eff` scales like every
    # link: one NCCL broadcast sender, bucketed, over the NIC -- 10.3 x 0.8 = 8.25 GB/s achieved,
    # verl's checkpoint-engine README (Qwen3-30B-A3B, FSDP -> 30 rollouts, 400 Gb/s CX-7 IB);
    # and one rollout replica loading the full weights from a co-located actor (CUDA IPC and the
    # engine's weight loader; every replica at once) -- 31 x 0.8 = 25 GB/s achieved: NeMo-RL's
    # DP8 -> TP8 Qwen3-4B refit, 8.0 GB in 0.21-0.34 s (24-38 GB/s), and Miles' 27B sync into
    # one-GPU SGLang engines, 53 GB in 2.5 s (21 GB/s; docs/models/qwen/qwen3-8.md).
    sync_sender_gbs: float = 10.3
    sync_local_gbs: float = 31.0
    # Calls of a refresh (`placer.cost.timing.sync_calls`): a stream of `sync_bucket_gb` buckets, or,
    # at 0, one call per tensor from one sender (verl's NCCL sync without checkpoint-engine).
    # Every call after the first (which `sync_latency_s` covers) costs `sync_call_s`: the
    # Python-side gather, NCCL launch and engine `load_weights` of one call. 0.25 ms fits verl's
    # fully_async.md NCCL rows (Qwen2.5-7B 4 -> 4 H20: 0.12 s for 339 tensors of 15 GB over
    # NVLink; 30B-A3B and 235B-A22B: 15.76 / 58.57 s for ~19k / ~37k tensors). 1 GB buckets:
    # Miles p2p-weight-transfer.md; checkpoint-engine and NeMo-RL also stream buckets.
    sync_call_s: float = 2.5e-4
    sync_bucket_gb: float = 1.0
    # Driver dispatch of every trainer / frozen forward pass (`costmodel.dispatch_time`): a
    # single-controller framework's driver ships the whole rollout batch, padded to the maximum
    # context, to the workers and collects their outputs before and after each pass; the
    # driver's serialization and the object store's transfer do not shrink with more GPUs.
    # verl: every `compute_log_prob`, `compute_ref_log_prob` and `update_actor` is registered
    # with a DP dispatch mode (verl/single_controller/base/decorator.py): the driver chunks the
    # `DataProto` per DP rank, `DataProto.__getstate__` consolidates and `torch.save`s each
    # chunk, `parallel_put` ray.puts it, each worker loads it; the outputs are concatenated on
    # the driver (verl/protocol.py). The bytes per padded token of context are the tensors such
    # a pass ships: input_ids, attention_mask, position_ids (int64, 24 B), responses and
    # response_mask (int64, 16 B), and ~4 fp32 per-token tensors (token-level scores, log-
    # probs, entropies or advantages, 16 B): 56. 0 switches the cost off (a framework whose
    # workers read their data themselves). The rate fits the fixed part of verl's published
    # passes, t = a + b / GPUs: old_log_prob 36 s (rows 1-3: 8,192 samples x 30,720 padded
    # tokens = 14.1 GB, 0.39 GB/s) and ref 11 s (rows 5-6: 8,192 x 10,240 = 4.7 GB, 0.43 GB/s).
    dispatch_bytes_per_token: float = 56.0
    dispatch_gbs: float = 0.4
    train_mem_gb: float = 1.0  # per training device: CUDA context, allocator fragmentation
    # Rule rewards, by kind (`placer.cost.rulecheck`): an in-process check of one sample (a math
    # answer's equivalence, sympy; a number compared) -- `rule_reward_s` (assumption) -- or
    # answers run as code in a sandbox, which pays `sandbox_batch_s` per sandbox started (a new
    # interpreter in fresh namespaces: bubblewrap or unshare, seccomp, the runner's imports;
    # executors/sandbox.py, executors/_sandbox_runner.py) and `sandbox_sample_s` per answer
    # run in it (a forked child each). 50 ms: CPython's own start-up is ~10-20 ms
    # (docs.python.org/3.11/whatsnew/3.11.html, "Faster Startup"), the runner's imports and
    # namespace set-up several times that; 2 ms: a fork of a small interpreter and one
    # expression. All three are fitted per device type from executed runs (`placer.calibrate.fit_rule`).
    rule_reward_s: float = 0.005  # CPU seconds to verify one sample with a rule (assumption)
    sandbox_batch_s: float = 0.05
    sandbox_sample_s: float = 0.002

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
