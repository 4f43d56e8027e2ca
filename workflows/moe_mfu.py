"""Held-out check of the MoE training update: the cost model's update time read as verl's MFU.

verl's docs publish the MFU its Megatron actor reached on MoE models (volcengine/verl
@c711dd741, docs/perf/dpsk.md, "Benchmark" and "Qwen3-30B-A3B MOE"): Qwen3-30B-A3B on 8, 16
and 32 H20 (TP 1, PP 1, EP 8, the optimizer on the host) 0.40, 0.37 and 0.31; DeepSeek-V3 on
96 H20 (TP 8, PP 12, EP 8: row r11's layout) 0.19. No factor was fitted on these figures.

verl's MFU is its flops counter's FLOPs over the `update_policy` time (the forward, backward
and optimizer steps of every mini-batch; loading the parked parameters and optimizer comes
before the timer) times the device count and verl's peak per device (148 TFLOP/s for H20):
verl/workers/megatron_workers.py:645-652 and verl/utils/flops_counter.py:96 at that commit.
The counter (flops_counter.py `_estimate_qwen2_moe_flops`, `_estimate_deepseek_v3_flops`)
counts 6 x (the per-token matmul parameters, the embedding and the LM head both included, the
router's h x E and k active experts' SwiGLU) per token plus 12 x s^2 x heads x head_dim per
layer per sequence (full, not causal, attention), so its MFU is not the cost model's own
fraction of peak; this module prices the update with the cost model (`Pricer`, the row's
published layout) and reads the time through verl's counter, so the two compare like for like.

The 30B configurations are the doc's script (examples/grpo_trainer/run_qwen3moe-30b_megatron_
96gb.sh at that commit: 512 prompts x 16 samples, 4 mini-batches, prompt <= 2,048, response <=
8,192, `ppo_max_token_len_per_gpu` 10,240, param/grad/optimizer offload, the optimizer stepped
on the host, no recomputation); row r05's job (the same script family) gives the lengths.

    PYTHONPATH=$PWD python -m workflows.moe_mfu [--seed N]
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np
import yaml

from placer.base.roles import Role
from placer.cost.efficiency import Calibration
from placer.spec.arch import ModelArch
from placer.spec.catalog import resolve
from placer.spec.load import job_from_dict
from placer.spec.sampling import draw_lengths
from workflows.published import EXAMPLES, Pricer, _place
from workflows.published_rows import ROWS, Use

VERL_H20_PEAK = 148e12  # verl/utils/flops_counter.py:96 @c711dd741
# verl's 30B script's token budget of a micro-batch (`ppo_max_token_len_per_gpu`: prompt + response)
VERL_30B_MICRO_TOKENS = 2048 + 8192


def verl_flops(m: ModelArch, seqlens: np.ndarray) -> float:
    """FLOPs verl's counter credits an update over sequences of `seqlens` tokens (module
    docstring): `_estimate_deepseek_v3_flops` for an MLA model, `_estimate_qwen2_moe_flops`
    for a GQA one. Only MoE models (the doc's figures are of MoE runs)."""
    assert m.experts and m.expert_mlp, f"{m.name}: not an MoE model"
    h, layers = m.hidden, m.layers
    embed_head = 2 * m.vocab * h
    if m.mla:
        assert m.qk_nope_head_dim and m.qk_rope_head_dim and m.v_head_dim and m.kv_lora_rank
        qd = m.qk_nope_head_dim + m.qk_rope_head_dim
        attn = (h * m.q_lora_rank + m.heads * qd * m.q_lora_rank if m.q_lora_rank
                else h * m.heads * qd)
        attn += h * (m.kv_lora_rank + m.qk_rope_head_dim)
        attn += m.heads * (qd - m.qk_rope_head_dim + m.v_head_dim) * m.kv_lora_rank
        attn += m.heads * m.v_head_dim * h
        moe = h * m.experts + h * m.expert_mlp * (m.experts_per_token + m.shared_experts) * 3
        dense = h * m.mlp * 3
        per_token = ((moe + attn) * (layers - m.dense_layers) + (dense + attn) * m.dense_layers
                     + embed_head)
        score_dim = qd * m.heads
    else:
        hd = m.head_dim or h // m.heads
        attn = h * (2 * m.heads * hd + 2 * m.kv_heads * hd)
        moe = h * m.experts_per_token * m.expert_mlp * 3 + h * m.experts
        per_token = (moe + attn) * layers + embed_head
        score_dim = hd * m.heads
    s = seqlens.astype(np.float64)
    return float(6 * per_token * s.sum() + 12 * (s * s).sum() * score_dim * layers)


@dataclass(frozen=True)
class MfuCase:
    name: str
    job: str  # the published job whose model, batch and lengths the case prices
    nodes: int  # 8-GPU H20 nodes
    actor: Use
    micro_tokens: int  # the update's micro-batch token budget (0: the job's own)
    doc_mfu: float


def _30b(nodes: int, doc: float) -> MfuCase:
    return MfuCase(f"Qwen3-30B-A3B {8 * nodes}xH20 TP1 EP8", "r05-grpo30ba3b-128xh20-colocate.yaml",
                   nodes, Use("h20", tp=1, dp=8 * nodes, zero=1, offload=True, ep=8,
                              park_params=True, recompute=False),
                   VERL_30B_MICRO_TOKENS, doc)


_R11 = next(r for r in ROWS if r.name.startswith("r11"))
CASES = (_30b(1, 0.40), _30b(2, 0.37), _30b(4, 0.31),
         MfuCase("DeepSeek-V3 96xH20 TP8 PP12 EP8 (r11)", _R11.file, 12, _R11.layout[Role.ACTOR],
                 0, 0.19))


def price_case(case: MfuCase, calib: Calibration, seed: int) -> tuple[float, float]:
    """(the cost model's update seconds, the verl MFU they imply) for `case`."""
    with open(EXAMPLES / case.job) as fh:
        doc = yaml.safe_load(fh)
    for pool in doc["cluster"]["pools"]:
        if pool["device"] == "H20":
            pool["nodes"] = case.nodes
    if case.micro_tokens:
        budget = doc.setdefault("micro_token_budget", {})
        budget["update"] = case.micro_tokens
    res = resolve(job_from_dict(doc, case.job), case.job)
    update = _place(Pricer(res, calib), "actor", case.actor).stage_s["train"]
    batch = res.job.batch
    n = batch.prompts * batch.samples_per_prompt
    gen = np.random.default_rng(seed)
    seqlens = draw_lengths(res.job.lengths.prompt, gen, n) + draw_lengths(
        res.job.lengths.response, gen, n)
    flops = verl_flops(res.arch_of("actor"), seqlens)
    return update, flops / (update * VERL_H20_PEAK * 8 * case.nodes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workflows.moe_mfu", description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0, help="seed of the sequence lengths drawn")
    args = ap.parse_args(argv)
    print(f"{'case':44s} {'update s':>9s} {'model MFU':>9s} {'verl doc':>8s} {'doc/model':>9s}")
    for case in CASES:
        t, mfu = price_case(case, Calibration(), args.seed)
        print(f"{case.name:44s} {t:9.1f} {mfu:9.3f} {case.doc_mfu:8.2f} {case.doc_mfu / mfu:9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
