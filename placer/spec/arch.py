"""Model architectures: a decoder-only transformer's shape, as its config.json gives it.

`ModelArch` is one catalog entry (placer/spec/catalog/models.yaml, or a job's `catalog.models`, or a
local checkpoint's config.json: placer/spec/localdata.py). Beyond validating that the shape is
consistent (GQA or latent attention, dense or mixture-of-experts MLP, full or hybrid linear
attention), it counts what the cost model prices from the shape: parameters (all, active per
token, multiplied per token), KV-cache elements per token, the recurrent state of linear
attention, and the experts a decode batch touches.

Part of the job model (`placer.spec.job`, which re-exports `ModelArch`).
"""
from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from typing import Annotated, Any, Self

from pydantic import Field, StrictBool, model_validator

from placer.spec.base import PosFloat, PosInt, Strict
from placer.spec.linear_attention import LinearAttention
from placer.spec.vision import VisionEncoder

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
    keeps a fixed recurrent state per sequence instead of a KV cache (`placer.spec.linear_attention`).

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
    vision: VisionEncoder | None = Field(
        None, description="a vision-language model's vision encoder [vision_config] "
                          "(placer/spec/vision.py); none: text only")
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
    params_b: PosFloat | None = Field(None, description="published parameter count, billions")
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
    @cached_property
    def param_counts(self) -> tuple[int, int, int]:
        """(`params`, `active_params`, `matmul_params`), computed once per model: every estimate
        asks for them (hundreds of thousands of times for a large cluster's cost table), and a
        frozen model's counts never change (`model_copy` with changes drops them)."""
        total = self._params()
        active = self._active_params(total)
        # a vision encoder's weights are held, trained and synced with the rest (and counted
        # as activated, as model cards count them), but a text token never multiplies by
        # them: their FLOPs are per image (`placer.cost.vision`)
        vis = self.vision.params() if self.vision is not None else 0
        return total + vis, active + vis, self._matmul_params(active)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy; one with changed fields counts its parameters again (pydantic copies the
        cached counts with the other attributes)."""
        out = super().model_copy(update=update, deep=deep)
        if update:
            out.__dict__.pop("param_counts", None)
        return out

    def params(self) -> int:
        """Total parameters (memory, gradients, optimizer state, weight sync): every expert and
        both embedding tables (one when tied). The class docstring gives each term."""
        return self.param_counts[0]

    def _params(self) -> int:
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
        return self.param_counts[1]

    def _active_params(self, total: int) -> int:
        idle = self.moe_layers * (self.experts - self.experts_per_token) * self.expert_params()
        return total - idle

    def matmul_params(self) -> int:
        """Parameters a token multiplies by, which the FLOP counts use (2 FLOPs each forward):
        `active_params` less the input embedding table, a gather of one row per token, not a
        matmul. A tied table stays: it is the LM head's matrix."""
        return self.param_counts[2]

    def _matmul_params(self, active: int) -> int:
        gather = 0 if self.tie_embeddings else self.vocab * self.hidden
        return active - gather

    def expected_experts(self, tokens: float) -> float:
        """Distinct routed experts per MoE layer that `tokens` tokens hit: E * (1 - (1 - k/E)^T).

        Each token picks k of E experts; with balanced routing (the auxiliary load-balancing
        loss's target) an expert is missed by one token with probability 1 - k/E, by all T
        independently with (1 - k/E)^T. It is k at T = 1 and never above min(E, T*k). Skewed
        routing hits fewer experts, so this is the high side of what a decode step reads."""
        if not self.moe or tokens <= 0:
            return 0.0
        e, k = self.experts, self.experts_per_token
        missed: float = (1.0 - k / e) ** tokens  # base >= 0 (k <= E): a real power
        return e * (1.0 - missed)

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



