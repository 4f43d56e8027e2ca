"""A tiny vision-language policy: a random ViT and patch merger in front of the Llama-shaped LM.

The policy's architecture carries a vision encoder (`placer.spec.vision.VisionEncoder`, the
fields the cost model prices), and this module builds it as Qwen2.5-VL's modeling file lays it
out, at the job's sizes: a patch embedding (a linear map of each `temporal_patch_size` x
`patch_size` x `patch_size` RGB patch, no bias: Qwen's Conv3d with its stride equal to its
kernel), `layers` pre-norm blocks (RMSNorm, attention with q/k/v biases and 2-D rotary positions
over the image's patch grid, RMSNorm, a SwiGLU MLP with biases), and the merger (RMSNorm, then
two linears with a GELU between them folding each `merge` x `merge` window of patches into one
token of the LM's width). Its parameters are exactly `VisionEncoder.params()`.

Images enter the prompt as `image_token_id` placeholders (`images_per_prompt` x
`tokens_per_image` of them after the prompt's text, `image_slots`): the LM's embedding of every
placeholder is replaced by the encoder's output for its image (`VisionLlamaForCausalLM`), so the
encoder runs wherever the policy reads a prompt: the rollout's prefill, every log-prob pass
(reference, the trainer's old log-probs) and training, where gradients flow into it (its
weights are trained and synced with the LM's, as the cost model prices them; with the plan's
`recompute`, its blocks recompute their activations as the LM's layers do). The placeholder
is input-only: its logit is held at `MASKED_LOGIT`, so the policy never samples it.

Each image is random, drawn from the job's seed and its prompt (`image_pixels`: a generator
seeded with the seed, the prompt's text tokens and the image's index), so every process that
encodes a prompt draws the same pixels and only token ids cross Ray. The model logs each
encoding (`encodes`); workers hand the log back with their call's timing (`encoder_spans`) and
the driver writes one `encode` trace event per pass (no fitted factor prices it: the pass's own
event includes its time, as the cost model adds the encoder's FLOPs to the pass).
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from executors.sharding import recomputes
from placer.spec.arch import ModelArch
from placer.spec.vision import VisionEncoder

MASKED_LOGIT = -1e4  # the placeholder's logit: never sampled, and finite (entropy stays a number)
IMAGE_SEED = 53  # the images' stream: the job's seed plus this


def image_token_id(arch: ModelArch) -> int:
    """The placeholder id: the vocabulary's last (beyond the executor's 74 text symbols)."""
    return arch.vocab - 1


def grid(v: VisionEncoder) -> int:
    """Merged tokens per image side (an image is a square of `grid * merge` patches a side)."""
    g = math.isqrt(v.tokens_per_image)
    if g * g != v.tokens_per_image:
        raise ValueError(f"vision.tokens_per_image {v.tokens_per_image} is not a square: the "
                         "executor's images are square grids of merged tokens")
    return g


def image_side(v: VisionEncoder) -> int:
    """Pixels a side of one image."""
    return grid(v) * v.merge * v.patch_size


def image_pixels(seed: int, key: list[int], index: int, v: VisionEncoder) -> torch.Tensor:
    """Image `index` of the prompt whose text tokens are `key`: [3, side, side] in [0, 1),
    from a generator of (seed, key, index), the same in every process."""
    raw = json.dumps([seed + IMAGE_SEED, key, index]).encode()
    g = torch.Generator().manual_seed(int.from_bytes(hashlib.blake2b(raw, digest_size=8)
                                                     .digest(), "little") % 2**63)
    side = image_side(v)
    return torch.rand(3, side, side, generator=g)


def patchify(pixels: torch.Tensor, v: VisionEncoder) -> tuple[torch.Tensor, torch.Tensor]:
    """([images, patches, 3 * temporal * patch^2] patch vectors, [patches, 2] (row, col) grid
    positions), patches in merge-window order (each window's `merge^2` patches together, as
    the merger folds them). A still image fills every frame of a temporal patch."""
    n, p, m, g, t = pixels.shape[0], v.patch_size, v.merge, grid(v), v.temporal_patch_size
    x = pixels.reshape(n, 3, g, m, p, g, m, p)  # c, window row, i, y, window col, j, x
    x = x.permute(0, 2, 5, 3, 6, 1, 4, 7)  # n, wr, wc, i, j, c, y, x
    x = x.unsqueeze(-3).expand(*x.shape[:-2], t, p, p)  # every frame the same
    rows = torch.arange(g).repeat_interleave(g)[:, None, None] * m + torch.arange(m)[:, None]
    cols = torch.arange(g).repeat(g)[:, None, None] * m + torch.arange(m)[None, :]
    pos = torch.stack([rows.expand(-1, m, m), cols.expand(-1, m, m)], -1).reshape(-1, 2)
    return x.reshape(n, g * g * m * m, 3 * t * p * p), pos


def rotary_2d(pos: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin ([patches, head_dim / 2]) of 2-D rotary positions: half the rotated pairs
    turn with the patch's row, half with its column."""
    quarter = head_dim // 4
    inv = 1.0 / (10000 ** (torch.arange(quarter, dtype=torch.float32) / max(quarter, 1)))
    ang = torch.cat([pos[:, :1].float() * inv, pos[:, 1:].float() * inv], -1)
    return ang.cos(), ang.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = cos.shape[-1]
    a, b, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos, rest], -1)


