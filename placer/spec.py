"""Job and cluster specifications: what the user writes in YAML, validated.

An RL post-training *job* names an algorithm (GRPO, PPO, RLOO), the models it trains and serves, the
batch, the length distributions of prompts and responses, an optional multi-turn environment, the
pipeline mode and the objective. A *cluster* is a set of *pools* of identical nodes plus the network
that joins them. Every model here is strict (unknown keys are errors) so that a typo never silently
falls back to a default; `load_job` turns validation failures into one `SpecError` that names the
field path and the bad value.

The *roles* an algorithm runs are derived here, not written by the user: see `Job.roles()`.
"""
from __future__ import annotations

import json
import math
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, model_validator

from placer.current import CurrentPlacement
from placer.distributions import Distribution  # also re-exported
from placer.fileio import atomic_write_text
from placer.inputs import SpecErrors, load_json, load_yaml, read_text
from placer.linear_attention import LinearAttention  # also re-exported
from placer.localdata import Dataset, anchor, expand_model_dirs
from placer.pins import Pins, check_pins
from placer.roles import Role
from placer.specbase import MAX_CONTEXT_TOKENS, PosFloat, PosInt, SpecError, Strict  # some re-exported


# ----------------------------------------------------------------------------------- hardware
class DeviceKind(StrEnum):
    gpu = "gpu"
    cpu = "cpu"
    lpu = "lpu"


class DeviceType(Strict):
    """One accelerator (or one CPU node for kind=cpu). Units: GB, TFLOP/s, GB/s, USD/hour."""

    name: str
    kind: DeviceKind
    memory_gb: PosFloat = Field(description="HBM, SRAM (lpu) or host RAM (cpu) per device")
    bf16_tflops: PosFloat = Field(description="peak dense BF16 (FP16 for LPUs)")
    fp8_tflops: PosFloat | None = Field(
        None, description="peak dense FP8 (Hopper and later); none: no FP8 tensor cores, so FP8 "
                          "options of the job do not apply on this device")
    mem_bw_gbs: PosFloat = Field(description="memory bandwidth per device")
    intra_link_gbs: PosFloat = Field(description="scale-up link per device, one direction")
    nic_gbs: PosFloat = Field(description="network bandwidth per device, one direction")
    can_train: StrictBool = False
    price_per_hour: Annotated[float, Field(strict=True, ge=0)] = 0.0
    cores: PosInt = Field(1, description="CPU cores per device (cpu kind)")
    host_memory_gb: PosFloat | None = Field(
        None, description="host RAM of one node of this device type, GB (placer/hostmem.py "
                          "checks offloaded state against it); none: not checked")
    memory_is_host: StrictBool = Field(
        False, description="its memory is the host's RAM (an emulated device whose work runs on "
                           "the CPU, a unified-memory part; always so for the cpu kind): "
                           "offloading state to the host or switching colocated roles moves "
                           "nothing, so neither is priced nor planned")
    source: str = ""

    @property
    def host_backed(self) -> bool:
        """Whether the device's memory is host RAM (`memory_is_host`, or a CPU)."""
        return self.memory_is_host or self.kind is DeviceKind.cpu

    @model_validator(mode="after")
    def _inference_only_lpu(self) -> DeviceType:
        if self.kind is DeviceKind.lpu and self.can_train:
            raise ValueError("an lpu is inference-only: can_train must be false")
        return self


# Counts that may be zero (a dense model has no experts); bounded like PosInt.
NonNegInt = Annotated[int, Field(strict=True, ge=0, le=1_000_000_000)]
_MOE_FIELDS = ("experts_per_token", "shared_experts", "expert_mlp", "dense_layers")
_MLA_FIELDS = ("q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")


