"""A vision-language model's vision encoder, and the image tokens it puts in every prompt.

A VLM (Qwen2.5-VL and the like) cuts each image into `patch_size` x `patch_size` patches
(`temporal_patch_size` frames deep), runs them through a ViT of `layers` blocks of width
`hidden` (attention, then a SwiGLU MLP of width `mlp`), and a merger folds every
`merge` x `merge` patches into one token of the language model's width (`out_hidden`). What the
language model sees is `tokens_per_image` tokens per image (after merging; the image processor's
resolution decides it: 448 x 448 pixels are 32 x 32 patches, 256 tokens), which take their
place in the prompt: they are prefilled, held in the KV cache and trained on like text tokens.

Parameter count (Qwen2.5-VL's modeling file, `Qwen2_5_VisionTransformerPretrainedModel`):
  patch embed   3 * temporal * patch^2 * h (a Conv3d, no bias)
  per block     2h (RMSNorms) + 3h^2 + 3h (qkv) + h^2 + h (proj) + 3 h mlp + 2 mlp + h (SwiGLU, biases)
  merger        h (norm) + (h m^2)^2 + h m^2 + h m^2 * out + out (two linears, m = merge)
FLOPs per image: 2 per weight per patch through the blocks, the patch embed and (per merged
token) the merger, plus the attention over an image's patches (4 P^2 h per layer, each image
attending to itself: Qwen2.5-VL's windowed layers attend less, so this is an upper bound).

The job's `lengths.images_per_prompt` says how many images a prompt carries; when the job is
resolved (`placer.spec.catalog.resolve`) the prompt length gains their tokens as its `offset`
(`with_image_tokens`), so every length the cost model and simulator draw already counts them.
"""
from __future__ import annotations

from pydantic import Field

from placer.spec.base import PosInt, Strict
from placer.spec.sections import Lengths


class VisionEncoder(Strict):
    """A ViT encoder and patch merger (config.json's `vision_config`; key in brackets)."""

    layers: PosInt = Field(description="ViT blocks [depth]")
    hidden: PosInt = Field(description="ViT width [hidden_size]")
    mlp: PosInt = Field(description="SwiGLU MLP width of a block [intermediate_size]")
    heads: PosInt = Field(description="attention heads [num_heads]")
    patch_size: PosInt = Field(description="patch side in pixels [patch_size]")
    temporal_patch_size: PosInt = Field(2, description="frames per patch [temporal_patch_size]")
    merge: PosInt = Field(2, description="patches merged per side into one token "
                                         "[spatial_merge_size]")
    out_hidden: PosInt = Field(description="the language model's width the merger projects to "
                                           "[out_hidden_size]")
    tokens_per_image: PosInt = Field(
        description="language-model tokens of one image after merging (the image processor's "
                    "resolution: 448 x 448 pixels with 14-pixel patches and 2 x 2 merging give "
                    "256)")

    @property
    def patches_per_image(self) -> int:
        return self.tokens_per_image * self.merge ** 2

    def params(self) -> int:
        h, f, m2 = self.hidden, self.mlp, self.merge ** 2
        block = 2 * h + 3 * h * h + 3 * h + h * h + h + 3 * h * f + 2 * f + h
        patch = 3 * self.temporal_patch_size * self.patch_size ** 2 * h
        merger = h + (h * m2) ** 2 + h * m2 + h * m2 * self.out_hidden + self.out_hidden
        return patch + self.layers * block + merger

    def flops_per_image(self) -> float:
        """Forward FLOPs of one image through the encoder and merger."""
        h, f, p, m2 = self.hidden, self.mlp, self.patches_per_image, self.merge ** 2
        block = 4 * h * h + 3 * h * f
        patch = 3 * self.temporal_patch_size * self.patch_size ** 2 * h
        merger = (h * m2) ** 2 + h * m2 * self.out_hidden
        linear = 2.0 * p * (patch + self.layers * block) + 2.0 * self.tokens_per_image * merger
        return linear + self.layers * 4.0 * p * p * h


def image_tokens(lengths: Lengths, vision: VisionEncoder | None) -> int:
    """Tokens the images of one prompt add to it (0 for a text-only job)."""
    n = lengths.images_per_prompt
    return n * vision.tokens_per_image if n and vision is not None else 0


def with_image_tokens(lengths: Lengths, vision: VisionEncoder | None) -> Lengths:
    """The lengths with the prompts' image tokens in `prompt.offset` (set, not added, so
    resolving a resolved job changes nothing); the lengths themselves when there are none."""
    extra = image_tokens(lengths, vision)
    if extra == 0 or lengths.prompt.offset == extra:
        return lengths
    return lengths.model_copy(update={"prompt": lengths.prompt.model_copy(
        update={"offset": float(extra)})})