class VisionBlock(nn.Module):
    """Pre-norm ViT block: RMSNorm, attention (qkv and proj with biases), RMSNorm, SwiGLU."""

    def __init__(self, v: VisionEncoder) -> None:
        super().__init__()
        h = v.hidden
        self.heads = v.heads
        self.norm1, self.norm2 = nn.RMSNorm(h, eps=1e-6), nn.RMSNorm(h, eps=1e-6)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.gate_proj, self.up_proj = nn.Linear(h, v.mlp), nn.Linear(h, v.mlp)
        self.down_proj = nn.Linear(v.mlp, h)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        n, p, h = x.shape
        q, k, val = self.qkv(self.norm1(x)).reshape(n, p, 3, self.heads, -1).permute(
            2, 0, 3, 1, 4)  # each [n, heads, patches, head_dim]
        att = F.scaled_dot_product_attention(_rotate(q, cos, sin), _rotate(k, cos, sin), val)
        x = x + self.proj(att.transpose(1, 2).reshape(n, p, h))
        y = self.norm2(x)
        return x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))


class PatchMerger(nn.Module):
    """RMSNorm, then each window of merge^2 patches through two linears into one LM token."""

    def __init__(self, v: VisionEncoder) -> None:
        super().__init__()
        wide = v.hidden * v.merge ** 2
        self.ln_q = nn.RMSNorm(v.hidden, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(wide, wide), nn.GELU(), nn.Linear(wide, v.out_hidden))
        self.wide = wide

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.ln_q(x).reshape(x.shape[0], -1, self.wide))