class ModelArch(Strict):
    """A decoder-only transformer as its config.json describes it (Hugging Face key in brackets).

    Attention is GQA (Llama, Qwen: q/k/v/o projections, `kv_heads` key/value heads of `head_dim`)
    or, when `kv_lora_rank` is set, multi-head latent attention (MLA, DeepSeek-V2/V3: keys and
    values are rebuilt from one compressed latent per token, which is all the KV cache holds).
    The MLP is SwiGLU (gate, up, down: three matrices) in every layer, or, when `experts` > 0, a
    mixture of experts (MoE) after `dense_layers` leading dense layers: a router and `experts`
    routed SwiGLU experts of width `expert_mlp`, of which `experts_per_token` run per token, plus
    `shared_experts` that every token runs. RMSNorm before attention and MLP and at the end.
    A hybrid model (`linear_attention`, Qwen3-Next, Qwen3.5) runs one layer in `every` as full
    attention (the last of each group) and the rest as Gated DeltaNet linear attention, which
    keeps a fixed recurrent state per sequence instead of a KV cache (`placer.linear_attention`).

    Parameter counts (h hidden, L layers, V vocab; `params`, `active_params`, `matmul_params`):
      GQA attention   h*q + 2*h*kv + q*h with q = heads*head_dim, kv = kv_heads*head_dim
                      (+ q + 2*kv biases with `qkv_bias`, + 2*head_dim with `qk_norm`, + h*q
                      with `attn_output_gate`: q_proj also emits the output gate)
      MLA attention   q: h*r_q + r_q + r_q*heads*(d_nope + d_rope) (or h*heads*(d_nope + d_rope)
                      without a q rank); kv: h*(r_kv + d_rope) + r_kv + r_kv*heads*(d_nope + d_v);
                      o: heads*d_v*h (DeepSeek-V2 report, Liu et al. 2024, sec. 2.1.2; the
                      modeling_deepseek.py projections)
      dense MLP       3*h*mlp;   MoE layer  h*experts (router) + (experts + shared) * 3*h*expert_mlp
      GDN layer       `LinearAttention.params`, in place of attention in the linear layers
      per layer       + 2*h norms;   embeddings V*h, twice unless tied;   final norm h
    """

    name: str
    layers: PosInt = Field(description="[num_hidden_layers]")
    hidden: PosInt = Field(description="[hidden_size]")
    heads: PosInt = Field(description="query heads [num_attention_heads]")
    kv_heads: PosInt = Field(description="key/value heads [num_key_value_heads]")
    head_dim: PosInt | None = Field(
        None, description="per-head size [head_dim]; default hidden // heads (GQA only)")
    mlp: PosInt = Field(description="dense MLP intermediate size (SwiGLU: three matrices) "
                                    "[intermediate_size]; MoE models: their dense layers'")
    vocab: PosInt = Field(description="[vocab_size]")
    tie_embeddings: StrictBool = Field(
        False, description="one table for input embedding and LM head [tie_word_embeddings]")
    qkv_bias: StrictBool = False
    qk_norm: StrictBool = Field(False, description="RMSNorm over each head's q and k (Qwen3)")
    attn_output_gate: StrictBool = Field(
        False, description="gated attention: q_proj also emits a sigmoid gate over the attention "
                           "output, h*heads*head_dim more weights (Qwen3-Next, Qwen3.5) "
                           "[attn_output_gate]")
    linear_attention: LinearAttention | None = Field(
        None, description="hybrid model: Gated DeltaNet linear attention in all but one layer "
                          "in `every` (Qwen3-Next, Qwen3.5); none: full attention everywhere")
    # mixture of experts (all zero / None: a dense model)
    experts: NonNegInt = Field(0, description="routed experts [num_experts, n_routed_experts]")
    experts_per_token: NonNegInt = Field(0, description="[num_experts_per_tok]")
    shared_experts: NonNegInt = Field(0, description="always-on experts [n_shared_experts]")
    expert_mlp: PosInt | None = Field(None, description="one expert's intermediate size "
                                                        "[moe_intermediate_size]")
    dense_layers: NonNegInt = Field(0, description="leading layers with a dense MLP of `mlp` "
                                                   "[first_k_dense_replace]")
    # multi-head latent attention (all None: GQA)
    q_lora_rank: PosInt | None = None
    kv_lora_rank: PosInt | None = None
    qk_rope_head_dim: PosInt | None = None
    qk_nope_head_dim: PosInt | None = None
    v_head_dim: PosInt | None = None
    params_b: float | None = Field(None, description="published parameter count, billions")
    source: str = ""

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelArch:
        if self.head_dim is None and not self.mla and self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not divisible by heads {self.heads} "
                             "(give head_dim when the heads are not hidden / heads wide)")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads {self.heads} is not divisible by kv_heads {self.kv_heads}")
        la = self.linear_attention
        if la is not None and la.full_layers(self.layers) == 0:
            raise ValueError(f"linear_attention.every {la.every} > layers {self.layers} leaves no "
                             "full-attention layer")
        return self

    @model_validator(mode="after")
    def _moe_consistent(self) -> ModelArch:
        if not self.experts:
            given = [f for f in _MOE_FIELDS if getattr(self, f)]
            if given:
                raise ValueError(f"{', '.join(given)} need experts > 0 (a mixture of experts)")
            return self
        if not 1 <= self.experts_per_token <= self.experts:
            raise ValueError(f"experts_per_token must be between 1 and experts ({self.experts}), "
                             f"got {self.experts_per_token}")
        if self.expert_mlp is None:
            raise ValueError("a mixture of experts needs expert_mlp (moe_intermediate_size)")
        if self.dense_layers >= self.layers:
            raise ValueError(f"dense_layers {self.dense_layers} leaves no MoE layer of "
                             f"{self.layers}")
        return self

    @model_validator(mode="after")
    def _mla_consistent(self) -> ModelArch:
        if self.kv_lora_rank is None:
            given = [f for f in _MLA_FIELDS if getattr(self, f) is not None]
            if given:
                raise ValueError(f"{', '.join(given)} need kv_lora_rank (latent attention)")
            return self
        # q_lora_rank may be absent: smaller MLA models (DeepSeek-V2-Lite) project q directly
        missing = [f for f in _MLA_FIELDS[1:] if getattr(self, f) is None]
        if missing:
            raise ValueError(f"latent attention (kv_lora_rank) needs {', '.join(missing)}")
        if self.head_dim is not None or self.qkv_bias or self.qk_norm or self.attn_output_gate:
            raise ValueError("head_dim, qkv_bias, qk_norm and attn_output_gate apply to GQA "
                             "attention, not to latent attention (kv_lora_rank)")
        return self

    # ------------------------------------------------------------------------------- shape
    @property
    def mla(self) -> bool:
        """Multi-head latent attention (DeepSeek) rather than GQA."""
        return self.kv_lora_rank is not None

    @property
    def moe(self) -> bool:
        return self.experts > 0

    @property
    def head_size(self) -> int:
        """GQA per-head size: `head_dim`, or hidden // heads when not given (Llama, Qwen2.5)."""
        return self.head_dim if self.head_dim is not None else self.hidden // self.heads

    @property
    def full_attention_layers(self) -> int:
        """Layers with full attention and a KV cache: all of them, or one in `every` of a hybrid."""
        la = self.linear_attention
        return self.layers if la is None else la.full_layers(self.layers)

    @property
    def linear_layers(self) -> int:
        """Gated DeltaNet layers of a hybrid model (0 otherwise)."""
        return self.layers - self.full_attention_layers

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts (0 for a dense model)."""
        return self.layers - self.dense_layers if self.moe else 0

    def expert_params(self) -> int:
        """One SwiGLU expert: 3 * h * expert_mlp (0 for a dense model)."""
        return 3 * self.hidden * self.expert_mlp if self.expert_mlp else 0

    def attention_params(self) -> int:
        """One layer's attention projections (see the class docstring)."""
        h, a = self.hidden, self.heads
        if self.kv_lora_rank is not None:  # MLA; the validator set the three head sizes
            nope, rope = self.qk_nope_head_dim or 0, self.qk_rope_head_dim or 0
            dv = self.v_head_dim or 0
            rq, rkv = self.q_lora_rank, self.kv_lora_rank
            q = h * rq + rq + rq * a * (nope + rope) if rq else h * a * (nope + rope)
            kv = h * (rkv + rope) + rkv + rkv * a * (nope + dv)
            return q + kv + a * dv * h
        d = self.head_size
        q, kv = a * d, self.kv_heads * d
        return (h * q + 2 * h * kv + q * h + ((q + 2 * kv) if self.qkv_bias else 0)
                + (2 * d if self.qk_norm else 0) + (h * q if self.attn_output_gate else 0))

    def mixer_params(self) -> int:
        """Token-mixing parameters of all layers: attention in the full-attention layers, Gated
        DeltaNet (`LinearAttention.params`) in the linear ones."""
        la = self.linear_attention
        gdn = la.params(self.hidden) if la is not None else 0
        return self.full_attention_layers * self.attention_params() + self.linear_layers * gdn

    def linear_state_elements(self) -> tuple[int, int]:
        """(recurrent, convolution) state elements one sequence keeps over all GDN layers;
        (0, 0) without linear attention."""
        la = self.linear_attention
        if la is None:
            return 0, 0
        n = self.linear_layers
        return n * la.state_elements(), n * la.conv_state_elements()

    def linear_flops_per_token(self) -> int:
        """Forward FLOPs per token of the GDN layers' state update and readout over all layers
        (`LinearAttention.state_flops_per_token`); their projections are in `matmul_params`."""
        la = self.linear_attention
        return self.linear_layers * la.state_flops_per_token() if la is not None else 0

    def attention_width(self) -> float:
        """Per-layer attention FLOPs per (query, context) token pair, / 4: heads * (d_qk + d_v)
        / 2, which is h for standard heads (d_qk = d_v = h / heads), so the usual 4*h*s forward
        attention FLOPs per token and layer become 4 * width * s (QK^T 2*heads*d_qk*s, AV
        2*heads*d_v*s)."""
        if self.kv_lora_rank is not None:
            d_qk = (self.qk_nope_head_dim or 0) + (self.qk_rope_head_dim or 0)
            return self.heads * (d_qk + (self.v_head_dim or 0)) / 2
        return self.heads * self.head_size

    def embedding_params(self) -> int:
        """Input embedding and LM head: V*h each, once when tied."""
        return self.vocab * self.hidden * (1 if self.tie_embeddings else 2)

    # -------------------------------------------------------------------------- parameters
    def params(self) -> int:
        """Total parameters (memory, gradients, optimizer state, weight sync): every expert and
        both embedding tables (one when tied). The class docstring gives each term."""
        h = self.hidden
        moe_l = self.moe_layers
        dense_l = self.layers - moe_l
        router = h * self.experts
        moe = router + (self.experts + self.shared_experts) * self.expert_params()
        return (self.mixer_params() + self.layers * 2 * h + dense_l * 3 * h * self.mlp
                + moe_l * moe + self.embedding_params() + h)

    def active_params(self) -> int:
        """Parameters one token uses, as model cards publish "activated" counts (Qwen3-30B-A3B
        3.3B, DeepSeek-V3 37B): `params` less the routed experts it does not run (experts -
        experts_per_token per MoE layer); embeddings included. A dense model: `params`."""
        idle = self.moe_layers * (self.experts - self.experts_per_token) * self.expert_params()
        return self.params() - idle

    def matmul_params(self) -> int:
        """Parameters a token multiplies by, which the FLOP counts use (2 FLOPs each forward):
        `active_params` less the input embedding table, a gather of one row per token, not a
        matmul. A tied table stays: it is the LM head's matrix."""
        gather = 0 if self.tie_embeddings else self.vocab * self.hidden
        return self.active_params() - gather

    def expected_experts(self, tokens: float) -> float:
        """Distinct routed experts per MoE layer that `tokens` tokens hit: E * (1 - (1 - k/E)^T).

        Each token picks k of E experts; with balanced routing (the auxiliary load-balancing
        loss's target) an expert is missed by one token with probability 1 - k/E, by all T
        independently with (1 - k/E)^T. It is k at T = 1 and never above min(E, T*k). Skewed
        routing hits fewer experts, so this is the high side of what a decode step reads."""
        if not self.moe or tokens <= 0:
            return 0.0
        e, k = self.experts, self.experts_per_token
        return e * (1.0 - (1.0 - k / e) ** tokens)

    def decode_read_params(self, batch: float) -> float:
        """Parameters one decode step of `batch` sequences reads from memory: `matmul_params`
        with its k routed experts per MoE layer replaced by `expected_experts(batch)` (the
        input embedding rows gathered are negligible). A dense model reads `matmul_params`."""
        k, hit = self.experts_per_token, self.expected_experts(batch)
        return self.matmul_params() + self.moe_layers * (hit - k) * self.expert_params()

    # -------------------------------------------------------------------------------- KV cache
    def kv_elements_per_token(self) -> int:
        """Elements the KV cache holds per token over the full-attention layers (all of them
        unless hybrid: GDN layers keep a fixed state instead): 2 * kv_heads * head_dim per layer
        (keys and values); MLA keeps the compressed latent and the shared RoPE key,
        kv_lora_rank + qk_rope_head_dim per layer (DeepSeek-V2 report, sec. 2.1.2)."""
        n = self.full_attention_layers
        if self.kv_lora_rank is not None:
            return n * (self.kv_lora_rank + (self.qk_rope_head_dim or 0))
        return 2 * n * self.kv_heads * self.head_size

    def kv_tp_shards(self, tp: int) -> int:
        """Ways tensor parallelism splits the KV cache: by KV head for GQA, so at most
        kv_heads (vLLM and SGLang replicate a KV head over the ranks beyond that); MLA's latent
        is shared by every head, so each TP rank keeps all of it."""
        if self.kv_lora_rank is not None:
            return 1
        return max(min(tp, self.kv_heads), 1)


