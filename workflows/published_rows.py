"""The published runs the cost model is checked against, as data: every step-time row (`ROWS`,
each a job file under examples/published/ plus the layout the run used, `Use`), every weight-sync
row (`SYNC_ROWS`) and every decode-step anchor (`DECODE_ROWS`), each with its source. How they
are priced and reported is `workflows.published`; the multi-node serving anchors are
`workflows.serving`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from placer.base.roles import Role
from placer.cost.efficiency import Efficiency
from placer.cost.offload import STREAM_SCHEMES
from placer.cost.sharding import Parallel
from placer.spec.arch import ModelArch
from placer.spec.framework import PROFILES, FrameworkName
from placer.spec.weightsync import TransportKind


@dataclass(frozen=True)
class Use:
    """The published layout of one role: its pool and parallel configuration."""

    pool: str
    tp: int = 1
    pp: int = 1
    dp: int = 1
    zero: int = 3
    offload: bool = False
    cp: int = 1
    ep: int = 1
    cuda_graphs: bool = True  # rollout engines: False where the run set vLLM's enforce_eager
    shard: int = 0  # trainer: HSDP shard group, the script's fsdp_config.fsdp_size (0: none)
    # verl's / EasyR1's parking between phases (`placer.cost.offload`): `param_offload` (the
    # weights, loaded for every phase that runs the module) and `optimizer_offload` (the
    # optimizer state, loaded for the update); `offload` is a host-stepped optimizer (Megatron's
    # optimizer_cpu_offload), whose state never comes back to the GPU
    park_params: bool = False
    park_optimizer: bool = False
    # a frozen model FSDP-sharded over its dp ranks (`Parallel.sharded_weights`), its forward
    # micro-batches' token budget (`Parallel.micro_token_budget`) and its weights streamed from
    # the host per micro-batch (`Parallel.stream_params_bytes`, `placer.cost.offload`)
    sharded: bool = False
    micro_token_budget: int = 0
    stream_params_bytes: float = 0.0
    # the recipe's uneven pipeline split (`Parallel.first_stage_layers` / `last_stage_layers`,
    # Megatron's num_layers_in_first/last_pipeline_stage; 0: even)
    first_layers: int = 0
    last_layers: int = 0
    # a trainer's activation recomputation (`Parallel.recompute`: a recomputed forward of every
    # layer in the backward, `placer.cost.model.train_flops`), as the run's script sets it:
    # verl's FSDP workers checkpoint each decoder layer (`enable_gradient_checkpointing`, true by
    # default); Megatron recomputes only where `recompute_granularity` is set (`_NO_RECOMPUTE`)
    recompute: bool = True
    # a trainer's fixed micro-batch, sequences a device (verl's ppo_micro_batch_size_per_gpu,
    # where its script runs without use_dynamic_bsz; `Parallel.micro_batch`); 0: token budgets
    micro_batch: int = 0

    def parallel(self) -> Parallel:
        return Parallel(tp=self.tp, pp=self.pp, dp=self.dp, zero=self.zero,
                        recompute=self.recompute, offload=self.offload,
                        cp=self.cp, ep=self.ep, cuda_graphs=self.cuda_graphs, shard=self.shard,
                        park_params=self.park_params, park_optimizer=self.park_optimizer,
                        sharded_weights=self.sharded, micro_token_budget=self.micro_token_budget,
                        stream_params_bytes=self.stream_params_bytes,
                        first_stage_layers=self.first_layers, last_stage_layers=self.last_layers,
                        micro_batch=self.micro_batch)


@dataclass(frozen=True)
class Row:
    """One step-time row of the published-runs table."""

    name: str
    file: str
    source: str
    published_s: float
    stages: dict[str, float]
    layout: dict[Role, Use]
    groups: tuple[tuple[Role, ...], ...]  # roles sharing devices (one slot each group)
    # False where the framework takes the old log-probs from the rollout engine instead of a
    # trainer forward pass: verl's fully_async_policy does by default ("we default to
    # old_log_prob being calculated by rollout rather than by trainer", fully_async.md;
    # its tables show no old_log_prob stage), so the actor's `score` stage is not run.
    trainer_log_probs: bool = True
    # Not empty where the published times are the run's first step, one-time costs included (the
    # evidence, printed beside the row): such a row measures another quantity than a
    # steady-state step, so it is reported in its own category (`first_step` in the report),
    # outside the step rows' median and max and outside the planner's error band.
    first_step: str = ""
    # Of a first-step row: the stages that hold a first call (kernels compiled and autotuned,
    # communicators built), which no factor is fitted on; its other stages run after them and
    # are data as any row's are.
    first_call_stages: tuple[str, ...] = ()


@dataclass(frozen=True)
class SyncRow:
    """One weight-sync row: actor and rollout placements on a pool of `device` nodes."""

    name: str
    source: str
    model: str
    device: str
    nodes: int
    actor: Use
    rollout: Use
    published_s: float
    colocated: bool = False
    # The transport's bucket size, GB (`Efficiency.sync_bucket_gb`): a framework setting; 0 for
    # verl's NCCL sync without checkpoint-engine, which broadcasts tensor by tensor from rank 0.
    bucket_gb: float = Efficiency().sync_bucket_gb
    # The framework the row ran under: its profile's factors (`placer.spec.framework`; Miles'
    # broadcast sender rate) replace the shared ones, which the other rows determine.
    framework: FrameworkName = "verl"
    # The job's `weight_sync` section (`placer.spec.weightsync`): the refit's transport and, for
    # a paired one, whether an engine rank receives only its own slice.
    transport: TransportKind = "broadcast"
    shard_experts: bool = True
    # GPUs a node of the row's cluster holds (a GH200 node has 4), and a device type outside
    # the shipped catalog (the job's `catalog.devices` entry; then `device` names it)
    devices_per_node: int = 8
    device_type: dict[str, Any] | None = None


# The Megatron trainers that run without activation recomputation (`Use.recompute`): verl's
# Megatron worker recomputes only what its transformer config sets, and neither of its
# published runs sets it. At @503ea75f5 (rows r09a, r09b) `enable_gradient_checkpointing=True`
# reads `gradient_checkpointing_kwargs`, whose keys ppo_megatron_trainer.yaml sets to null, so
# `recompute_granularity` = None (verl/single_controller/base/megatron/worker.py:95-102); at
# @c711dd741 (rows r05, r06) engine/megatron.yaml's `override_transformer_config` has
# `recompute_granularity: null` and grpo_30b_a3b_base_math_megatron_96_32.sh overrides none of
# it. NeMo-RL (NVIDIA-NeMo/RL v0.6.0 @5fb58893) sets full recomputation only where
# `megatron_cfg.activation_checkpointing` is true (nemo_rl/models/megatron/setup.py:470-473):
# grpo_math_1B.yaml says false and the 30B-A3B recipes (rows r15, r19) keep it; the 235B and
# DeepSeek-V3 recipes set it true, as Miles' and verl's DeepSeek-V3 scripts set full
# recomputation (rows r10, r11) and verl's FSDP and EasyR1's workers checkpoint every layer.
_NO_RECOMPUTE = False
_UNBUCKETED = 0.0
_CPU = Use("cpu")
_R = Role
_COLOC = ((_R.ACTOR, _R.ROLLOUT), (_R.REWARD,))
_COLOC_REF = ((_R.ACTOR, _R.ROLLOUT, _R.REFERENCE), (_R.REWARD,))
_SPLIT = ((_R.ACTOR,), (_R.ROLLOUT,), (_R.REWARD,))
_SPLIT_REF = ((_R.ACTOR, _R.REFERENCE), (_R.ROLLOUT,), (_R.REWARD,))
_FA = "verl docs/advance/fully_async.md"
_OSO = "verl docs/advance/one_step_off.md"
# EasyR1's reference (hiyouga/EasyR1 @b44b311b, v0.3.2, examples/config.yaml, which the rows'
# scripts examples/qwen2_5_vl_{7b,32b}_geo3k_grpo.sh leave as is): FSDP full shard over the 8
# GPUs (`ref.fsdp.enable_full_shard`), its BF16 weights on the host and streamed per forward
# micro-batch (`ref.fsdp.enable_cpu_offload: true`; `placer.cost.offload.STREAM_SCHEMES`). Its
# micro-batches, and the actor's, are the easyr1 profile's (`FrameworkProfile.micro_batch_samples`;
# EasyR1's `dynamic_batching: true`: `micro_batch_size_per_device_for_experience` 2, copied to the
# reference by verl/workers/config.py:50, x the padded length 2,048 + 2,048 = 8,192 tokens a
# forward micro-batch, verl/workers/actor/dp_actor.py:198; `_for_update` 1 x 4,096 = 4,096 a
# training one, dp_actor.py:241-242; neither script changes them)
_EASYR1_REF = Use("h100", dp=8, sharded=True, stream_params_bytes=STREAM_SCHEMES[
    PROFILES["easyr1"].stream_scheme].bytes_per_param)

# Why row r10's times are taken as its run's step 0 (radixark/miles @31f1ca96; the row's job
# file has the lines): the doc's timing table ("4.2 What one step costs") names no step, and the
# one step its section names is step 0 ("Step 0 reported `rollout/raw_reward` 0.64 ..."). Inside
# its `train` timer the reference pass (100 s) is the same `forward_only` over the same
# micro-batches as the actor pass right after it (33 s), and at step 0 it is the trainer's first
# forward (train.py: before it, only the initial weight update and SGLang's eval run). The GDN
# layers run flash-linear-attention's Triton kernels (miles_plugins/models/qwen_gdn_backend.py;
# `--linear-attention-backend` is fla by default), each compiled and autotuned on its first call
# (fla-org/flash-linear-attention @bc3b101d: fla/ops/common/chunk_scaled_dot_kkt.py tries 27
# configs, fla/ops/utils/solve_tril.py 16 per kernel, keyed on head shapes and not on length, so
# tuned once per process); the backward's kernels are tuned in the first update.
_R10_STEP0 = ("step 0, warm-up included: the one step Miles' doc names is step 0, and its "
              "reference pass (the trainer's first forward) takes 100 s where the same pass "
              "right after takes 33 s: the GDN layers' Triton kernels are compiled and "
              "autotuned on their first call")

_NEMO_PERF = ("NeMo-RL docs/about/performance-summary.md "
              "@7ea279abfbeb698b092856d0dab61e7cf39bc909 (NeMo RL v0.6; recipes @v0.6.0)")

# Rows 1-3's trainer as their runs' scripts set it: the sync colocated runs of fully_async.md's
# 7B table, experiment names dapo_qwen2-7B-math_28k_fsdp2_colocate_{32,64,128}_mbs32 (the
# author's exp/ scripts in volcengine/verl's history: exp/qwen2-7B-math_32/fsdp2_colocate_64/
# dapo_7b_math_fsdp2_colocate.sh @9199f567, exp/qwen2-7B-math_64/fsdp2_colocate/run.sh
# @9280c114, exp/qwen2-7B-math_128/fsdp2_colocate/dapo_7b_math_fsdp2_colocate.sh @7f837ac3)
# set fsdp_size=2 (HSDP shard groups of 2) and offload=True (the actor's param_offload and
# optimizer_offload: parked between phases, `placer.cost.offload`), as r07's script does.


def _dapo7b_sync_actor(devices: int) -> Use:
    return Use("h20", dp=devices, shard=2, park_params=True, park_optimizer=True)


ROWS: list[Row] = [
    Row("r01 DAPO 7B 32xH20 colocate", "r01-dapo7b-32xh20-colocate.yaml", _FA, 790.10,
        # update_actor as the doc first published it (@b25bb7d4f); the row's header: why not 269.80
        {"rollout": 357.41, "old_log_prob": 107.71, "update": 313.81},
        {_R.ACTOR: _dapo7b_sync_actor(32), _R.ROLLOUT: Use("h20", tp=4, dp=8), _R.REWARD: _CPU},
        _COLOC),
    Row("r02 DAPO 7B 64xH20 colocate", "r02-dapo7b-64xh20-colocate.yaml", _FA, 365.28,
        {"rollout": 150.72, "old_log_prob": 70.26, "update": 133.41},
        {_R.ACTOR: _dapo7b_sync_actor(64), _R.ROLLOUT: Use("h20", tp=4, dp=16), _R.REWARD: _CPU},
        _COLOC),
    Row("r03 DAPO 7B 128xH20 colocate", "r03-dapo7b-128xh20-colocate.yaml", _FA, 356.30,
        {"rollout": 177.85, "old_log_prob": 53.92, "update": 113.81},
        {_R.ACTOR: _dapo7b_sync_actor(128), _R.ROLLOUT: Use("h20", tp=4, dp=32), _R.REWARD: _CPU},
        _COLOC),
    Row("r04 DAPO 7B 128xH20 async 64:64", "r04-dapo7b-128xh20-async.yaml", _FA, 150.63,
        {"update": 113.16},
        {_R.ACTOR: Use("h20", dp=64, shard=8), _R.ROLLOUT: Use("h20", tp=4, dp=16), _R.REWARD: _CPU},
        _SPLIT, trainer_log_probs=False),
    Row("r05 GRPO 30B-A3B 128xH20 colocate", "r05-grpo30ba3b-128xh20-colocate.yaml", _FA, 497.89,
        {"rollout": 348.05, "old_log_prob": 28.73, "ref": 20.86, "update": 86.27},
        {_R.ACTOR: Use("h20", tp=2, dp=32, zero=1, offload=True, cp=2, ep=8, park_params=True,
                       recompute=_NO_RECOMPUTE),
         _R.ROLLOUT: Use("h20", tp=4, dp=32, cuda_graphs=False),
         _R.REFERENCE: Use("h20", tp=2, dp=32, cp=2, ep=8, park_params=True), _R.REWARD: _CPU},
        _COLOC_REF),
    Row("r06 GRPO 30B-A3B 128xH20 async 96:32", "r06-grpo30ba3b-128xh20-async.yaml", _FA, 282.75,
        {"ref": 50.05, "update": 206.63},
        {_R.ACTOR: Use("h20", tp=2, dp=8, zero=1, offload=True, cp=2, ep=8, park_params=True,
                       recompute=_NO_RECOMPUTE),
         _R.ROLLOUT: Use("h20", tp=4, dp=24, cuda_graphs=False),
         _R.REFERENCE: Use("h20", tp=2, dp=8, cp=2, ep=8, park_params=True), _R.REWARD: _CPU},
        _SPLIT_REF, trainer_log_probs=False),
    Row("r07 DAPO 7B 16xH20 colocate", "r07-dapo7b-16xh20-colocate.yaml", _OSO, 749.0,
        {"rollout": 247.0, "old_log_prob": 88.0, "update": 286.0},  # rollout: generate_sequences
        {_R.ACTOR: Use("h20", dp=16, shard=2, park_params=True, park_optimizer=True),
         _R.ROLLOUT: Use("h20", tp=2, dp=8),
         _R.REWARD: _CPU},
        _COLOC),
    Row("r08 DAPO 7B 16xH20 one-step-off 4+12", "r08-dapo7b-16xh20-one-step-off.yaml", _OSO, 520.0,
        {"rollout": 458.0, "old_log_prob": 108.0, "update": 337.0},
        {_R.ACTOR: Use("h20", dp=12, shard=2), _R.ROLLOUT: Use("h20", tp=2, dp=2), _R.REWARD: _CPU},
        _SPLIT),
    # r09a, r09b: the trainer as the scripts set it, TP 2 x PP 2 with fixed micro-batches of 2
    # sequences (no dynamic batching in verl's Megatron worker then; the job files' headers cite
    # the lines of dapo_7b_math_megatron_{colocate,4_12}.sh @503ea75f5)
    Row("r09a DAPO 7B Megatron 16xH20 colocate", "r09a-dapo7b-16xh20-megatron-colocate.yaml", _OSO,
        699.0, {"rollout": 162.0, "old_log_prob": 119.0, "update": 344.0},  # (generate_sequences)
        {_R.ACTOR: Use("h20", tp=2, pp=2, dp=4, zero=1, park_params=True, park_optimizer=True,
                       recompute=_NO_RECOMPUTE, micro_batch=2),
         _R.ROLLOUT: Use("h20", tp=2, dp=8),
         _R.REWARD: _CPU},
        _COLOC),
    Row("r09b DAPO 7B Megatron 16xH20 one-step-off", "r09b-dapo7b-16xh20-megatron-one-step-off.yaml",
        _OSO, 566.0, {"rollout": 501.0, "old_log_prob": 120.0, "update": 347.0},
        {_R.ACTOR: Use("h20", tp=2, pp=2, dp=3, zero=1, recompute=_NO_RECOMPUTE, micro_batch=2),
         _R.ROLLOUT: Use("h20", tp=2, dp=2),
         _R.REWARD: _CPU},
        _SPLIT),
    Row("r10 GRPO 27B 8xH200 colocate", "r10-grpo27b-8xh200-colocate.yaml",
        "Miles docs/models/qwen/qwen3-8.md @31f1ca96", 720.0,
        {"rollout": 307.0, "old_log_prob": 33.0, "ref": 100.0, "update": 282.0, "sync": 2.5},
        {_R.ACTOR: Use("h200", tp=4, dp=2, zero=1, offload=True),
         # one SGLang engine per GPU (`--rollout-num-gpus-per-engine 1`, the doc's sec. 5.3)
         _R.ROLLOUT: Use("h200", dp=8), _R.REFERENCE: Use("h200", tp=4, dp=2),
         _R.REWARD: _CPU},
        _COLOC_REF, first_step=_R10_STEP0, first_call_stages=("ref", "update")),
    Row("r11 GRPO 671B DeepSeek-V3 96xH20 colocate", "r11-grpo671b-96xh20-colocate.yaml",
        "verl docs/perf/dpsk.md", 1700.0, {"rollout": 1050.0},
        # LAST_LAYER=6: num_layers_in_last_pipeline_stage 6 of 61 on both (the script sets it on
        # the actor's transformer config, which verl's reference worker builds from too)
        {_R.ACTOR: Use("h20", tp=8, pp=12, dp=1, zero=1, offload=True, ep=8, park_params=True,
                       last_layers=6),
         _R.ROLLOUT: Use("h20", tp=32, dp=3, cuda_graphs=False),
         _R.REFERENCE: Use("h20", tp=8, pp=12, dp=1, ep=8, park_params=True, last_layers=6),
         _R.REWARD: _CPU},
        _COLOC_REF),
    Row("r13 GRPO Qwen2.5-VL-7B 8xH100 colocate", "r13-grpo-vl7b-8xh100-colocate.yaml",
        "EasyR1 assets/baselines.md (b44b311b, v0.3.2)", 145.0, {},
        # FSDP full shard with the actor's params and optimizer parked (EasyR1's offload_params,
        # offload_optimizer: the same copies as verl's FSDP worker); vLLM TP2 x 4
        {_R.ACTOR: Use("h100", dp=8, park_params=True, park_optimizer=True),
         _R.ROLLOUT: Use("h100", tp=2, dp=4),
         _R.REFERENCE: _EASYR1_REF, _R.REWARD: _CPU},
        _COLOC_REF),
    Row("r14 GRPO Qwen2.5-VL-32B 8xH100 colocate", "r14-grpo-vl32b-8xh100-colocate.yaml",
        "EasyR1 assets/baselines.md (b44b311b, v0.3.2)", 530.0, {},
        {_R.ACTOR: Use("h100", dp=8, park_params=True, park_optimizer=True),
         _R.ROLLOUT: Use("h100", tp=8),
         _R.REFERENCE: _EASYR1_REF, _R.REWARD: _CPU},
        _COLOC_REF),
    # NeMo-RL's published performance runs (_NEMO_PERF), held out: no stage times, so no factor
    # is fitted on them; each job file has the recipe's settings and the assumptions. Megatron
    # with the distributed optimizer (ZeRO-1); the reference's log-probs from the same workers.
    # The pipelined rows' uneven splits (first_layers / last_layers) are the recipes'
    # num_layers_in_first/last_pipeline_stage (NVIDIA-NeMo/RL v0.6.0 @5fb58893
    # examples/configs/recipes/llm/performance: grpo-qwen3-235b-16n8g 11/11 (32n8g inherits
    # it), -16n4g 23/23 (32n4g inherits it), grpo-deepseek-v3-32n8g 3/2 (64n8g-async-1off and
    # its FP8 variant inherit it), -32n4g 7/6).
    Row("r15 GRPO 30B-A3B 32xH100 NeMo-RL colocate", "r15-grpo30ba3b-32xh100-nemorl-colocate.yaml",
        _NEMO_PERF, 192.0, {},
        {_R.ACTOR: Use("h100", dp=32, zero=1, ep=8, recompute=_NO_RECOMPUTE),
         _R.ROLLOUT: Use("h100", tp=2, dp=16),
         _R.REFERENCE: Use("h100", dp=32, ep=8), _R.REWARD: _CPU},
        _COLOC_REF),
    Row("r16 GRPO 235B-A22B 128xH100 NeMo-RL colocate", "r16-grpo235b-128xh100-nemorl-colocate.yaml",
        _NEMO_PERF, 395.0, {},
        {_R.ACTOR: Use("h100", tp=2, pp=8, dp=4, zero=1, cp=2, ep=16,
                       first_layers=11, last_layers=11),
         _R.ROLLOUT: Use("h100", tp=16, dp=8),
         _R.REFERENCE: Use("h100", tp=2, pp=8, dp=4, cp=2, ep=16,
                           first_layers=11, last_layers=11), _R.REWARD: _CPU},
        _COLOC_REF),
    Row("r17 GRPO 671B DeepSeek-V3 256xH100 NeMo-RL colocate",
        "r17-grpo671b-256xh100-nemorl-colocate.yaml", _NEMO_PERF, 134.0, {},
        {_R.ACTOR: Use("h100", pp=16, dp=16, zero=1, ep=16, first_layers=3, last_layers=2),
         _R.ROLLOUT: Use("h100", tp=32, dp=8),
         _R.REFERENCE: Use("h100", pp=16, dp=16, ep=16,
                           first_layers=3, last_layers=2), _R.REWARD: _CPU},
        _COLOC_REF),
    Row("r18 GRPO 671B DeepSeek-V3 FP8 512xH100 NeMo-RL 1-off",
        "r18-grpo671b-512xh100-nemorl-fp8-one-step-off.yaml", _NEMO_PERF + " (H100 FP8)", 59.2,
        {},
        {_R.ACTOR: Use("h100", pp=16, dp=16, zero=1, ep=16, first_layers=3, last_layers=2),
         _R.ROLLOUT: Use("h100", tp=16, dp=16),
         _R.REFERENCE: Use("h100", pp=16, dp=16, ep=16,
                           first_layers=3, last_layers=2), _R.REWARD: _CPU},
        _SPLIT_REF),
    # the same table's GB200-NVL72 runs (the device declared by each job file, from NVIDIA's
    # datasheet: GB200 is not in the shipped catalog); 4 GPUs a node, the rack's NVLink domain
    Row("r19 GRPO 30B-A3B 16xGB200 NeMo-RL colocate",
        "r19-grpo30ba3b-16xgb200-nemorl-colocate.yaml", _NEMO_PERF + " (GB200)", 221.0, {},
        {_R.ACTOR: Use("gb200", dp=16, zero=1, ep=16, recompute=_NO_RECOMPUTE),
         _R.ROLLOUT: Use("gb200", dp=16),
         _R.REFERENCE: Use("gb200", dp=16, ep=16), _R.REWARD: _CPU},
        _COLOC_REF),
    Row("r20 GRPO 235B-A22B 64xGB200 NeMo-RL colocate",
        "r20-grpo235b-64xgb200-nemorl-colocate.yaml", _NEMO_PERF + " (GB200)", 286.0, {},
        {_R.ACTOR: Use("gb200", tp=2, pp=4, dp=4, zero=1, cp=2, ep=16,
                       first_layers=23, last_layers=23),
         _R.ROLLOUT: Use("gb200", tp=8, dp=8),
         _R.REFERENCE: Use("gb200", tp=2, pp=4, dp=4, cp=2, ep=16,
                           first_layers=23, last_layers=23), _R.REWARD: _CPU},
        _COLOC_REF),
    Row("r21 GRPO 671B DeepSeek-V3 128xGB200 NeMo-RL colocate",
        "r21-grpo671b-128xgb200-nemorl-colocate.yaml", _NEMO_PERF + " (GB200)", 108.0, {},
        {_R.ACTOR: Use("gb200", pp=8, dp=16, zero=1, ep=16, first_layers=7, last_layers=6),
         _R.ROLLOUT: Use("gb200", tp=32, dp=4),
         _R.REFERENCE: Use("gb200", pp=8, dp=16, ep=16,
                           first_layers=7, last_layers=6), _R.REWARD: _CPU},
        _COLOC_REF),
    # the same 235B-A22B layouts at twice the GPUs (the table's other on-policy rows; its
    # DeepSeek-V3 rows at 512 H100 and 256 GB200 are left out: the table gives EP 16, the
    # v0.6.0 recipes EP 32)
    Row("r22 GRPO 235B-A22B 256xH100 NeMo-RL colocate", "r22-grpo235b-256xh100-nemorl-colocate.yaml",
        _NEMO_PERF, 312.0, {},
        {_R.ACTOR: Use("h100", tp=2, pp=8, dp=8, zero=1, cp=2, ep=16,
                       first_layers=11, last_layers=11),
         _R.ROLLOUT: Use("h100", tp=16, dp=16),
         _R.REFERENCE: Use("h100", tp=2, pp=8, dp=8, cp=2, ep=16,
                           first_layers=11, last_layers=11), _R.REWARD: _CPU},
        _COLOC_REF),
    Row("r23 GRPO 235B-A22B 128xGB200 NeMo-RL colocate",
        "r23-grpo235b-128xgb200-nemorl-colocate.yaml", _NEMO_PERF + " (GB200)", 345.0, {},
        {_R.ACTOR: Use("gb200", tp=2, pp=4, dp=8, zero=1, cp=2, ep=16,
                       first_layers=23, last_layers=23),
         _R.ROLLOUT: Use("gb200", tp=8, dp=16),
         _R.REFERENCE: Use("gb200", tp=2, pp=4, dp=8, cp=2, ep=16,
                           first_layers=23, last_layers=23), _R.REWARD: _CPU},
        _COLOC_REF),
]
# Row 12 (vime PR #445, Qwen3-0.6B on one GPU, colocated, offload on: sleep 11.23 s, wake 3.77 s)
# is not a row: its sleep and wake set the fixed costs of a colocated engine's swap
# (`Efficiency.engine_sleep_s`, `engine_wake_s`, `timing.onload_time`), so a row of it would
# check nothing, and its batch, lengths, GPU and rollout time are unpublished.

_FAS = "verl docs/advance/fully_async.md (NCCL, no checkpoint-engine)"
_MILES = "Miles docs/advanced/p2p-weight-transfer.md (NCCL broadcast, 1 GB buckets)"
# Miles' rows are priced with the miles profile, whose broadcast sender rate
# (`placer.spec.framework.MILES_SENDER_GBS`) comes from the same doc's GLM-4.7-Flash row: a row
# not priced here, so the two Miles rows below check it.
_NEMO_REFIT = ("NeMo-RL docs/guides/checkpoint-engine-refit.md "
               "@aa8bfb2e8b606f9ad5add01b52635edf9ab620f8 (DeepSeek-V3 Benchmark)")
_NEMO_BUCKET_GB = 4096 * 2**20 / 1e9
_NEMO_REFIT_ROWS: tuple[tuple[str, TransportKind, bool, float], ...] = (
    ("NeMo-RL DSV3 NIXL sharded 256->32 H100", "nixl", True, 9.25),
    ("NeMo-RL DSV3 NCCL sharded 256->32 H100", "nccl-p2p", True, 14.21),
    ("NeMo-RL DSV3 NIXL sharded, sync 256->32", "nixl", True, 10.923),
    ("NeMo-RL DSV3 NIXL full-expert, sync 256->32", "nixl", False, 36.812),
)
_RESHARD = ("NeMo-RL docs/design-docs/nccl-reshard-refit.md "
            "@7ea279abfbeb698b092856d0dab61e7cf39bc909 (Expected Performance, H100 BF16)")
_RESHARD_BUCKET_GB = 0.02 * 80 * 2**30 / 1e9
_RESHARD_ROWS: tuple[tuple[str, str, int, Use, Use, float, float], ...] = (
    ("NeMo-RL 4B DP8->TP8 H100 nccl-reshard", "Qwen3-4B", 2, Use("g", dp=8), Use("g", tp=8),
     0.21, 0.34),
    ("NeMo-RL 30B-A3B EP8xPP2->TP8xDP2 H100 nccl-reshard", "Qwen3-30B-A3B", 4,
     Use("g", pp=2, dp=8, ep=8), Use("g", tp=8, dp=2), 0.74, 1.00),
    ("NeMo-RL DSV3 PP16xEP16->TP32xDP8 H100 nccl-reshard", "DeepSeek-V3", 64,
     Use("g", pp=16, dp=16, ep=16), Use("g", tp=32, dp=8), 2.39, 2.83),
)
# The pull request that merged the feature publishes the 30B row above (0.74-1.00 s) in a table
# headed "DGX-H100 - xferdtensor_python_impl (fallback path)", beside four more layouts of the
# same model, BF16, Megatron -> vLLM; each its range's middle. Trainer and engine 16 GPUs each.
_RESHARD_PR = ("NVIDIA-NeMo/RL pull request 2971 (NCCL-Reshard refit merge PR (final), "
               "2026-06-27), DGX-H100 xferdtensor_python_impl table")
_RESHARD_PR_ROWS: tuple[tuple[str, str, int, Use, Use, float, float], ...] = (
    ("NeMo-RL 30B-A3B EP4xTP2xDP2->TP4xDP4 H100 nccl-reshard", "Qwen3-30B-A3B", 4,
     Use("g", tp=2, dp=8, ep=4), Use("g", tp=4, dp=4), 1.13, 1.53),
    ("NeMo-RL 30B-A3B EP4xTP2xPP2->TP4xDP4 H100 nccl-reshard", "Qwen3-30B-A3B", 4,
     Use("g", tp=2, pp=2, dp=4, ep=4), Use("g", tp=4, dp=4), 0.74, 1.17),
    ("NeMo-RL 30B-A3B EP8xPP2->TP2xDP8 H100 nccl-reshard", "Qwen3-30B-A3B", 4,
     Use("g", pp=2, dp=8, ep=8), Use("g", tp=2, dp=8), 1.21, 1.52),
    ("NeMo-RL 30B-A3B TP2xCP2xEP8->TP4xDP4 H100 nccl-reshard", "Qwen3-30B-A3B", 4,
     Use("g", tp=2, cp=2, dp=4, ep=8), Use("g", tp=4, dp=4), 1.02, 1.45),
)
# verl's checkpoint-engine bucket: `update_weights_bucket_megabytes` 2048 (volcengine/verl
# @b178a3cd verl/workers/config/rollout.py `CheckpointEngineConfig`)
_VERL_CKPT_BUCKET_GB = 2048 * 2**20 / 1e9
# verl-project/verl @8de5fb4463faa0a06ce1d260cadf3d7cd2a2c338 (pull request 7291, "Node-local
# multi-sender broadcast in NCCL checkpoint engine"), its "GPU correctness and latency" table,
# single-sender rows (the multi-sender rows run a relay topology the model does not price);
# hardware per issue 7167 of the same repository: GH200 nodes, 4 GPUs and 4 NICs of ~25 GB/s
_VERL_MULTI_SENDER = ("verl-project/verl @8de5fb44 pull request 7291 (single-sender, GH200 "
                      "1 node -> 1 node)")
# A GH200 superchip's Hopper GPU (NVIDIA GH200 datasheet: 96 GB HBM3 at 4 TB/s, 989 TFLOP/s
# BF16 dense, NVLink 900 GB/s both ways); its NIC per verl issue 7167 (~25 GB/s, 4 a node).
# Only the NIC enters the rows (trainer and engine on different nodes).
GH200_DEVICE: dict[str, Any] = {
    "name": "GH200", "kind": "gpu", "memory_gb": 96, "bf16_tflops": 989, "fp8_tflops": 1979,
    "mem_bw_gbs": 4000, "intra_link_gbs": 450, "nic_gbs": 25, "can_train": True,
    "source": "NVIDIA GH200 datasheet (96 GB HBM3, 4 TB/s); NIC: verl-project/verl issue 7167"}
SYNC_ROWS: list[SyncRow] = [
    SyncRow("verl 7B 4->4 H20", _FAS, "Qwen2.5-7B", "H20", 1, Use("g", dp=4), Use("g", tp=4),
            0.12, bucket_gb=_UNBUCKETED),
    SyncRow("verl 30B-A3B 16->16 H20", _FAS, "Qwen3-30B-A3B", "H20", 4, Use("g", tp=2, dp=8),
            Use("g", tp=4, dp=4), 15.76, bucket_gb=_UNBUCKETED),
    SyncRow("verl 235B-A22B 64->64 H20", _FAS, "Qwen3-235B-A22B", "H20", 16,
            Use("g", tp=4, pp=4, dp=4), Use("g", tp=8, dp=8), 58.57, bucket_gb=_UNBUCKETED),
    # verl's checkpoint-engine README (volcengine/verl @b178a3cd): trainer rank 0 walks the
    # FSDP2 weights tensor by tensor into 2048 MiB GPU buckets (its default) and broadcasts each
    # to the 30 receivers (mocks: no engine load); NCCL and NIXL both ~7 s
    SyncRow("verl ckpt-engine 30B-A3B FSDP2->30 H100", "verl verl/checkpoint_engine/README.md",
            "Qwen3-30B-A3B", "H100-SXM", 4, Use("g", dp=2), Use("g", dp=30), 7.0,
            bucket_gb=_VERL_CKPT_BUCKET_GB),
    # NeMo-RL's nccl_reshard refit, not colocated (the doc requires it: "the colocated path uses
    # IPC and is unaffected"), Megatron -> vLLM, BF16 on H100, its "Expected Performance" table
    # (_RESHARD). Its refit time is the synchronizer's timer,
    # `prepare_for_generation/transfer_and_update_weights` around the bulk reshard, the misc
    # packed broadcast and the engine's post-load processing; each row is the middle of the
    # doc's range. Trainer and engine on disjoint nodes (DP8 + TP8 is 16 GPUs: 2 nodes).
    # `refit.reshard_bytes` gives the doc's "XferDTensor fraction" of each model: 66.9%, 95.0%,
    # 97.6%. The misc path's packed buffers: 0.02 of the device's memory (packed_tensor.py).
    # Beyond the wire, per misc tensor and per grouped-expert call (`refit.reshard_fixed_s`):
    # fitted on these rows, leave-one-out in workflows.loo.
    *[SyncRow(name, source, model, "H100-SXM", nodes, actor, rollout, (lo + hi) / 2,
              bucket_gb=_RESHARD_BUCKET_GB, transport="nccl-reshard", framework="nemo-rl")
      for source, rows in ((_RESHARD, _RESHARD_ROWS), (_RESHARD_PR, _RESHARD_PR_ROWS))
      for name, model, nodes, actor, rollout, lo, hi in rows],
    SyncRow("Miles 30B-A3B 2 nodes->2 nodes H100", _MILES, "Qwen3-30B-A3B", "H100-SXM", 4,
            Use("g", tp=4, dp=4, zero=1, ep=8), Use("g", tp=8, dp=2, ep=8), 2.67,
            framework="miles"),
    SyncRow("Miles 235B-A22B 8 nodes->8 nodes H100", _MILES, "Qwen3-235B-A22B", "H100-SXM", 16,
            Use("g", tp=4, pp=4, dp=2, zero=1, cp=2, ep=16), Use("g", tp=32, dp=2, ep=32), 10.75,
            framework="miles"),
    # NeMo-RL's DeepSeek-V3 BF16 refit: 32 policy nodes (Megatron TP1 PP16 EP16) -> 4 rollout
    # nodes (vLLM TP32), not colocated; 4096 MiB buckets (0.05 of an 80 GiB GPU: H100-SXM
    # assumed, the doc names no GPU); each vLLM rank loaded 69.95 GiB in 18 batches (the slice
    # `refit.slice_bytes` gives: 75.1 GB). The async timer's pair (NIXL, NCCL) and the matched
    # synchronous verifier's pair (shard_expert_weights true, false). The doc does not say which
    # NCCL path its NCCL column ran; the full weights into every rank (1,342 GB in 14.21 s, 94
    # GB/s) would outrun a rank's 400 Gb/s NIC, so it is priced as the same pairs over NCCL.
    *[SyncRow(name, _NEMO_REFIT, "DeepSeek-V3", "H100-SXM", 36,
              Use("g", pp=16, dp=16, ep=16), Use("g", tp=32), t, bucket_gb=_NEMO_BUCKET_GB,
              transport=transport, shard_experts=shard, framework="nemo-rl")
      for name, transport, shard, t in _NEMO_REFIT_ROWS],
    # The same guide's "Matched synchronous verifier" NCCL column (the NIXL one is priced above
    # as the same-build regression run's 10.923 s): the NCCL pairs under the synchronous timer.
    SyncRow("NeMo-RL DSV3 NCCL sharded, sync 256->32", _NEMO_REFIT, "DeepSeek-V3", "H100-SXM",
            36, Use("g", pp=16, dp=16, ep=16), Use("g", tp=32), 15.52, bucket_gb=_NEMO_BUCKET_GB,
            transport="nccl-p2p", framework="nemo-rl"),
    # verl's NCCL checkpoint engine, single sender (the stock engine: trainer rank 0 broadcasts
    # every bucket), FSDP2 trainer of 4 GPUs on one GH200 node -> 4 rollout GPUs on another, mean
    # of 10 refits (warm group), "all-gather + broadcast + copy the tensors on a non-blocking
    # stream on the receiver side"; verl's default 2048 MiB buckets (_VERL_CKPT_BUCKET_GB).
    *[SyncRow(f"verl ckpt-engine {label} FSDP2 4->4 GH200", _VERL_MULTI_SENDER, model, "GH200",
              2, Use("g", dp=4), Use("g", dp=4), t, bucket_gb=_VERL_CKPT_BUCKET_GB,
              devices_per_node=4, device_type=GH200_DEVICE)
      for label, model, t in (("27B", "Qwen3.5-27B", 5.026), ("30B-A3B", "Qwen3-30B-A3B", 5.570))],
]


@dataclass(frozen=True)
class DecodeRow:
    """One decode-step anchor: a serving engine's step time at a fixed batch (no RL loop)."""

    name: str
    source: str
    model: str
    device: str
    tp: int
    batch: int
    context: float  # KV tokens per sequence, mean over the run
    published_s: float
    arch: ModelArch | None = None  # a model outside the shipped catalog (then `model` names it)


