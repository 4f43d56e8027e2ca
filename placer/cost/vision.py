"""A vision encoder's share of each pass: its FLOPs per image and its activations.

A vision-language model (`placer.spec.vision`) runs its ViT over every image of a sample before
the language model sees the image's tokens. The tokens themselves are already in the prompt's
length (the resolved job's `lengths.prompt.offset`), so the language model's prefill, KV cache,
log-prob passes and training price them as text; what this module adds is the encoder's own
work, `flops_per_image` per image and pass:
  rollout     one forward per generated sample's images on its engine replica, before its
              first prefill (a replica encodes its share: ceil(samples / replicas) samples);
  forward     the log-prob passes (reference, old log-probs, a scalar reward or critic model
              that is a VLM): one forward per kept sample's images over the role's devices;
  training    the forward and backward (and the recomputed forward): 6 or 8 passes of
              weights x tokens FLOPs as the language model's `train_time` counts them.
Each runs at the same achievable fraction of peak as the pass it belongs to (`device_ceiling`
of `mfu_prefill`, `mfu_score`, `mfu_train`). Memory: the weights are in `ModelArch.params`
(held, trained and synced with the rest); a pass also holds one sample's patches' activations
(34 bytes per patch and hidden unit of a block, as the language model's one-layer rule; with
recomputation in training, the blocks' inputs: 2 bytes per patch, unit and block).
Not modelled: an engine's encoder cache shared by the samples of one prompt (each sample's
images are encoded), and the encoder's own collectives under tensor parallelism.
"""
from __future__ import annotations

from placer.cost.efficiency import Efficiency
from placer.cost.roofline import GB, device_ceiling
from placer.cost.sharding import Parallel
from placer.spec.arch import ModelArch
from placer.spec.hardware import DeviceType


def encode_seconds(m: ModelArch, dev: DeviceType, devices: int, images: float, passes: int,
                   ceiling: float, eff: Efficiency) -> float:
    """Seconds `devices` devices spend on `images` images for `passes` passes (2: a forward;
    weights x tokens FLOPs each, as `train_time` counts passes) at `ceiling`; 0 without a
    vision encoder."""
    if m.vision is None or images <= 0:
        return 0.0
    flops = images * m.vision.flops_per_image() * passes / 2
    rate = max(devices, 1) * dev.bf16_tflops * 1e12 * device_ceiling(ceiling, dev, eff)
    return flops / rate


def rollout_encode_s(m: ModelArch, dev: DeviceType, replica_devices: int, samples: int,
                     images_per_prompt: int, eff: Efficiency) -> float:
    """One engine replica's encoder seconds for its `samples` samples."""
    return encode_seconds(m, dev, replica_devices, samples * images_per_prompt, 2,
                          eff.mfu_prefill, eff)


def pass_encode_s(m: ModelArch, dev: DeviceType, par: Parallel, samples: int,
                  images_per_prompt: int, eff: Efficiency, train: bool = False) -> float:
    """A forward (or, `train`, a training) pass's encoder seconds for `samples` samples."""
    passes = (8 if par.recompute else 6) if train else 2
    ceiling = eff.mfu_train if train else eff.mfu_score
    return encode_seconds(m, dev, par.devices, samples * images_per_prompt, passes, ceiling,
                          eff)


def encoder_activation_gb(m: ModelArch, par: Parallel, images_per_prompt: int,
                          train: bool = False) -> float:
    """GB per device a pass holds for one sample's images (0 without images)."""
    v = m.vision
    if v is None or images_per_prompt <= 0:
        return 0.0
    units = images_per_prompt * v.patches_per_image * v.hidden
    per = 2.0 * v.layers if train and par.recompute else 34.0
    return units * per / max(par.tp, 1) / GB