def _pool_schema(schema: dict[str, Any]) -> None:
    """JSON Schema of a pool: devices_per_node or cores_per_node (a CPU pool may give either)."""
    schema["required"] = [k for k in schema.get("required", []) if k != "devices_per_node"]
    schema["anyOf"] = [{"required": ["devices_per_node"]}, {"required": ["cores_per_node"]}]


class Pool(Strict):
    """A named set of identical nodes. A GPU or LPU pool counts accelerators per node; a CPU
    pool's device is a whole CPU of the device type's `cores` cores (cpu-node: a 64-core node),
    so it gives `cores_per_node`, or `devices_per_node` in those units (usually 1)."""

    name: str
    device: str = Field(description="device type name (catalog or job's own)")
    devices_per_node: PosInt = Field(
        description="accelerators per node (GPUs, LPU chips); for a CPU pool, devices of the "
                    "device type's `cores` cores each (usually 1), not cores: give cores_per_node "
                    "for those. Required unless a CPU pool gives cores_per_node")
    cores_per_node: PosInt | None = Field(
        None, description="CPU pools only: cores per node, a multiple of the device type's "
                          "`cores` (devices_per_node is derived from it)")
    nodes: PosInt
    nvlink_domain: PosInt | None = Field(
        None, description="devices sharing the scale-up link; default: one node")
    nodes_per_rack: PosInt = 32
    host_memory_gb: PosFloat | None = Field(
        None, description="host RAM per node, GB; default: the device type's host_memory_gb")

    model_config = ConfigDict(**Strict.model_config, json_schema_extra=_pool_schema)

    @model_validator(mode="wrap")
    @classmethod
    def _cores_only(cls, data: Any, handler: Any) -> Pool:
        """A CPU pool that gives only cores_per_node: devices_per_node is filled in once the
        device's cores are known (`placer.catalog.cpu_pools`); until then 1, not counted as given."""
        derive = (isinstance(data, dict) and "devices_per_node" not in data
                  and data.get("cores_per_node") is not None)
        pool: Pool = handler({**data, "devices_per_node": 1} if derive else data)
        if derive:
            pool.model_fields_set.discard("devices_per_node")
        return pool

    @property
    def devices_given(self) -> bool:
        """Whether the input gave devices_per_node (not derived from cores_per_node)."""
        return "devices_per_node" in self.model_fields_set