_VLLM = "vLLM performance dashboard, buildkite build 9515 (latency test: in 32, out 128, batch 8)"
# Mixtral-8x7B (mistralai/Mixtral-8x7B-v0.1 config.json): 8 experts of 14,336, 2 per token.
MIXTRAL = ModelArch(name="Mixtral-8x7B", layers=32, hidden=4096, heads=32, kv_heads=8,
                    mlp=14336, vocab=32000, experts=8, experts_per_token=2, expert_mlp=14336)
_SGL = "BenHamm SGLang 0.5.8 benchmark gist (1K in / 1K out, TPOT at concurrency 1)"
DECODE_ROWS: list[DecodeRow] = [
    DecodeRow("vLLM Llama-3.1-8B TP1 H200 batch 8", _VLLM, "Llama-3.1-8B", "H200", 1, 8, 96,
              6.5e-3),
    DecodeRow("vLLM Llama-3-70B TP4 H200 batch 8", _VLLM, "Llama-3-70B", "H200", 4, 8, 96,
              16.2e-3),
    DecodeRow("vLLM Mixtral-8x7B TP2 H200 batch 8", _VLLM, "Mixtral-8x7B", "H200", 2, 8, 96,
              15.0e-3, arch=MIXTRAL),
    # batch 1 hits 8 experts a layer: 8 x ceil(2 x 192 / 32) = 96 fused-MoE tiles on 148 SMs,
    # so its routed experts read at 96 / 244 of the dense bandwidth (`kernels.expert_read_eff`)
    DecodeRow("SGLang Qwen3-235B-A22B TP8 B200 batch 1", _SGL, "Qwen3-235B-A22B", "B200", 8, 1,
              1500, 6.70e-3),
    # a hybrid (Qwen3.8-27B = the Qwen3.5-27B shape): 1,855 tok/s per one-GPU engine at 39
    # running requests (Miles docs/models/qwen/qwen3-8.md, sec. 5.3): 39 / 1855 s per step;
    # context: a ~256-token prompt (as row r10 prices DAPO-Math-17k) plus half the 4,585-token
    # mean response (assumed)
    DecodeRow("SGLang Qwen3.8-27B hybrid TP1 H200 batch 39", "Miles docs/models/qwen/qwen3-8.md",
              "Qwen3.5-27B", "H200", 1, 39, 2550, 39 / 1855),
]
