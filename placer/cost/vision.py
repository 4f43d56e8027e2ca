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

Host preparation (`host_prep_s`): a framework that hands its ranks the images as stored
(not yet patchified) has each rank run the image processor (decode, resize, normalize,
patchify) on the CPU inside the step, at `host_image_prep_s_per_patch` CPU seconds per patch
(one thread: a Ray rank's), serially before the rank's pass. Where the profile says
(`FrameworkProfile.host_image_prep`): on an engine replica, once per prompt it generates for
(`engine_prompts`), and on a trainer rank, once per distinct prompt of its chunk for the
whole step (`distinct_prompts`: the rank's samples are a length-balanced reorder of the
batch, so a prompt's group is spread over the ranks).
"""
from __future__ import annotations

from placer.base.roles import base_role
from placer.cost.efficiency import Efficiency
from placer.cost.roofline import GB, device_ceiling
from placer.cost.sharding import Parallel
from placer.spec.arch import ModelArch
from placer.spec.catalog import Resolved
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


def distinct_prompts(prompts: int, group: int, ranks: int) -> float:
    """Expected distinct prompts among one rank's 1 / `ranks` share of `prompts` x `group`
    samples when the batch is reordered across the ranks without regard to groups (EasyR1's
    `_balance_batch`, verl/trainer/ray_trainer.py: a length-balanced partition): a prompt is
    on the rank unless all of its `group` samples are elsewhere, (1 - 1 / ranks) ** group
    (never more than the rank's samples, prompts x group / ranks: Bernoulli's inequality)."""
    if prompts <= 0 or group <= 0:
        return 0.0
    return prompts * (1.0 - (1.0 - 1.0 / max(ranks, 1)) ** group)


def host_prep_s(m: ModelArch, prompts: float, images_per_prompt: int, eff: Efficiency) -> float:
    """CPU seconds one rank spends preparing `prompts` prompts' images on the host, one image
    processor run per image at `host_image_prep_s_per_patch`; 0 without a vision encoder,
    images or that rate."""
    if m.vision is None or images_per_prompt <= 0 or prompts <= 0:
        return 0.0
    patches = prompts * images_per_prompt * m.vision.patches_per_image
    return patches * eff.host_image_prep_s_per_patch


def engine_prompts(samples_per_replica: int, samples_per_prompt: int) -> int:
    """Prompts an engine replica generates for: its samples' prompts, each drawn
    `samples_per_prompt` times in one request (vLLM's SamplingParams.n)."""
    return -(-samples_per_replica // max(samples_per_prompt, 1))


def trainer_image_prep_s(res: Resolved, role: str, par: Parallel, eff: Efficiency) -> float:
    """Seconds a trainer rank prepares its chunk's images on the host each RL step, where the
    framework re-runs the image processor there (`FrameworkProfile.host_image_prep`: EasyR1's
    `_process_multi_modal_inputs`, verl/workers/fsdp_workers.py:503-548 @b44b311b, in the
    step's first pass on the rank and cached by uid for its others): once per distinct prompt
    of the rank's samples (`vision.distinct_prompts`). Priced with the update, the one pass
    every such step has."""
    if base_role(role) not in res.job.profile.host_image_prep:
        return 0.0
    b = res.job.batch
    seen = distinct_prompts(b.prompts, b.samples_per_prompt, par.dp)
    return host_prep_s(res.arch_of(role), seen, res.job.lengths.images_per_prompt, eff)