class Topology(Strict):
    """How pools are wired: racks under a spine; pools meet at the spine."""

    spine_gbs: PosFloat = Field(400.0, description="bisection per rack uplink, GB/s")
    cross_pool_gbs: PosFloat | None = Field(
        None, description="per-node bandwidth between two pools; default: the slower NIC side")
    latency_us: PosFloat = 5.0


# The planner, the simulator and the executor keep per-node and per-device records (bundles,
# placement groups, engines); a cluster beyond these sizes would not fit in memory, so it is refused
# when the job is read. They are two orders of magnitude above the largest example (1,024 nodes).
MAX_CLUSTER_NODES = 100_000
MAX_CLUSTER_DEVICES = 1_000_000


def check_cluster_size(pools: dict[str, tuple[int, int]]) -> None:
    """ValueError when the pools' (nodes, devices per node) exceed the sizes this tool handles."""
    nodes = sum(n for n, _ in pools.values())
    devices = sum(n * d for n, d in pools.values())
    if nodes > MAX_CLUSTER_NODES or devices > MAX_CLUSTER_DEVICES:
        raise ValueError(f"{nodes:,} nodes with {devices:,} devices in all exceed the "
                         f"{MAX_CLUSTER_NODES:,} nodes and {MAX_CLUSTER_DEVICES:,} devices this "
                         "tool plans, simulates and runs")


