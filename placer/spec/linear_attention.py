"""Gated DeltaNet (GDN) linear-attention layers of a hybrid model (Qwen3-Next, Qwen3.5).

A hybrid decoder runs most of its layers as Gated DeltaNet (Yang et al. 2024, "Gated Delta
Networks"): instead of a KV cache that grows with the context, each layer keeps a fixed recurrent
state per sequence, one key_head_dim x value_head_dim matrix per value head, updated by the gated
delta rule once per token and read out by the query. One layer in `every` is full (gated)
attention and keeps a KV cache as usual: the last of each group of `every`, as Qwen3-Next's
`full_attention_interval` lays them out (transformers' Qwen3NextConfig: layer i is full attention
iff (i + 1) % interval == 0).

Shapes follow transformers' `Qwen3NextGatedDeltaNet` (models/qwen3_next/modeling_qwen3_next.py),
with key_dim = key_heads * key_head_dim, value_dim = value_heads * value_head_dim:
  in_proj_qkvz  h x (2 key_dim + 2 value_dim)   q, k, v and the output gate z
  in_proj_ba    h x 2 value_heads                the delta rule's beta and the decay's a
  conv1d        (2 key_dim + value_dim) x conv_kernel, depthwise over q, k, v, no bias
  dt_bias, A_log  value_heads each
  norm          value_head_dim (gated RMSNorm, shared by the heads)
  out_proj      value_dim x h
Qwen3.5 splits in_proj_qkvz / in_proj_ba into in_proj_qkv, in_proj_z, in_proj_b, in_proj_a (same
sizes). Per sequence an engine keeps, per GDN layer, the recurrent state (value_heads,
key_head_dim, value_head_dim) and the causal convolution's last conv_kernel - 1 inputs of each
of the 2 key_dim + value_dim channels (SGLang python/sglang/srt/configs/mamba_utils.py,
`Mamba2StateShape` and `mamba_cache_per_req`; vLLM `MambaStateShapeCalculator`).
"""
from __future__ import annotations

from pydantic import Field, model_validator

from placer.spec.base import PosInt, Strict


class LinearAttention(Strict):
    """Gated DeltaNet linear-attention layers (Hugging Face key in brackets): one layer in
    `every` is full attention, the last of each group [full_attention_interval]; the rest are
    Gated DeltaNet with a fixed recurrent state per sequence instead of a KV cache."""

    every: PosInt = Field(
        description="one layer in `every` is full attention, the last of each group "
                    "[full_attention_interval]; at least 2")
    key_heads: PosInt = Field(description="GDN query/key heads [linear_num_key_heads]")
    value_heads: PosInt = Field(description="GDN value heads, a multiple of key_heads "
                                            "[linear_num_value_heads]")
    key_head_dim: PosInt = Field(description="[linear_key_head_dim]")
    value_head_dim: PosInt = Field(description="[linear_value_head_dim]")
    conv_kernel: PosInt = Field(4, description="causal convolution width over q, k, v "
                                               "[linear_conv_kernel_dim]")

    @model_validator(mode="after")
    def _shape(self) -> LinearAttention:
        if self.every < 2:
            raise ValueError(f"every must be at least 2 (1 makes every layer full attention: "
                             f"leave linear_attention out), got {self.every}")
        if self.value_heads % self.key_heads:
            raise ValueError(f"value_heads {self.value_heads} is not a multiple of key_heads "
                             f"{self.key_heads} (each key head serves value_heads / key_heads "
                             "value heads)")
        return self

    # ---------------------------------------------------------------------------- layer plan
    def full_layers(self, layers: int) -> int:
        """Full-attention layers of `layers`: i with (i + 1) % every == 0."""
        return layers // self.every

    def linear_layers(self, layers: int) -> int:
        return layers - self.full_layers(layers)

    # ---------------------------------------------------------------------------- one layer
    @property
    def key_dim(self) -> int:
        return self.key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the causal convolution (and of its cached window): q, k and v."""
        return 2 * self.key_dim + self.value_dim

    def params(self, hidden: int) -> int:
        """One GDN layer's parameters (the module docstring lists the tensors)."""
        h, nv = hidden, self.value_heads
        return (h * (2 * self.key_dim + 2 * self.value_dim) + h * 2 * nv
                + self.conv_dim * self.conv_kernel + 2 * nv + self.value_head_dim
                + self.value_dim * h)

    def state_elements(self) -> int:
        """One layer's recurrent state per sequence: value_heads x key_head_dim x value_head_dim."""
        return self.value_heads * self.key_head_dim * self.value_head_dim

    def conv_state_elements(self) -> int:
        """One layer's cached convolution window per sequence: conv_dim x (conv_kernel - 1)."""
        return self.conv_dim * (self.conv_kernel - 1)

    def state_flops_per_token(self) -> int:
        """Forward FLOPs per token of one layer's gated delta rule beyond its projections: three
        products with each value head's key_head_dim x value_head_dim state, 2 FLOPs per state
        element each -- the delta rule's k^T S, the rank-one update S + k delta^T and the readout
        q^T S (transformers' torch_recurrent_gated_delta_rule; the decay is one more elementwise
        pass, left out). Linear in the context: no term grows with the sequence. The chunked
        form that training and prefill run (fla's chunk_gated_delta_rule, chunks of 64 tokens)
        adds intra-chunk products of O(64 * (key_head_dim + value_head_dim)) per token and
        head, also left out: with the projections (2 FLOPs per weight) they are < 1% of a
        Qwen3.5-27B token's FLOPs."""
        return 6 * self.state_elements()