class TinyViT(nn.Module):
    """Patch embedding, `layers` blocks and the merger: [images, 3, side, side] pixels ->
    [images, tokens_per_image, out_hidden]."""

    def __init__(self, v: VisionEncoder) -> None:
        super().__init__()
        if (v.hidden // v.heads) % 4 or v.hidden % v.heads:
            raise ValueError(f"vision: hidden {v.hidden} over {v.heads} heads must give a head "
                             "width divisible by 4 (2-D rotary positions)")
        self.spec = v
        self.patch_embed = nn.Linear(3 * v.temporal_patch_size * v.patch_size ** 2, v.hidden,
                                     bias=False)
        self.blocks = nn.ModuleList(VisionBlock(v) for _ in range(v.layers))
        self.merger = PatchMerger(v)
        self.recompute = False  # blocks keep only their inputs in training (the LM's layers do)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        patches, pos = patchify(pixels, self.spec)
        cos, sin = rotary_2d(pos, self.spec.hidden // self.spec.heads)
        x = self.patch_embed(patches.to(self.patch_embed.weight.dtype))
        for block in self.blocks:
            if self.recompute and torch.is_grad_enabled():
                from torch.utils.checkpoint import checkpoint  # lazy: training only
                x = checkpoint(block, x, cos, sin, use_reentrant=False)
            else:
                x = block(x, cos, sin)
        return self.merger(x)


def _vlm_class() -> Any:
    """`VisionLlamaForCausalLM`, defined on first use (transformers loads in ~2 s)."""
    from transformers import LlamaForCausalLM  # lazy: transformers only where a model is built

    class VisionLlamaForCausalLM(LlamaForCausalLM):
        """A Llama causal LM whose image placeholders are embedded by a `TinyViT`. The config
        carries `vision` (the encoder's fields), `image_token_id` and `image_seed`."""

        def __init__(self, config: Any) -> None:
            super().__init__(config)
            self.visual = TinyViT(VisionEncoder(**config.vision))
            self.encodes: list[dict[str, Any]] = []  # encodings since the last drain
            self.post_init()

        def embed_images(self, input_ids: torch.Tensor) -> torch.Tensor:
            """The LM's input embeddings with every placeholder's replaced by its image's
            token from the encoder (one encoder call for the batch's images)."""
            cfg, v = self.config, self.visual.spec
            emb = self.get_input_embeddings()(input_ids)
            slots = input_ids == cfg.image_token_id
            images: list[torch.Tensor] = []
            for row in range(input_ids.shape[0]):
                at = slots[row].nonzero().flatten()
                if at.numel() == 0:
                    continue
                if at.numel() % v.tokens_per_image:
                    raise ValueError(f"a row holds {at.numel()} image placeholders, not a "
                                     f"multiple of tokens_per_image {v.tokens_per_image}")
                key = [int(t) for t in input_ids[row, :int(at[0])] if int(t) != cfg.pad_token_id]
                images += [image_pixels(cfg.image_seed, key, k, v)
                           for k in range(at.numel() // v.tokens_per_image)]
            # the plan's recompute: the decoder layers' wrappers (`executors.sharding`) say it
            self.visual.recompute = self.training and recomputes(self)
            t0 = time.time()
            feats = self.visual(torch.stack(images).to(emb.device))
            self.encodes.append({"t0": t0, "dur": time.time() - t0, "images": len(images),
                                 "grad": torch.is_grad_enabled()})
            out = emb.clone()
            out[slots] = feats.reshape(-1, feats.shape[-1]).to(emb.dtype)
            return out

        def forward(self, input_ids: torch.Tensor | None = None,
                    attention_mask: torch.Tensor | None = None,
                    position_ids: torch.Tensor | None = None, cache: Any = None,
                    inputs_embeds: torch.Tensor | None = None, **kwargs: Any) -> Any:
            if (input_ids is not None and inputs_embeds is None
                    and bool((input_ids == self.config.image_token_id).any())):
                inputs_embeds, input_ids = self.embed_images(input_ids), None
            out = super().forward(input_ids=input_ids, attention_mask=attention_mask,
                                  position_ids=position_ids, cache=cache,
                                  inputs_embeds=inputs_embeds, **kwargs)
            out.logits = out.logits.index_fill(-1, torch.tensor(
                [self.config.image_token_id], device=out.logits.device), MASKED_LOGIT)
            return out

    return VisionLlamaForCausalLM


def build_vlm(arch: ModelArch, seed: int) -> nn.Module:
    """A random VLM of the architecture (its `vision` encoder and LM); the same seed gives the
    same weights and images."""
    from executors.model import llama_config  # lazy: transformers, as in `build_policy`
    assert arch.vision is not None, "a vision-language model has a vision encoder"
    grid(arch.vision)  # a square grid of tokens, or ValueError now
    cfg = llama_config(arch)
    cfg.vision = arch.vision.model_dump()
    cfg.image_token_id, cfg.image_seed = image_token_id(arch), seed
    torch.manual_seed(seed)
    model: nn.Module = _vlm_class()(cfg)
    model.eval()
    return model


def is_vlm_dir(path: str | Path) -> bool:
    """Whether the checkpoint folder holds a model built here with a vision encoder."""
    try:
        return "vision" in json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return False


def load_model(path: str | Path) -> nn.Module:
    """The policy in a checkpoint folder: a VLM built here, else `executors.model.load_policy`."""
    from executors.model import load_policy  # lazy: transformers only where a model loads
    if not is_vlm_dir(path):
        return load_policy(path)
    from transformers.utils import logging as hf_logging  # lazy: as above
    hf_logging.disable_progress_bar()
    model: nn.Module = _vlm_class().from_pretrained(path, dtype=torch.float32)
    model.eval()
    return model


def build_model(arch: ModelArch, seed: int) -> nn.Module:
    """The random version-0 policy of `arch`: a VLM when it has a vision encoder."""
    from executors.model import build_policy  # lazy: as above
    return build_vlm(arch, seed) if arch.vision is not None else build_policy(arch, seed)


def image_slots(arch: ModelArch, images_per_prompt: int) -> list[int]:
    """The placeholders a prompt ends with (none for a text-only policy or job)."""
    if arch.vision is None or images_per_prompt <= 0:
        return []
    return [image_token_id(arch)] * (images_per_prompt * arch.vision.tokens_per_image)


def encoder_spans(model: nn.Module) -> dict[str, list[dict[str, Any]]]:
    """The model's encodings since the last call (drained), as a timing entry: {"encodes":
    [...]} for a VLM that encoded, else {}."""
    log = getattr(model, "encodes", None)
    if not log:
        return {}
    out, log[:] = list(log), []
    return {"encodes": out}


def vision_problem(run: Any, backend: Any) -> str | None:
    """Why the executor cannot run the plan's vision-language policy as planned (None: it can,
    or the policy reads no images). `run`: the `executors.runplan.RunPlan`; `backend`: the
    rollout backend (`executors.backends.Backend`)."""
    job = run.job
    if job.policy.vision is None or job.images_per_prompt <= 0:
        return None
    if "policy" in job.paths:
        return (f"plan.job.models.paths.policy: {job.paths['policy']!r}: the executor builds "
                "vision-language policies from the architecture (models.policy with vision:), "
                "not from a checkpoint folder")
    if not backend.reads_images:
        return (f"--backend: {backend.name!r} engines here load text-only models; a "
                "vision-language policy runs on a backend that reads images (torch)")
    try:
        grid(job.policy.vision)
    except ValueError as e:
        return f"plan.job.models.policy: {job.policy.name}: {e}"
    pp = run.roles["actor"].layout.pp
    if pp > 1:
        return (f"plan.roles.actor: pp {pp}: the vision encoder runs with the embeddings on one "
                "stage; the executor trains a vision-language policy without pipeline stages "
                "(plan with pp 1)")
    return None


def record_encodes(event: Any, m: Any, step: int, timing: dict[str, Any], stage: str,
                   version: int | None) -> None:
    """One `encode` trace event per encoder run a worker's call reported (`encoder_spans`),
    on the worker's track: `event` is the loop's `LoopContext.event`; `stage` names the pass
    (rollout prefill, log-probs, training)."""
    for e in timing.get("encodes", ()):
        what = "old log-probs" if stage == "training" and not e["grad"] else stage
        event(f"encode ({what})", "encode", e["t0"], e["dur"], m, step, policy_version=version,
              images=e["images"], call=what)