# Checkpoint storage as one job sees it: an assumption (a shared parallel filesystem or object
# store reached over the frontend network sustains a few GB/s for one job's writes), stated in
# the job format so that users give their own figure.
DEFAULT_STORAGE_GBS = 5.0


class Cluster(Strict):
    pools: list[Pool] = Field(min_length=1)
    topology: Topology = Topology()
    storage_gbs: PosFloat = Field(
        DEFAULT_STORAGE_GBS, description="checkpoint storage bandwidth (write and read) the job "
                                         "sees in all, GB/s")

    @model_validator(mode="after")
    def _unique_pools(self) -> Cluster:
        names = [p.name for p in self.pools]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"pool names must be unique, repeated: {sorted(dup)}")
        check_cluster_size({p.name: (p.nodes, p.devices_per_node) for p in self.pools})
        return self

    def pool(self, name: str) -> Pool:
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(name)


# ------------------------------------------------------------------------------------ the job
class Algorithm(StrEnum):
    grpo = "grpo"
    ppo = "ppo"
    rloo = "rloo"


class Models(Strict):
    policy: str
    reference: str | None = Field(None, description="frozen KL model; default: same as policy")
    reward: str = Field("rule", description="a model name, or 'rule' for a verifier on CPU")
    critic: str | None = Field(None, description="PPO only; default: same shape as reward/policy")
    use_reference: StrictBool = True
    paths: dict[str, str] = Field({}, description="local Hugging Face checkpoint folder per "
                                  "field (filled from `policy: {path: DIR}`; placer/localdata.py)")


class Batch(Strict):
    prompts: PosInt
    samples_per_prompt: PosInt = 1
    mini_batches: PosInt = Field(1, description="optimizer steps per iteration")

    @property
    def samples(self) -> int:
        return self.prompts * self.samples_per_prompt


class Lengths(Strict):
    """Token counts, drawn per sample: the prompt once, the response once per turn."""

    prompt: Distribution = Field(description="prompt tokens of a sample (its first context)")
    response: Distribution = Field(
        description="response tokens PER TURN: a multi-turn sample generates `environment.turns` "
                    "of these (with tool outputs between them)")


