"""Serving anchors: multi-node inference engines' published throughput beside the cost model's.

RL rollouts of large mixtures of experts run on the engines' multi-node layouts (wide expert
parallelism with data-parallel attention, `Parallel.attn_dp`), which the step-time rows of
`workflows.published` do not exercise. Each row here is one published serving benchmark whose
setup is stated well enough to price: the model and device (both in the shipped catalog), the
engine layout, the per-device batch (decode: running sequences; prefill: tokens per forward)
and the context. The prediction is one engine step on that layout (`generation.decode_step_time`
at batch x context KV tokens, or `generation.prefill_time`), turned into tokens/s per node.

Published figures left out, and why:
  - vLLM / llm-d wide EP, "2.2k tok/s per H200" (vLLM blog 2025-12-17, "vLLM Large Scale
    Serving: DeepSeek @ 2.2k tok/s/H200 with Wide-EP"): the text states neither the EP size,
    the batch per GPU nor the context (they are only in the figures), so it cannot be priced.
  - SGLang's TP16 baselines (the same LMSYS post: "up to 3.3x" prefill, "5.2x" decode): the
    baseline's batch and tokens per device are not stated.
  - DeepSeek's own profile (H800, EP128 decode) and NVIDIA's DeepSeek-R1 figures (TensorRT-LLM,
    FP4 on Blackwell): a device, a precision or an engine the catalog does not model.
What the model leaves out that these runs used: two-batch overlap (TBO / DBO, compute hidden
behind the all-to-alls), expert load imbalance after EPLB, and the redundant experts (EP72
holds 288 expert slots for 256 experts; the model splits the 256 evenly).
"""
from __future__ import annotations

from dataclasses import dataclass

from placer.cost.efficiency import Calibration
from placer.cost.generation import decode_step_time, kv_capacity_tokens, prefill_time
from placer.cost.sharding import Parallel
from placer.spec.catalog import shipped_devices, shipped_models

NODE = 8  # devices per node of every anchor below

_LMSYS = ("LMSYS blog 2025-05-05, 'Deploying DeepSeek with PD Disaggregation and Large-scale "
          "Expert Parallelism on 96 H100 GPUs' (lm-sys/lm-sys.github.io "
          "blog/2025-05-05-large-scale-ep.md @ 2db4e40), Evaluation, Profile Results")


@dataclass(frozen=True)
class ServingRow:
    """One serving benchmark: `phase` 'decode' (`batch` running sequences per device, each
    holding `context` KV tokens) or 'prefill' (`batch` new tokens per device per forward, in
    sequences of `context` tokens), on one engine replica of `par`; the published tokens/s
    per node of `NODE` devices."""

    name: str
    source: str
    model: str
    device: str
    par: Parallel
    phase: str
    batch: int
    context: int
    published_tok_s_node: float

    @property
    def published_s(self) -> float:
        """The published step's seconds: a step's tokens per node over the published rate."""
        return step_tokens_per_node(self) / self.published_tok_s_node


SERVING_ROWS: list[ServingRow] = [
    # Decode table: 9 nodes x 8 H100, EP72 with DP attention, batch 256 per device, KV cache
    # length 2,000: 22,282 tokens/s per node ("SGLang (Default)"). DeepSeek-V3's FP8 weights.
    ServingRow("SGLang DeepSeek-V3 decode EP72 9x8 H100", _LMSYS, "DeepSeek-V3", "H100-SXM",
               Parallel(tp=72, ep=72, attn_dp=72, fp8_weights=True), "decode", 256, 2000,
               22282.0),
    # Prefill table: 4 nodes x 8 H100 (EP32), 16,384 tokens per device, input length 4,096:
    # 50,302 tokens/s per node ("SGLang (Default)" expert distribution).
    ServingRow("SGLang DeepSeek-V3 prefill EP32 4x8 H100", _LMSYS, "DeepSeek-V3", "H100-SXM",
               Parallel(tp=32, ep=32, attn_dp=32, fp8_weights=True), "prefill", 16384, 4096,
               50302.0),
]


@dataclass(frozen=True)
class ServingPrediction:
    """A row's published and predicted step seconds and tokens/s per node; `fits`: whether the
    row's KV (decode: batch x context per device) fits the model's KV capacity."""

    name: str
    published_s: float
    predicted_s: float
    published_tok_s_node: float
    predicted_tok_s_node: float
    fits: bool


def step_tokens_per_node(row: ServingRow) -> int:
    """Tokens one engine step of the row produces (decode) or takes in (prefill) per node."""
    return row.batch * NODE


def predict_serving(row: ServingRow, calib: Calibration) -> ServingPrediction:
    """One engine step of the row's layout, and its tokens/s per node."""
    dev, m = shipped_devices()[row.device], shipped_models()[row.model]
    eff = calib.for_device(dev)
    devices = row.par.devices
    tokens = row.batch * devices  # over the replica
    if row.phase == "decode":
        t = decode_step_time(m, dev, row.par, tokens, tokens * row.context, eff)
        fits = kv_capacity_tokens(m, dev, row.par, eff) >= tokens * row.context
    else:
        t = prefill_time(m, dev, row.par, tokens, row.context, eff)
        fits = True
    per_node = step_tokens_per_node(row)
    return ServingPrediction(row.name, per_node / row.published_tok_s_node, t,
                             row.published_tok_s_node, per_node / t, fits)


def render_serving(rows: list[tuple[str, float, float]]) -> list[str]:
    """Text lines of (name, published step s, predicted step s): the step seconds, the error
    (predicted / published - 1) and tokens/s per node both ways."""
    per_node = {r.name: step_tokens_per_node(r) for r in SERVING_ROWS}
    lines = [f"{'serving step (s) / tokens/s per node':44s} {'published':>9s} {'predicted':>9s} "
             f"{'error':>6s}  {'tok/s/node':>10s} {'predicted':>9s}"]
    for name, pub, pred in rows:
        tok = per_node.get(name, 0)
        lines.append(f"{name:44s} {pub:9.4f} {pred:9.4f} {(pred / pub - 1) * 100:+5.0f}%  "
                     f"{tok / pub:10.0f} {tok / pred:9.0f}")
    return lines
