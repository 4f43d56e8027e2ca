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
             master weights; checkpoints and weight sync carry FP32, as without BF16).

`fp32` (the default of a `RunConfig` built by hand) is the exact reference the equality tests
compare layouts with: every layout then matches one process to float rounding.
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