class Environment(Strict):
    """Multi-turn tool use: after each turn but the last a tool call runs on a CPU pool."""

    kind: Literal["none", "tool", "code"] = "none"
    turns: Annotated[int, Field(strict=True, gt=0, le=10_000)] = 1  # estimates walk turns
    tool_latency_s: Distribution = Distribution(kind="fixed", value=1.0)
    cpu_per_call: PosFloat = 1.0
    tool_output_tokens: Annotated[int, Field(strict=True, ge=0, le=1_000_000_000)] = 0


class Pipeline(Strict):
    mode: Literal["sync", "async"] = "sync"
    max_staleness: Annotated[int, Field(strict=True, ge=0, le=1_000_000)] = 0

    @model_validator(mode="after")
    def _staleness(self) -> Pipeline:
        if self.mode == "async" and self.max_staleness < 1:
            raise ValueError("async mode needs max_staleness >= 1")
        return self


class TailPolicy(Strict):
    """How a step stops waiting on its slowest samples (issue 7); the simulator models each.

    none           wait for every sample and every tool call
    overprovision  generate ceil(n * (1 + fraction)) samples, keep the first n to finish and
                   abort the rest (the kept samples lean short: a known bias of the method)
    partial        cut a sample once it generated `token_budget` response tokens in this step;
                   the rest of it resumes next step (its context prefilled again) and counts there
    reissue        a tool call still running `deadline_s` after it started is issued again on
                   another core; the first copy to finish wins and frees both cores
    """

    kind: Literal["none", "overprovision", "partial", "reissue"] = "none"
    fraction: Annotated[float, Field(strict=True, gt=0, le=4)] | None = None
    token_budget: PosInt | None = None
    deadline_s: PosFloat | None = None

    @model_validator(mode="after")
    def _fields_match_kind(self) -> TailPolicy:
        need = {"none": None, "overprovision": "fraction", "partial": "token_budget",
                "reissue": "deadline_s"}[self.kind]
        for name in ("fraction", "token_budget", "deadline_s"):
            given = getattr(self, name) is not None
            if name == need and not given:
                raise ValueError(f"a {self.kind} tail policy needs {name}")
            if name != need and given:
                raise ValueError(f"{name} does not apply to a {self.kind} tail policy")
        return self


class Precision(Strict):
    """Optional FP8 number formats (default: BF16 everywhere). Each applies only on devices with
    FP8 tensor cores (`fp8_tflops`); elsewhere that role stays BF16."""

    rollout_weights: Literal["bf16", "fp8"] = Field(
        "bf16", description="weights of the rollout engines: fp8 halves their bytes (memory and "
        "the weights a decode step reads) and runs their GEMMs at the FP8 peak (vLLM/SGLang FP8 "
        "W8A8 rollout, verl docs/advance/fp8.md); the weight sync still sends BF16")
    kv_cache: Literal["bf16", "fp8"] = Field(
        "bf16", description="the rollout engines' KV cache: fp8 halves its bytes per token "
        "(vLLM kv_cache_dtype=fp8): more sequences at once, less to read per decode step")
    training: Literal["bf16", "fp8"] = Field(
        "bf16", description="training GEMMs in FP8 (Transformer Engine; DeepSeek-V3's FP8 "
        "training): the FP8 peak for matmul FLOPs; weights, gradients and optimizer state keep "
        "their BF16/FP32 bytes")


class Catalog(Strict):
    devices: list[DeviceType] = []
    models: list[ModelArch] = []


class Job(Strict):
    name: str = "job"
    algorithm: Algorithm
    models: Models
    batch: Batch
    lengths: Lengths
    environment: Environment = Environment()
    pipeline: Pipeline = Pipeline()
    objective: Literal["time", "cost"] = "time"
    tail_policy: TailPolicy = TailPolicy()
    precision: Precision = Field(Precision(), description="optional FP8 formats (Precision)")
    cluster: Cluster
    catalog: Catalog = Catalog()
    seed: Annotated[int, Field(strict=True, ge=0, le=2**63)] = 0
    data: Dataset | None = Field(None, description="JSONL or Parquet prompts with answers or "
                                 "unit tests (the executor's math or code reward; "
                                 "placer/localdata.py)")
    current: CurrentPlacement | None = Field(
        None, description="the placement the job runs today (placer import); placer compare "
                          "prices it as the baseline `current`")
    pin: Pins | None = Field(
        None, description="per-role layout pins the planner keeps to, e.g. {actor: {tp: 2, "
                          "dp: 2}} (placer/pins.py)")

    def roles(self) -> list[Role]:
        """Roles the algorithm runs, in a stable order."""
        out = [Role.ACTOR, Role.ROLLOUT]
        if self.models.use_reference:
            out.append(Role.REFERENCE)
        out.append(Role.REWARD)
        if self.algorithm is Algorithm.ppo:
            out.append(Role.CRITIC)
        if self.environment.kind != "none":
            out.append(Role.ENVIRONMENT)
        return out

    def max_context_float(self) -> float:
        """Longest context a sample reaches: prompt + all turns' responses and tool outputs."""
        env = self.environment
        return (self.lengths.prompt.max_value() + env.turns * self.lengths.response.max_value()
                + (env.turns - 1) * env.tool_output_tokens)

    @property
    def max_context(self) -> int:
        """`max_context_float` in whole tokens (finite: checked when the job is loaded)."""
        return int(self.max_context_float())


