"""Pipeline stage balance: the slowest stage paces a pipelined pass.

In a pipelined schedule every stage handles every micro-batch in turn (Megatron's 1F1B, and its
forward-only schedule, which runs every micro-batch as a warm-up forward:
NVIDIA/Megatron-LM core_v0.13.0 @c550cf6c41c31cd3ec72e05c25ea0c979f2b6631
megatron/core/pipeline_parallel/schedules.py:605-606), so in the steady state each micro-batch
takes the slowest stage's time on every stage. The cost model prices a pass's FLOPs spread
evenly over all of the layout's devices (`roofline.pass_compute`); what a stage really holds is:

  layers   `get_num_layers_to_build` (megatron/core/transformer/transformer_block.py:65-120):
           num_layers / pp on every stage, or, where the recipe sets
           `num_layers_in_first_pipeline_stage` / `num_layers_in_last_pipeline_stage`
           (`Parallel.first_stage_layers`, `Parallel.last_stage_layers`), those on the first /
           last stage and the remaining layers split evenly over the stages left;
  head     the output layer, the LM head's hidden x vocab ColumnParallelLinear, is built on the
           last stage only (megatron/core/models/gpt/gpt_model.py:186-203, `post_process`); the
           input embedding on the first is a gather (no FLOPs). Nothing counts the head as a
           layer unless `account_for_loss_in_pipeline_split` is set (default False; verl's
           DeepSeek-V3 script, examples/grpo_trainer/run_deepseek671b_math_megatron_96gb.sh at
           volcengine/verl @4c7812c40b473867b4ba1d6d5e8687841578aa66, sets it False and puts 6
           of 61 layers on the last of 12 stages; NeMo-RL's DeepSeek-V3 and Qwen3-235B recipes
           lighten the first and last stages instead, NVIDIA-NeMo/RL v0.6.0
           examples/configs/recipes/llm/performance/*.yaml).

With T_L the layers' and T_H the head's time spread over every device (`pass_compute`'s two
parts), a stage of l of the model's L layers, on 1/pp of the devices, takes pp x (l / L) x T_L,
and the last adds pp x T_H. The pass runs at pp x the slowest stage; `stage_excess` is that less
the even spread T_L + T_H (never negative: the slowest stage is at least the mean). An even
split with the head on the last stage gives (pp - 1) x T_H.

What a stage holds paces a per-rank step on it too. A host-stepped optimizer (Megatron-Core's
HybridDeviceOptimizer, `Parallel.offload`) steps each rank's own shard on the host, and the
step is over when the last rank's is: the optimizer's grad-norm all-reduce starts the next
step on every rank, and the next forward's first stage-to-stage send waits on every stage.
`heaviest_stage_params` is that rank's shard: the stage's layers as `stage_layers` splits them,
the leading dense layers (`ModelArch.dense_layers`, DeepSeek's first_k_dense_replace) on the
first stages, the input embedding on the first stage and the LM head with the final norm on the
last (gpt_model.py:186-203 above, `pre_process` / `post_process`).
"""
from __future__ import annotations

from placer.cost.sharding import Parallel, params_per_device
from placer.spec.arch import ModelArch


def stage_layers(n_layers: int, par: Parallel) -> tuple[float, float, float]:
    """(first, middle, last) stage's transformer layers of an `n_layers` model under `par`
    (Megatron's `get_num_layers_to_build`): a stage the layout pins keeps its count, the others
    share the rest evenly. pp = 1: the one stage holds every layer."""
    if par.pp <= 1:
        return float(n_layers), float(n_layers), float(n_layers)
    pinned = [n for n in (par.first_stage_layers, par.last_stage_layers) if n > 0]
    left = n_layers - sum(pinned)
    stages_left = par.pp - len(pinned)
    if left < 0 or (stages_left == 0 and left > 0):
        raise ValueError(f"first_stage_layers {par.first_stage_layers} and last_stage_layers "
                         f"{par.last_stage_layers} do not split {n_layers} layers over "
                         f"pp {par.pp}")
    middle = left / stages_left if stages_left > 0 else 0.0
    first = float(par.first_stage_layers) if par.first_stage_layers > 0 else middle
    last = float(par.last_stage_layers) if par.last_stage_layers > 0 else middle
    return first, middle, last


def stage_excess(layers_s: float, head_s: float, n_layers: int, par: Parallel) -> float:
    """Seconds a pipelined pass adds beyond the even spread `layers_s + head_s` (`pass_compute`'s
    layers and LM-head parts): pp x the slowest stage (`stage_layers`' share of the layers, the
    head on the last) less the spread. 0 for pp = 1."""
    if par.pp <= 1 or n_layers <= 0:
        return 0.0
    first, middle, last = stage_layers(n_layers, par)
    per_layer = layers_s / n_layers
    slowest = max(first * per_layer, middle * per_layer, last * per_layer + head_s)
    return max(par.pp * slowest - (layers_s + head_s), 0.0)


def _stage_parts(m: ModelArch, layers: float, start: float, first: bool,
                 last: bool) -> tuple[float, float]:
    """(dense, routed-expert) parameters of the stage holding `layers` layers from layer
    `start` on (whole model, before any split): its dense-MLP and MoE layers (the model's
    leading `dense_layers` are dense), the embedding on the first, head and final norm on the
    last."""
    h = m.hidden
    dense_n = min(max(m.dense_layers - start, 0.0), layers) if m.moe else layers
    moe_n = layers - dense_n
    per_layer = m.mixer_params() / m.layers + 2 * h  # token mixer and the two norms
    dense = layers * per_layer + dense_n * 3 * h * m.mlp
    if m.moe:
        dense += moe_n * (h * m.experts + m.shared_experts * m.expert_params())
    dense += m.vocab * h * (first + last) + h * last
    return dense, moe_n * m.experts * m.expert_params()


def heaviest_stage_params(m: ModelArch, par: Parallel) -> tuple[float, float]:
    """(dense, routed-expert) parameters one device of the heaviest pipeline stage holds, before
    any ZeRO sharding: `sharding.params_per_device` where pp = 1, else the stage whose device
    holds the most of both (module docstring), each part scaled by that stage's share of the
    model's part so the totals stay `sharding.params_per_device`'s."""
    dense_dev, expert_dev = params_per_device(m, par)
    if par.pp <= 1:
        return dense_dev, expert_dev
    first, middle, last = stage_layers(m.layers, par)
    counts = [first, *[middle] * (par.pp - 2), last]
    starts = [sum(counts[:i]) for i in range(par.pp)]
    parts = [_stage_parts(m, n, s, i == 0, i == par.pp - 1)
             for i, (n, s) in enumerate(zip(counts, starts))]
    total_dense = sum(p[0] for p in parts) or 1.0
    total_expert = sum(p[1] for p in parts) or 1.0
    # per-device totals over all stages (params_per_device is the mean stage's)
    dense_all, expert_all = dense_dev * par.pp, expert_dev * par.pp
    return max(((d / total_dense * dense_all, e / total_expert * expert_all) for d, e in parts),
               key=sum)
