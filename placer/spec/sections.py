"""The sections of a job file that describe the RL workload itself.

The algorithm (which decides the roles), the models each role runs, the batch, the token lengths
of prompts and responses, the multi-turn tool environment, the optional FP8 formats and the
framework's micro-batch token budgets and its inference engines' settings. The
cluster is in `placer.spec.hardware`, the model shapes in `placer.spec.arch`, the pipeline mode
in `placer.spec.pipeline`, the long-tail policy in `placer.spec.tailpolicy`; `placer.spec.job.Job`
puts them together and `placer.spec.load` runs the checks that span sections.
"""
from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field, StrictBool

from placer.spec.base import PosFloat, PosInt, Strict
from placer.spec.distributions import Distribution


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
                                  "field (filled from `policy: {path: DIR}`; placer/spec/localdata.py)")


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
    images_per_prompt: Annotated[int, Field(strict=True, ge=0, le=10_000)] = Field(
        0, description="images in every prompt (a vision-language policy: each adds its "
                       "vision encoder's tokens_per_image to the prompt and runs the encoder)")


class Environment(Strict):
    """Multi-turn tool use: after each turn but the last a tool call runs on a CPU pool."""

    kind: Literal["none", "tool", "code"] = "none"
    turns: Annotated[int, Field(strict=True, gt=0, le=10_000)] = 1  # estimates walk turns
    tool_latency_s: Distribution = Distribution(kind="fixed", value=1.0)
    cpu_per_call: PosFloat = 1.0
    tool_output_tokens: Annotated[int, Field(strict=True, ge=0, le=1_000_000_000)] = 0


class MicroTokenBudget(Strict):
    """Tokens per device in one micro-batch, as the framework's dynamic batching cuts them
    (verl's `log_prob_max_token_len_per_gpu` / `ppo_max_token_len_per_gpu`, EasyR1's
    `micro_batch_size_per_device_for_experience` / `_for_update` x the padded length). Each
    micro-batch runs its own collectives and, for a frozen model streamed from the host, copies
    its weights once (`placer.cost.offload.stream_time`). Unset: the cost model's default
    (`placer.cost.layercomm.MICRO_TOKENS`, verl's 16,384)."""

    forward: PosInt | None = Field(
        None, description="tokens per device per micro-batch of a forward-only pass (old "
                          "log-probs, reference, reward model)")
    update: PosInt | None = Field(
        None, description="tokens per device per micro-batch of a training pass")


class Validation(Strict):
    """A periodic validation pass inside the trainer's step: every `every` steps the rollout
    engines generate `samples` sequences of the job's lengths, with a weight refit before
    (verl's `_validate`, called inside its `step` timer on the steps `trainer.test_freq` picks:
    volcengine/verl @e2e4c35ec verl/trainer/ppo/ray_trainer.py:1137-1339; its generation enters
    the sharding manager, so it refits and wakes the engines as a training generation does).
    `samples` is what the engines generate, padding included: verl pads the validation batch to
    a multiple of its actor's world size (ray_trainer.py:687-693, `pad_dataproto_to_divisor`).
    The step price then holds its share, the pass / `every` (a mean over steps; the step that
    validates is that much longer). Unset: no validation is priced."""

    every: PosInt = Field(description="steps between validations (verl's trainer.test_freq)")
    samples: PosInt = Field(description="sequences one validation generates, padding included")


class EngineSettings(Strict):
    """What the run sets on its inference engines (vLLM's `gpu_memory_utilization` and
    `max_num_seqs`, SGLang's `mem_fraction_static` and `max_running_requests`): each replaces
    the calibration's factor of the same meaning (`Efficiency.kv_mem_fraction`,
    `Efficiency.max_num_seqs`) for every engine of the job, the rollout's and a generative
    judge's. Unset: the calibration's (0.9 and 1,024)."""

    memory_fraction: Annotated[float, Field(strict=True, gt=0, le=1)] | None = Field(
        None, description="the share of each device's memory an engine may take, its weights, "
                          "activations and KV cache together (vLLM gpu_memory_utilization); "
                          "what is left after the weights and the engine's own memory is its "
                          "KV pool")
    max_num_seqs: PosInt | None = Field(
        None, description="sequences one engine replica runs at once at most (vLLM "
                          "max_num_seqs)")

    def factors(self) -> dict[str, float]:
        """The calibration factors these settings replace (`Efficiency.override`)."""
        out: dict[str, float] = {}
        if self.memory_fraction is not None:
            out["kv_mem_fraction"] = float(self.memory_fraction)
        if self.max_num_seqs is not None:
            out["max_num_seqs"] = float(self.max_num_seqs)
        return out


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