# ------------------------------------------------------------------------------------ loading
def read_structured(path: str | Path) -> dict[str, Any]:
    """YAML or JSON file to a dict, or SpecError naming the file (bounded and hostile-proof:
    `placer.inputs`)."""
    p = Path(path)
    text = read_text(p)
    data = load_json(text, str(p)) if p.suffix == ".json" else load_yaml(text, str(p))
    if data is None:
        raise SpecError(f"{p}: the file is empty (expected a mapping of keys)")
    if not isinstance(data, dict):
        raise SpecError(f"{p}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0]


def _shown(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _model_in(ann: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation such as `X`, `list[X]` or `X | None`."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in get_args(ann):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _keys_at(root: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys the model at `loc` (below `root`) accepts; [] when the path leaves the models."""
    cls: type[BaseModel] | None = root
    for part in loc:
        if isinstance(part, int):
            continue  # a list index: the element type is already `cls`
        field = cls.model_fields.get(part) if cls is not None else None
        cls = _model_in(field.annotation) if field is not None else None
        if cls is None:
            return []
    return list(cls.model_fields) if cls is not None else []  # the loop returned on None


def _error_line(e: Any, prefix: str, root: type[BaseModel] | None) -> str:
    """One pydantic error as `field.path: message (got value)`; `root` lists keys for a typo.
    Key names come from the input: the CLI escapes each line (`placer.inputs.error_lines`)."""
    loc = ".".join(str(x) for x in e["loc"]) or "(top level)"
    msg = " ".join(e["msg"].removeprefix("Value error, ").split())  # always one line
    got = e.get("input")
    # A missing key or a whole-object check has the enclosing mapping as its input: not a value.
    hide = got is None or (isinstance(got, dict) and e["type"] in ("missing", "value_error"))
    shown = "" if hide else f" (got {_shown(got)})"
    if e["type"] == "extra_forbidden":
        keys = _keys_at(root, e["loc"][:-1]) if root is not None else []
        msg, shown = "unknown key" + (f"; expected one of {', '.join(keys)}" if keys else ""), ""
    return f"{prefix}{loc}: {msg}{shown}"


def validation_lines(err: ValidationError, prefix: str = "",
                     root: type[BaseModel] | None = None) -> list[str]:
    """Every error of `err`, one line each (`_error_line`), in the order pydantic found them."""
    lines = [_error_line(e, prefix, root) for e in err.errors()]
    return list(dict.fromkeys(lines))  # one line per distinct mistake


def format_validation_error(err: ValidationError, prefix: str = "",
                            root: type[BaseModel] | None = None) -> str:
    """The first error as one line, with a count of the others (inputs other than jobs; a job
    reports every error: `job_from_dict`)."""
    lines = validation_lines(err, prefix, root)
    more = f" [+{len(lines) - 1} more]" if len(lines) > 1 else ""
    return lines[0] + more


def distributions(job: Job) -> list[tuple[str, Distribution]]:
    """Every distribution of a job with its field path."""
    return [("lengths.prompt", job.lengths.prompt), ("lengths.response", job.lengths.response),
            ("environment.tool_latency_s", job.environment.tool_latency_s)]


def _check_job(job: Job, source: str) -> list[str]:
    """Checks that need more than one field: replayed traces readable, contexts finite, tail
    policy budgets. Every failing check gives one line; [] when all pass."""
    out: list[str] = []
    for where, dist in distributions(job):
        if dist.kind != "empirical":
            continue
        try:
            dist.samples()
        except SpecError as e:
            out.append(f"{source}: {where}.path: {e}")
        except (OSError, UnicodeDecodeError) as e:
            out.append(f"{source}: {where}.path: cannot read {dist.path!r}: {_first_line(e)}")
    if out:  # the checks below draw on the distributions
        return out
    try:
        check_tail_policy(job, source)
    except SpecError as e:
        out.append(str(e))
    ctx = job.max_context_float()
    if not ctx <= MAX_CONTEXT_TOKENS:
        out.append(f"{source}: lengths: the longest context, prompt + turns x response + "
                   f"tool outputs, is {ctx:.3g} tokens, beyond {MAX_CONTEXT_TOKENS:,}")
    return out


def check_tail_policy(job: Job, source: str) -> None:
    """Budgets and deadlines below the mean would cut (or re-issue) the typical sample, not the
    tail: carried-over work would then grow every step (partial) or every call would run twice
    (reissue). Such a setting is an error, which also keeps the no-variance model unchanged."""
    tp, env = job.tail_policy, job.environment
    if tp.kind == "partial":
        # whole tokens per turn, as the simulator rounds a no-variance response
        mean = env.turns * math.ceil(job.lengths.response.mean_value())
        assert tp.token_budget is not None, "a partial tail policy has token_budget (validated)"
        if tp.token_budget < mean:
            raise SpecError(f"{source}: tail_policy.token_budget: below the mean response of a "
                            f"sample ({mean:.0f} tokens over {env.turns} turn(s)); carried-over "
                            f"work would grow every step (got {tp.token_budget})")
    if tp.kind == "reissue":
        if env.kind == "none" or env.turns < 2:
            raise SpecError(f"{source}: tail_policy.kind: reissue needs tool calls (an "
                            f"environment with turns >= 2) (got {tp.kind!r})")
        mean_s = env.tool_latency_s.mean_value()
        assert tp.deadline_s is not None, "a reissue tail policy has deadline_s (validated)"
        if tp.deadline_s < mean_s:
            raise SpecError(f"{source}: tail_policy.deadline_s: below the mean tool latency "
                            f"({mean_s:.3g} s); most calls would run twice (got {tp.deadline_s})")


def job_from_dict(data: dict[str, Any], source: str = "job") -> Job:
    """Validate a job; every mistake found is one line of one `SpecErrors` (field checks first,
    then, when the fields are sound, the checks across fields and the catalog's names)."""
    data = expand_model_dirs(data, source)  # models.<field>: {path: DIR} -> a catalog entry
    try:
        job = Job.model_validate(data)
    except ValidationError as e:
        raise SpecErrors(validation_lines(e, f"{source}: ", root=Job)) from None
    problems = _check_job(job, source) + check_pins(job, source)
    from placer.catalog import cpu_pools, devices_of, resolve  # lazy: the catalogs import this module
    try:
        resolve(job, source)  # checks the names
    except SpecErrors as e:
        problems += e.lines
    except SpecError as e:
        problems.append(str(e))
    job, more = cpu_pools(job, devices_of(job), source)
    problems += more
    if problems:
        raise SpecErrors(problems)
    return job


_DIST_PATHS = (("lengths", "prompt"), ("lengths", "response"), ("environment", "tool_latency_s"))


def _anchor_paths(data: dict[str, Any], base: Path) -> dict[str, Any]:
    """Empirical distributions' relative paths, made relative to the job file's folder."""
    out = dict(data)
    for section, key in _DIST_PATHS:
        sec = out.get(section)
        if not isinstance(sec, dict):
            continue
        dist = sec.get(key)
        if (isinstance(dist, dict) and dist.get("kind") == "empirical"
                and isinstance(dist.get("path"), str) and not Path(dist["path"]).is_absolute()):
            out[section] = {**sec, key: {**dist, "path": str(base / dist["path"])}}
    return out


def load_job(path: str | Path) -> Job:
    """Read and validate a job file (YAML or JSON); `cluster` may name a separate file."""
    raw = read_structured(path)
    if isinstance(raw, dict) and {"roles", "slots", "job"} <= raw.keys():
        raise SpecError(f"{path}: this is a plan, not a job file: pass the job it was made from "
                        f"(the plan's `job` section), or use a command that reads plans")
    data = anchor(_anchor_paths(raw, Path(path).parent), Path(path).parent)
    if isinstance(data.get("cluster"), str):
        cpath = Path(path).parent / data["cluster"]
        try:
            cluster = read_structured(cpath)
        except SpecError as e:
            raise SpecError(f"{path}: cluster: {e}") from None
        data = {**data, "cluster": cluster}
    return job_from_dict(data, str(path))


def dump_job(job: Job) -> dict[str, Any]:
    return job.model_dump(mode="json", exclude_defaults=False)


def save_job(job: Job, path: str | Path) -> None:
    """Write a job as YAML, or JSON when the name ends in .json (atomically)."""
    data = dump_job(job)
    text = (json.dumps(data, indent=2) + "\n" if Path(path).suffix == ".json"
            else yaml.safe_dump(data, sort_keys=False))
    atomic_write_text(path, text)
