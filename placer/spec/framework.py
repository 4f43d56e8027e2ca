"""Framework profiles: the registry of the RL frameworks a plan may target (`PROFILES`).

Each target is one `FrameworkProfile` (`placer.spec.frameworkrules`: the class, its rules and
what each field means): `native` (`placer execute` itself, the default), verl with FSDP2 or
Megatron, OpenRLHF, NeMo-RL, Miles and EasyR1. Every rule and overhead here cites the file and
version of the framework it was read from (each profile's `sources`; the versions below), and
the rates measured for them (a Ray trainer rank's host Adam, Miles' broadcast sender) say where
they were measured. The class and its vocabularies are importable from here as well.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType

from placer.base.roles import Role
from placer.spec.frameworkrules import (
    COLOCATED_INFERENCE,
    DEFAULT_FRAMEWORK,
    JOB_FEATURES,
    SLEEP_LEVELS,
    FrameworkName,
    FrameworkProfile,
    frozen,
    frozen_ints,
)

__all__ = ["COLOCATED_INFERENCE", "DEFAULT_FRAMEWORK", "JOB_FEATURES", "PROFILES", "SLEEP_LEVELS",
           "FrameworkName", "FrameworkProfile", "profile_of"]

VERL = "verl 0.8.0.dev @b178a3cd56f58b2d502255daba591e92833930a7"
OPENRLHF = "OpenRLHF v0.11.0 @3c3be6234e0cb353e76bb8019947db9dfe99fca7"
NEMO_RL = "NeMo-RL 0.6.0 @7ea279abfbeb698b092856d0dab61e7cf39bc909"
MILES = "Miles @31f1ca961a94cb860cec3b2dea34ec332bfa8f76"
# the commit EasyR1's published baselines cite (assets/baselines.md; 44 commits after the v0.3.2
# tag a23fb5b0, its verl/__init__.py says 0.3.3.dev0); the files read below are unchanged in
# what the profile records since v0.3.2 but for the LoRA keys
EASYR1 = "EasyR1 0.3.3.dev0 @b44b311b669bf1fd1aa2fc36f2251482ba33cb16"

# Megatron-Core's distributed optimizer with the precision-aware optimizer (NeMo-RL's Megatron
# recipes set use_precision_aware_optimizer) keeps, per parameter of its shard, the two fp32 Adam
# moments (4 + 4 B) and, with store_param_remainders (Megatron-Core's default) and BF16 weights,
# only the low 16 bits of the fp32 master weight (2 B: the other 16 are the BF16 weight itself)
MEGATRON_LM = "NVIDIA/Megatron-LM @d30c3ae5469fe3f6a64d4fd2e63b6e7f7844ea81"
NEMO_MEGATRON_OPTIMIZER_BYTES = 4.0 + 4.0 + 2.0

# Miles' broadcast sender (one per pipeline stage, miles/backends/megatron_utils/
# update_weight/update_weight_from_distributed/broadcast.py: the DP = TP = 0 rank gathers its
# stage's TP / EP shards bucket by bucket and broadcasts them): 23.9 GB/s achieved in Miles'
# docs/advanced/p2p-weight-transfer.md GLM-4.7-Flash row (30B in 2.51 s on one node, where the
# sender's own path binds) / link efficiency 0.8 = 29.9 GB/s raw.
MILES_SENDER_GBS = 29.9

# Megatron-Core's CPU Adam on a Ray trainer rank (Miles' `--optimizer-cpu-offload`, verl's
# `optimizer_cpu_offload` with `optimizer_offload_fraction` 1): the HybridDeviceOptimizer steps
# each rank's optimizer shard on the host with torch.optim.AdamW(fused=True), one optimizer per
# tensor (radixark/Megatron-LM megatron/core/optimizer/__init__.py @00f2f7d4fb13b4d5f113db37a7699624abc1affc,
# cpu_offloading/hybrid_optimizer.py @235952df607b3820716e5e67728a5ab470ca33ae; Miles' image
# builds its miles-main branch, docker/Dockerfile), on torch's intra-op threads, which Ray sets
# to max(floor(num_cpus), 1) (ray/_private/utils.py `set_omp_num_threads_if_unset`): 1 for
# Miles' trainer ranks, created with num_cpus = their GPU share (miles/ray/train/
# actor_factory.py; 0.4 when colocated, miles/ray/placement_group.py), and 1 for verl's, created
# with no num_cpus at all (volcengine/verl @b178a3cd verl/single_controller/ray/base.py
# `RayClassWithInitArgs.__call__`: a placement-group strategy and num_gpus only; no
# OMP_NUM_THREADS in verl/trainer/constants_ppo.py's runtime env). One thread of torch's
# fused CPU AdamW stepped 0.16-0.34 G fp32 parameters a second on a loaded 2-core Xeon build
# host (`python -m bench hostadam`, torch 2.13; one pass of ~28 bytes a parameter, 5-9x the
# unfused path): its best, 0.34, x 1 thread. A quiet server core may be up to ~2x faster.
RAY_RANK_HOST_ADAM_THREADS = 1
RAY_RANK_HOST_ADAM_GPS = 0.34 * RAY_RANK_HOST_ADAM_THREADS

# A Qwen2-VL image processor's host preparation of one image (decode, scale up to min_pixels,
# resize to a multiple of 28, rescale, normalize, patchify), as EasyR1's ranks run it: 16.7-40 ms
# CPU per 532 x 532 image (1,444 patches) on one thread of a loaded build host, transformers
# 5.25's PIL / numpy backend (`python -m bench imageprep`), the best taken: 1.2e-5 s per
# patch. Measured, not fitted on any row; a quiet server core may be faster, and transformers'
# torchvision-backed processor, where a run loads it, faster still (not measured here).
EASYR1_IMAGE_PREP_S_PER_PATCH = 1.2e-5

# What NeMo-RL's Megatron log-prob passes of an MoE model cost beyond their FLOPs and
# collectives, per token a GPU routes per MoE layer (`Efficiency.moe_route_token_layer_s`,
# `placer.cost.model.moe_route_time`). Measured, not fitted on any row: NVIDIA-NeMo/RL pull
# request 3295 (2026-07-20; benchmark of grpo.use_generation_logprobs_as_prev, "arithmetic mean
# of steps 3-20") ran Qwen3-30B-A3B on 2 nodes x 8 B200 and logged a log-prob stage
# (`policy_and_reference_logprobs`: the policy's and the reference's forward passes) of 87.5 s
# at 4,740 tokens/s/GPU (42.8 s with the policy's pass skipped, so the two passes are about
# equal). The pull request names no recipe; taken to be the model's synchronous MXFP8-rollout
# recipe, grpo-qwen3-30ba3b-4n4g-mxfp8-rollout.yaml (@ff2404c5b): expert_model_parallel_size 16
# and logprob_batch_size 2 (8,192-token packed micro-batches), as row r19's 4n4g recipe; the
# MXFP8 rollout leaves both passes BF16. 87.5 x 4,740 = 414,750 tokens a GPU a pass, x 48 MoE
# layers = 19.9 M token-layers; the cost model prices the two passes of that layout (EP 16
# across the two nodes, assumed) at 44.4 s for those tokens, which leaves 43.1 s / (2 x 19.9 M)
# = 1.08 us. The rates rows r15 (H100) and r19 (GB200) would each need alone to close their
# gaps, 2.1 and 2.4 us, are within 2.2x of it on both devices, so it is priced per token and not
# per FLOP or byte: no device parameter scales it. Its kernel-level cause is not located
# (v0.6.0's grpo_math_1B.yaml:145-148 runs the router in fp64 and the permutation unfused,
# moe_permute_fusion false, which the 30B-A3B recipes keep and the 235B and DeepSeek-V3 ones
# turn on). tests/test_moe_route.py re-derives the rate from the pull request's figures.
NEMO_MOE_ROUTE_S = 1.08e-6


_NATIVE = FrameworkProfile(
    "native", "placer execute", "this repository", "kuberay", gpu_models=False,
    splits_roles=True,
    colocation="any roles share a slot (executors/placement.py)",
    sleep_wake="vLLM / SGLang sleep when colocated (executors/vllm_rollout.py)",
    sources=MappingProxyType({
        "dispatch": "executors/runtime.py: the loop's driver passes each pass's samples to "
                    "every trainer rank as Ray call arguments (the shared dispatch factors)",
        "grad_reduce_bytes": "executors/precision.py `fsdp_policy`: MixedPrecisionPolicy("
                             "param_dtype=bfloat16, reduce_dtype=float32)",
    }))

_VERL_SOURCES: Mapping[str, str] = MappingProxyType({
    "splits_roles": f"{VERL} verl/trainer/ppo/ray_trainer.py: one rollout worker group in one "
                    "resource pool",
    "hsdp": f"{VERL} verl/trainer/config/engine/fsdp.yaml fsdp_size (FSDP2); the Megatron "
            "engine builds no partial distributed-optimizer groups "
            "(verl/workers/engine/megatron/transformer_impl.py)",
    "engine": f"{VERL} verl/trainer/config/rollout/rollout.yaml tensor_model_parallel_size, "
              "pipeline_model_parallel_size, expert_parallel_size, data_parallel_size",
    "async_steps": f"{VERL} docs/advance/one_step_off.md, docs/advance/fully_async.md",
    "gpu_models": f"{VERL} verl/single_controller/ray/base.py: resource pools of GPUs (vLLM / "
                  "SGLang engines, FSDP / Megatron workers)",
    "partial_rollout": f"{VERL} docs/advance/fully_async.md (async_training.partial_rollout)",
    "even_batch": f"{VERL} verl/utils/config.py validate_config: the train batch divisible by "
                  "the trainer's GPUs (FSDP) or Megatron data-parallel ranks x micro-batch",
    "frozen_shards": f"{VERL} verl/workers/fsdp_workers.py: ref_module_fsdp = "
                     "_build_model_optimizer(role='ref'), the actor's FSDP wrapping (FSDP2 "
                     "engine; the Megatron engine replicates it over data parallelism)",
    "old_log_probs": f"{VERL} rollout.yaml calculate_log_probs: False (the trainer recomputes)",
    "grad_reduce_bytes": f"{VERL} fp32 both ways: verl/workers/fsdp_workers.py 496 "
                         "mixed_precision reduce_dtype default 'fp32' (FSDP1 / FSDP2); "
                         "verl/utils/megatron_utils.py 141 the DDP config's "
                         "grad_reduce_in_fp32 True (override_ddp_config {} by default)",
    "dispatch": f"{VERL} verl/single_controller (DataProto dispatched from the driver); the "
                "shared dispatch factors were fitted on verl's rows",
    "stream_frozen": f"{VERL} verl/workers/fsdp_workers.py 524-526: CPUOffload("
                     "offload_params=True) for every FSDP1 role but the actor (552: FSDP2's "
                     "CPUOffloadPolicy); engine/fsdp.yaml:33 model_dtype fp32 (4 B a parameter "
                     "on the host); placer.cost.offload.STREAM_SCHEMES['verl-fsdp-ref']",
    "park_optimizer": f"{VERL} verl/workers/megatron_workers.py update_actor: "
                      "load_megatron_optimizer before update_policy, offload_megatron_optimizer "
                      "after (optimizer_offload; fsdp_workers.py likewise)",
    "sync_bucket_gb": f"{VERL} rollout.yaml checkpoint_engine.update_weights_bucket_megabytes "
                      "(2048) is SGLang's only; vLLM rollouts keep the shared factors",
    "colocated_switch": f"{VERL} the hybrid engine's rollout only, every step whatever the "
                        "memory: verl/trainer/ppo/ray_trainer.py 898 (async rollout mode "
                        "always), 1397 checkpoint_manager.sleep_replicas() after each "
                        "generate, 1611 update_weights() after each actor update; "
                        "verl/checkpoint_engine/base.py 371-376, 383-385 (backend naive, "
                        "rollout.yaml:251's default: the colocated trainer's rollout_mode); "
                        "vllm_async_server.py 563-575 sleep (free_cache_engine, rollout.yaml:"
                        "47 True); fsdp_workers.py 735-753, megatron_workers.py 714-736 "
                        "resume(weights), refit, resume(kv_cache). The actor's own state "
                        "moves only where the job parks it (park_optimizer, park_scheme)",
    "rollout_sleep_level": f"{VERL} verl/workers/rollout/vllm_rollout/vllm_async_server.py "
                           "563-575: the hybrid engine's `sleep` is collective_rpc('sleep', "
                           "level=2) whatever the vLLM version (setup.py:52 requires vllm "
                           ">=0.8.5), `rollout_mode` wakes the weights, refits them and wakes "
                           "the KV cache (verl/workers/fsdp_workers.py 735-753, "
                           "megatron_workers.py 714-736). Earlier eras: v0.6.0-v0.7.0 (from "
                           "e31a88312, 2025-08-16) sleep at verl/third_party/vllm/__init__.py "
                           "VLLM_SLEEP_LEVEL, 2 for vLLM >= 0.8.5, else 1 (1 too with "
                           "layered_summon, or expert parallelism on vLLM < 0.11: v0.7.0 "
                           "vllm_rollout.py:131-135); 65c59c719 (2025-08-13) level 2 always; "
                           "v0.5.0 and before level 1 always (sharding_manager/fsdp_vllm.py:240, "
                           "megatron_vllm.py:191): a job run on those sets rollout_sleep_level",
})


def _verl(name: str, title: str, trainer: str,
          **layout: float | str | tuple[str, ...] | None) -> FrameworkProfile:
    """verl with one trainer backend (`trainer`: where its layouts come from)."""
    return FrameworkProfile(
        name, title, VERL, "verl", **layout,  # type: ignore[arg-type]
        colocation="actor, rollout and reference in one hybrid engine; critic with the actor; "
                   "rollout apart in the one-step-off / fully async recipes",
        sleep_wake=f"{VERL} rollout.yaml free_cache_engine (engine sleep between phases)",
        rollout_sleep_level=2, colocated_switch=(Role.ROLLOUT,),
        sources=MappingProxyType({**_VERL_SOURCES, "trainer": f"{VERL} {trainer}"}))


_VERL_FSDP = _verl("verl", "verl (FSDP2)", "verl/trainer/config/engine/fsdp.yaml: FSDP2 "
                   "shards data-parallel only (Ulysses sequence parallelism for long contexts)",
                   trainer_tp=1, trainer_pp=1, trainer_ep=1, frozen_shards=True,
                   even_batch=True, park_optimizer=(Role.ACTOR, Role.CRITIC), park_scheme="verl",
                   stream_frozen=(Role.REFERENCE,), stream_scheme="verl-fsdp-ref")
_VERL_MEGATRON_BASE = _verl("verl-megatron", "verl (Megatron)", "verl/trainer/config/engine/"
                            "megatron.yaml: tensor, pipeline, context and expert parallel sizes",
                            hsdp=False, megatron_trainer=True, even_batch=True,
                            park_optimizer=(Role.ACTOR, Role.CRITIC), park_scheme="verl-megatron")
# a host-stepped optimizer (`Parallel.offload`) is Megatron's HybridDeviceOptimizer on one thread
_VERL_MEGATRON = replace(
    _VERL_MEGATRON_BASE, factors=frozen({"host_adam_gparams_s": RAY_RANK_HOST_ADAM_GPS}),
    sources=MappingProxyType({
        **_VERL_MEGATRON_BASE.sources,
        "host_adam_gparams_s": f"{VERL} examples/grpo_trainer/run_deepseek671b_math_megatron_96gb.sh "
                               "optimizer_cpu_offload with optimizer_offload_fraction 1 "
                               "(Megatron's HybridDeviceOptimizer: the step on the host, torch's "
                               "fused AdamW on the one thread Ray gives a rank created without "
                               "num_cpus, verl/single_controller/ray/base.py; the rate: "
                               "bench/bench_hostadam.py)"}))

_OPENRLHF = FrameworkProfile(
    "openrlhf", "OpenRLHF", OPENRLHF, "openrlhf", hsdp=False, trainer_pp=1, trainer_ep=1,
    engine_pp=1, engine_ep=1, attn_dp=False, frozen_shards=True,
    colocation="--train.colocate_all, --train.colocate_actor_ref, colocated critic/reward "
               "(openrlhf/cli/train_ppo_ray.py)",
    sleep_wake="--vllm.enable_sleep, --ds.enable_sleep (colocate_all only)",
    fsdp_grad_reduce_bytes=2,
    sources=MappingProxyType({
        "grad_reduce_bytes": f"{OPENRLHF} DeepSpeed's runtime/engine.py "
                             "`communication_data_type` is bfloat16 under bf16 unless the config "
                             "sets one; openrlhf/utils/deepspeed/deepspeed_utils.py "
                             "get_train_ds_config sets bf16 and grad_accum_dtype only (read in "
                             "the Open-Reasoner-Zero copy of it, not at this commit)",
        "trainer": f"{OPENRLHF} openrlhf/cli/train_ppo_ray.py: DeepSpeed ZeRO with "
                   "--ds.tensor_parallel_size and --ds.ring_attn_size; no pipeline or expert "
                   "parallelism, no hybrid shard groups",
        "engine": f"{OPENRLHF} train_ppo_ray.py: --vllm.num_engines x "
                  "--vllm.tensor_parallel_size only (no pipeline or expert parallel engine)",
        "splits_roles": f"{OPENRLHF} train_ppo_ray.py: one vLLM engine group",
        "gpu_models": f"{OPENRLHF} openrlhf/trainer/ray/vllm_engine.py: vLLM engines on GPU "
                      "bundles; DeepSpeed models on GPUs",
        "async_steps": f"{OPENRLHF} train_ppo_ray.py --train.async_enable",
        "partial_rollout": f"{OPENRLHF} train_ppo_ray.py --train.partial_rollout_enable",
        "dispatch": f"{OPENRLHF} openrlhf/trainer/ray/launcher.py async_run_method_batch: the "
                    "driver slices every pass's batch and ray.put()s each rank's chunk",
        "old_log_probs": f"{OPENRLHF} openrlhf/trainer/ppo_utils/experience_maker.py (actor "
                         "forward)",
        "frozen_shards": f"{OPENRLHF} openrlhf/utils/deepspeed/deepspeed.py "
                         "get_ds_eval_config: the reference's DeepSpeed stage is 3 under "
                         "--ds.zero_stage 3, else 0",
    }))

_NEMO = FrameworkProfile(
    "nemo-rl", "NeMo-RL", NEMO_RL, "nemo-rl", hsdp=False, partial_rollout=False, frozen_shards=True,
    park_optimizer=(Role.ACTOR,), swap_frozen=(Role.REFERENCE,), rule_workers=8,
    colocated_switch=(Role.ACTOR, Role.ROLLOUT), async_apart=COLOCATED_INFERENCE,
    colocation="policy and generation colocated (cluster shared) or apart "
               "(policy.generation.colocated.enabled)",
    sleep_wake="vLLM sleep between phases when colocated",
    colocated_refit="ipc-stream", megatron_optimizer_bytes=NEMO_MEGATRON_OPTIMIZER_BYTES,
    megatron_grad_reduce_bytes=2, pads_packed_bins=True,
    factors=frozen({"moe_route_token_layer_s": NEMO_MOE_ROUTE_S}),
    sources=MappingProxyType({
        "grad_reduce_bytes": f"{NEMO_RL} Megatron in BF16: examples/configs/grpo_math_1B.yaml 302 "
                             "(and grpo_math_1B_megatron.yaml 185) distributed_data_parallel_"
                             "config.grad_reduce_in_fp32 false; DTensor in fp32: nemo_rl/models/"
                             "dtensor/parallelize.py 509 MixedPrecisionPolicy(reduce_dtype="
                             "torch.float32)",
        "moe_route_token_layer_s": f"{NEMO_RL} nemo_rl/models/policy/workers/megatron_policy_"
                                   "worker.py `get_logprobs` (Megatron forward-only passes, the "
                                   "reference's inside `use_reference_model`); the rate: "
                                   "NVIDIA-NeMo/RL pull request 3295 (Qwen3-30B-A3B on 2 x 8 "
                                   "B200: policy_and_reference_logprobs 87.5 s at 4,740 "
                                   "tokens/s/GPU; recipe grpo-qwen3-30ba3b-4n4g-mxfp8-rollout."
                                   "yaml @ff2404c5b, EP 16, 8,192-token micro-batches): the "
                                   "log-prob passes' time the FLOPs and collectives leave, per "
                                   "token a GPU routes per MoE layer (NEMO_MOE_ROUTE_S)",
        "megatron_optimizer_bytes": f"{NEMO_RL} examples/configs/grpo_math_1B_megatron.yaml:171 "
                                    "use_precision_aware_optimizer: true (bf16: true; "
                                    "store_param_remainders, main_params_dtype, exp_avg_dtype, "
                                    "exp_avg_sq_dtype unset: Megatron-Core's defaults); "
                                    f"{MEGATRON_LM} megatron/core/optimizer/optimizer_config.py "
                                    "192 store_param_remainders True (kept with Transformer "
                                    "Engine >= 2.1, 425-426: NeMo-RL pins v2.14.1, pyproject.toml"
                                    ":134), 200-206 fp32 main params and moments; "
                                    "distrib_optimizer.py 390-420 (no fp32 main copy of its own: "
                                    "TE's FusedAdam holds it), 812-818 (master_param int16)",
        "colocated_refit": f"{NEMO_RL} nemo_rl/algorithms/grpo.py `refit_policy_generation` "
                           "(colocated: `stream_weights_via_ipc_zmq`, whatever the weight "
                           "synchronizer; checkpoint engines and nccl_reshard are for "
                           "non-colocated generation), nemo_rl/models/policy/utils.py "
                           "`stream_weights_via_ipc_zmq_impl`, nemo_rl/models/generation/vllm/"
                           "vllm_backend.py `update_weights_via_ipc_zmq`",
        "trainer": f"{NEMO_RL} DTensor (tensor, context parallel) or Megatron (tensor, "
                   "pipeline, context, expert parallel): examples/configs/grpo_math_1B.yaml",
        "engine": f"{NEMO_RL} nemo_rl/models/generation/vllm/config.py tensor_, pipeline_, "
                  "expert_parallel_size",
        "hsdp": f"{NEMO_RL} dtensor_cfg has no replicate (shard-group) size",
        "critic": f"{NEMO_RL} nemo_rl/algorithms/ppo.py (value model)",
        "async_steps": f"{NEMO_RL} grpo.async_grpo (max_trajectory_age_steps)",
        "async_apart": f"{NEMO_RL} nemo_rl/algorithms/grpo.py `async_grpo_train` 4177-4179: "
                       "assert not policy.generation.colocated.enabled unless the generation "
                       "backend is Megatron's (placer's rollout is a vLLM engine); v0.6.0 "
                       "@5fb588932bf835506a8a5bac01de4f8c7ab0a065 grpo.py 2448-2450: colocated "
                       "inference not supported for async GRPO at all",
        "partial_rollout": f"{NEMO_RL} examples/configs/grpo_math_1B.yaml: async_grpo has "
                           "max_trajectory_age_steps and in_flight_weight_updates, no partial "
                           "rollout (none in the repository)",
        "splits_roles": f"{NEMO_RL} one generation cluster (policy.generation.colocated)",
        "gpu_models": f"{NEMO_RL} nemo_rl/distributed/virtual_cluster.py: GPU bundles",
        "park_optimizer": f"{NEMO_RL} examples/configs/grpo_math_1B.yaml:139 "
                          "offload_optimizer_for_logprob (colocated generation always moves "
                          "the optimizer off the GPU before the refit; the value model's section "
                          "has no such key)",
        "frozen_shards": f"{NEMO_RL} nemo_rl/models/policy/workers/dtensor_policy_worker.py: "
                         "the reference is a state dict of the policy's sharded model, swapped "
                         "in for its pass (use_reference_model)",
        "rule_workers": f"{NEMO_RL} examples/configs/grpo_math_1B.yaml:491 env.math."
                        "num_workers 8; nemo_rl/environments/math_environment.py `step` (the "
                        "batch chunked over num_workers verify workers, chunk_list_to_workers); "
                        "the same at v0.6.0 @5fb588932bf835506a8a5bac01de4f8c7ab0a065 (yaml:365)",
        "pads_packed_bins": f"{NEMO_RL} nemo_rl/models/megatron/data.py 1328-1332 (pp > 1: "
                            "every packed micro-batch padded to the rank's longest bin), "
                            "nemo_rl/distributed/batched_data_dict.py 598-604, 658 (MFFD bins, "
                            "at least and a multiple of dp, dealt round-robin), nemo_rl/data/"
                            "packing/algorithms.py 476-652; the same at v0.6.0 @5fb588932bf835"
                            "506a8a5bac01de4f8c7ab0a065, the rows' recipes: data.py 585-589, "
                            "batched_data_dict.py 430-436, 484-486 (placer.cost.packing)",
        "swap_frozen": f"{NEMO_RL} nemo_rl/models/policy/workers/megatron_policy_worker.py "
                       "`use_reference_model` (1971-2037: the policy's state dict out, the "
                       "reference's in, the policy's back, every reference pass; the forced "
                       "param all-gather of disable_forward_pre_hook), nemo_rl/models/megatron/"
                       "setup.py `setup_reference_model_state` (held on the host); the same at "
                       "v0.6.0 @5fb588932bf835506a8a5bac01de4f8c7ab0a065 (placer.cost.refswap)",
        "dispatch": f"{NEMO_RL} nemo_rl/models/policy/lm_policy.py: the driver shards each "
                    "pass's batch (shard_by_batch_size) to the workers",
        "colocated_switch": f"{NEMO_RL} nemo_rl/algorithms/grpo.py, every step when "
                            "policy.generation.colocated.enabled, whatever the memory: "
                            "`refit_policy_generation` 2341-2343 offload_before_refit (the "
                            "optimizer state to the host) and the engine's wake_up(weights), "
                            "2415-2417 offload_after_refit (the parameters to the host) and "
                            "wake_up(kv_cache); 3011 finish_generation (vLLM sleep); 3213 "
                            "prepare_for_lp_inference (parameters back); 3328 "
                            "prepare_for_training (optimizer back). nemo_rl/models/policy/"
                            "workers/megatron_policy_worker.py 2931-3260 (move_model: the BF16 "
                            "param buffers copied, the grad buffers freed and re-zeroed, "
                            "NVIDIA/Megatron-LM @d30c3ae5 param_and_grad_buffer.py "
                            "offload_to_cpu 1208-1238; move_optimizer: the optimizer state), "
                            "dtensor_policy_worker_v2.py 1222-1335 alike; nemo_rl/models/"
                            "generation/vllm/vllm_worker.py 1309 llm.sleep(level=1), 1314 "
                            "wake_up; vllm_generation.py 980-1020 (sleep only when colocated). "
                            "The same at v0.6.0 @5fb588932bf835506a8a5bac01de4f8c7ab0a065 "
                            "(grpo.py 1116-1118, 1189-1191, 1568, 1733, 1807; "
                            "megatron_policy_worker.py 1112-1273; vllm_worker.py 1009)",
    }))

_MILES = FrameworkProfile(
    "miles", "Miles (slime)", MILES, "miles", hsdp=False, megatron_trainer=True, engine_pp=1,
    colocation="--colocate: actor and rollout share GPUs; else separate "
               "--actor-num-gpus-per-node / --rollout-num-gpus",
    sleep_wake="--offload-rollout (SGLang release_memory_occupation)",
    factors=frozen({"dispatch_bytes_per_token": 0.0, "sync_sender_gbs": MILES_SENDER_GBS,
                     "sync_bucket_gb": 1.0, "host_adam_gparams_s": RAY_RANK_HOST_ADAM_GPS}),
    sources=MappingProxyType({
        "trainer": f"{MILES} Megatron actor (tensor, pipeline, context, expert parallel)",
        "grad_reduce_bytes": f"{MILES} fp32: docs/user-guide/argument-groups.md 189, the "
                             "recipes pin --accumulate-allreduce-grads-in-fp32 (e.g. examples/"
                             "experimental/eval/scripts/run-qwen3-4B.sh 128)",
        "engine": f"{MILES} miles/utils/arguments.py --rollout-num-gpus-per-engine (one SGLang "
                  "TP group per engine; expert and data-parallel attention via SGLang args)",
        "critic": f"{MILES} miles/utils/arguments.py --critic-num-nodes, --critic-load",
        "splits_roles": f"{MILES} miles/utils/arguments.py: one rollout engine pool "
                        "(--rollout-num-gpus)",
        "hsdp": f"{MILES} Megatron distributed optimizer without partial instances",
        "gpu_models": f"{MILES} miles/ray/placement_group.py: GPU bundles for actor and "
                      "SGLang engines",
        "partial_rollout": f"{MILES} miles/utils/arguments.py --partial-rollout",
        "park_optimizer": f"{MILES} miles/utils/arguments.py has no --offload-optimizer-states "
                          "(--offload-train moves the whole train state: the slot switch)",
        "dispatch_bytes_per_token": f"{MILES} miles/backends/training_utils/data.py "
                                    "get_rollout_data: each "
                    "rank fetches the rollout batch from the object store itself, once per "
                    "step (no driver dispatch per pass)",
        "sync_sender_gbs": f"{MILES} docs/advanced/p2p-weight-transfer.md (broadcast sender, "
                           "GLM-4.7-Flash row)",
        "sync_bucket_gb": f"{MILES} docs/advanced/p2p-weight-transfer.md (1 GB buckets)",
        "host_adam_gparams_s": f"{MILES} scripts/run_qwen3_dense.py --optimizer-cpu-offload "
                               "(Megatron's HybridDeviceOptimizer: the step on the host, torch's "
                               "fused AdamW on the one thread Ray gives a rank of num_cpus < 2, "
                               "miles/ray/train/actor_factory.py; the rate: bench/bench_hostadam.py)",
    }))

_E = "verl/workers/fsdp_workers.py"  # EasyR1's one worker class (FSDPWorker), at EASYR1
_EASYR1 = FrameworkProfile(
    "easyr1", "EasyR1 (FSDP + vLLM hybrid engine)", EASYR1, "easyr1",
    trainer_tp=1, trainer_pp=1, trainer_ep=1, engine_pp=1, engine_ep=1, attn_dp=False,
    async_steps=False, partial_rollout=False, reward_model=False, frozen_shards=True,
    even_batch=True, even_prompts=True, park_optimizer=(Role.ACTOR, Role.CRITIC),
    park_scheme="verl", stream_frozen=(Role.REFERENCE,), stream_scheme="easyr1-ref",
    hybrid_engine=(Role.ACTOR, Role.ROLLOUT, Role.REFERENCE, Role.CRITIC),
    colocated_switch=(Role.ROLLOUT,),
    micro_batch_samples=frozen_ints({"forward": 2, "update": 1}),
    host_image_prep=(Role.ROLLOUT, Role.ACTOR),
    factors=frozen({"host_image_prep_s_per_patch": EASYR1_IMAGE_PREP_S_PER_PATCH}),
    colocation="actor, rollout and reference in one FSDPWorker over every GPU; the critic's "
               "worker group in the same pool",
    sleep_wake="vLLM sleep(level=1) after generation, wake_up(tags=weights, kv_cache) before "
               "(verl/workers/sharding_manager/fsdp_vllm.py)",
    sources=MappingProxyType({
        "trainer": f"{EASYR1} {_E}:118-157, 287-322: FSDP1 (torch FullyShardedDataParallel) "
                   "over a 1-D mesh of every rank, or (ddp, fsdp) for HSDP; Ulysses sequence "
                   "parallelism only (ulysses_size); no tensor, pipeline or expert parallelism",
        "hsdp": f"{EASYR1} {_E}:121-127, 287-291: fsdp_size -> HYBRID_SHARD",
        "engine": f"{EASYR1} verl/workers/rollout/vllm_rollout_spmd.py:127-145: vLLM "
                  "LLM(distributed_executor_backend=external_launcher, tensor_parallel_size) "
                  "only (no pipeline, expert or data-parallel size); verl/workers/rollout/"
                  "config.py:24 name vllm",
        "hybrid_engine": f"{EASYR1} verl/trainer/main.py:54-66: one global pool of "
                         "n_gpus_per_node x nnodes for ActorRolloutRef and Critic; "
                         "verl/trainer/ray_trainer.py:256-263: hybrid_engine (else "
                         "NotImplementedError)",
        "splits_roles": f"{EASYR1} verl/trainer/main.py:59-61: one resource pool",
        "colocated_switch": f"{EASYR1} the engine every step whatever the memory: "
                            "verl/trainer/ray_trainer.py 590-594 prepare_rollout_engine / "
                            f"release_rollout_engine around each step's generation, {_E}:603-"
                            "609, verl/workers/sharding_manager/fsdp_vllm.py 167-205 wake_up("
                            "weights), sync, wake_up(kv_cache); sleep(level=1)",
        "gpu_models": f"{EASYR1} verl/trainer/ray_trainer.py:94-95: RayResourcePool(use_gpu=True)",
        "critic": f"{EASYR1} verl/workers/critic/config.py, {_E}:110-113 (gae)",
        "async_steps": f"{EASYR1} verl/trainer/ray_trainer.py fit: generate, reward, log-probs, "
                       "update in order each step (no asynchronous or one-step-off trainer)",
        "partial_rollout": f"{EASYR1} vllm_rollout_spmd.py: one generate call per step",
        "reward_model": f"{EASYR1} verl/trainer/main.py:54-57, 68-70: no RewardModel worker, "
                        "a reward function (AutoRewardManager, CPU)",
        "frozen_shards": f"{EASYR1} examples/config.yaml:81-85 ref.fsdp.enable_full_shard",
        "even_batch": f"{EASYR1} verl/protocol.py:555 DataProto.chunk (equal chunks per rank); "
                      f"{_E}:146-151 global_batch_size_per_device",
        "even_prompts": f"{EASYR1} verl/trainer/ray_trainer.py fit: generate_sequences "
                        "(Dispatch.DP_COMPUTE_PROTO) chunks the step's prompts over every rank "
                        "before the n samples are drawn (verl/protocol.py:555)",
        "old_log_probs": f"{EASYR1} {_E}:632-660 compute_log_probs (the actor's forward)",
        "grad_reduce_bytes": f"{EASYR1} verl/workers/actor/config.py:86 mp_reduce_dtype 'fp32', "
                             f"{_E}:280 MixedPrecision(reduce_dtype=...)",
        "dispatch": f"{EASYR1} {_E}: Dispatch.DP_COMPUTE_PROTO from the driver, verl's single "
                    "controller forked; the shared dispatch factors (fitted on verl's rows)",
        "park_optimizer": f"{EASYR1} examples/config.yaml:62-64 offload_params, "
                          f"offload_optimizer; {_E}:557-598 update_actor, 639-659 "
                          "compute_log_probs: placer.cost.offload.PARK_SCHEMES['verl'] (the "
                          "same fp32 module, 198-199, and the same copies)",
        "stream_frozen": f"{EASYR1} examples/config.yaml:84 ref.fsdp.enable_cpu_offload; "
                         f"{_E}:298-299, 319: placer.cost.offload.STREAM_SCHEMES['easyr1-ref'] "
                         "(BF16 reference, 198-199)",
        "micro_batch_samples": f"{EASYR1} examples/config.yaml:37-41 "
                               "micro_batch_size_per_device_for_update 1, _for_experience 2, "
                               "dynamic_batching; verl/workers/actor/dp_actor.py:198 (budget = "
                               "2 x the padded length), 242 (1 x it); verl/workers/config.py:50 "
                               "(the reference's copies the actor's)",
        "host_image_prep": f"{EASYR1} verl/workers/rollout/vllm_rollout_spmd.py:121 "
                           "disable_mm_preprocessor_cache (vLLM runs the HF processor on every "
                           f"prompt), 191-205 process_image per prompt; {_E}:503-548 "
                           "_process_multi_modal_inputs: process_image and the image processor "
                           "per distinct uid of the rank's chunk, cached for the step's later "
                           "calls; the rate: bench/bench_imageprep.py",
        "host_image_prep_s_per_patch": f"{EASYR1} verl/utils/dataset.py:54-78 process_image "
                                       "and the Qwen2-VL image processor its ranks run, "
                                       "measured (python -m bench imageprep): one thread, best "
                                       "of a loaded build host; not fitted on any row",
    }))

PROFILES: Mapping[str, FrameworkProfile] = MappingProxyType(
    {p.name: p for p in (_NATIVE, _VERL_FSDP, _VERL_MEGATRON, _OPENRLHF, _NEMO, _MILES, _EASYR1)})


def profile_of(name: str | None) -> FrameworkProfile:
    """The profile `name` names (None: `native`). KeyError for an unknown one: the job format's
    Literal refuses those first."""
    return PROFILES[name or DEFAULT_FRAMEWORK]
