"""The trainer's number format: BF16 compute over FP32 master weights, or FP32 throughout.

The plan prices training in BF16 (`placer.spec.sections.Precision.training`; FP8 GEMMs need
Transformer Engine, which this executor does not run, so an FP8 plan trains in BF16 here). A
trainer in `bf16`:

  compute    every forward (and so its backward) runs under `torch.autocast(dtype=bfloat16)`:
             matmuls in BF16, reductions and the log-softmax in FP32 (`rl.scaled_logprobs`
             upcasts the logits), as Megatron's and verl's BF16 actors do;
  sharded    FSDP2 gathers parameters in BF16 and reduce-scatters gradients in FP32
             (`MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)`, verl's and
             torchtitan's default policy): the all-gather bytes the cost model prices;
  master     parameters, gradients and Adam's moments stay FP32 (the optimizer steps FP32
             master weights; checkpoints, the run's final weights among them, carry FP32:
             what a resumed run needs);
  refresh    a weight sync carries the engines' dtype, BF16 (`wire_dtype`): each sender casts
             every floating-point tensor to BF16 as it builds the bucket it is in
             (`executors.reshard.Stream`), and the engine loads the BF16 tensors into its own
             weights, casting to their dtype as vLLM's `load_weights` does. verl, NeMo-RL and
             Miles send the engine's dtype likewise (vLLM and SGLang run `dtype=bfloat16`),
             and the plan prices the sync at BF16 bytes (`placer.cost.roofline.weight_bytes`).
             An engine then holds the trainer's weights rounded to BF16 (`wire_state`), which
             is what the weights' digests compare
             (`executors.trainersync.TrainerSender.weights_digest`).

`fp32` (the default of a `RunConfig` built by hand) is the exact reference the equality tests
compare layouts with: every layout then matches one process to float rounding, and a refresh
carries FP32 (the engines then hold exactly the trainer's weights).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

PRECISIONS = ("fp32", "bf16")


def check(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"trainer precision {precision!r}: one of {', '.join(PRECISIONS)}")
    return precision


def of_job(training: str) -> str:
    """The trainer's format for the job's `precision.training` (bf16 | fp8): BF16 either way
    (FP8 GEMMs are not run by this executor; the weights and optimizer are the same)."""
    return "bf16" if training in ("bf16", "fp8") else check(training)


def compute_dtype(precision: str) -> torch.dtype:
    return torch.bfloat16 if check(precision) == "bf16" else torch.float32


@contextlib.contextmanager
def autocast(precision: str) -> Iterator[None]:
    """BF16 autocast on the trainer's device for `bf16`; nothing for `fp32`."""
    if check(precision) == "fp32":
        yield
        return
    kind = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.autocast(device_type=kind, dtype=torch.bfloat16):
        yield


def fsdp_policy(precision: str) -> Any:
    """FSDP2's mixed-precision policy (None: FSDP2's default, FP32 throughout)."""
    if check(precision) == "fp32":
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy  # lazy: distributed only
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def wire_dtype(precision: str) -> torch.dtype | None:
    """The dtype a weight refresh carries for a trainer in `precision`: BF16, the engines'
    (vLLM's and SGLang's `dtype=bfloat16`), for `bf16`; None (each tensor's own, FP32) for
    `fp32`."""
    return torch.bfloat16 if check(precision) == "bf16" else None


def to_wire(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """`t` as a refresh carries it: a floating-point tensor cast to `dtype` (None: as it is);
    integer tensors (none in these models, but a buffer may be) go as they are."""
    if dtype is None or not t.is_floating_point() or t.dtype == dtype:
        return t
    return t.to(dtype)


def wire_state(state: dict[str, torch.Tensor], dtype: torch.dtype | None
               ) -> dict[str, torch.Tensor]:
    """Every tensor of `state` as a refresh carries it (`to_wire`): the weights an engine holds
    after a refresh from them."""
    return {k: to_wire(v, dtype) for k, v in state.items()}


def wire_nbytes(state: dict[str, torch.Tensor], dtype: torch.dtype | None) -> int:
    """The bytes a refresh of `state` carries (`to_wire`), without casting anything."""
    def size(t: torch.Tensor) -> int:
        cast = dtype is not None and t.is_floating_point()
        return t.numel() * (torch.empty((), dtype=dtype).element_size() if cast
                            else t.element_size())
    return sum(size(t) for t in state.values())
