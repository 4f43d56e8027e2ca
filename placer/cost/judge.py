"""A generative judge's decode queue: the reward model that reads and writes, priced like rollout.

A generative judge (`placer.spec.judge`, `reward_model: {kind: generative}`) gets every kept
sample of a step once its response is done. Each request is the sample's context plus the
rubric (a prefill of prompt + response + rubric tokens), then a verdict of the judge's own
length distribution (a decode). The judge's engine replicas batch the step's samples
continuously, admitting by KV exactly as a rollout engine does: the same scheduling loop
(`placer.cost.admission`, run by `run_replica`) and the same decode-step and prefill terms
(`placer.cost.batching.StepTerms`) on the judge's own model and layout. The stage lasts as long
as the busiest replica (samples are dealt round-robin).

The planner replays the busiest replica's share with the mean judged context and, of the
step's verdicts at evenly spaced quantiles of their distribution, every replicas-th one from the
top (the busiest replica is the one that drew the longest verdict, which ends the stage): one row
per request up to `JUDGE_LEVELS` of them, one row at the mean when the verdict does not vary.
The simulator replays the step's actual samples with drawn verdicts (`judge_queue_s`). With
every source of variance off the two are the same replay.

Not modelled: prefix caching of the shared rubric (vLLM would prefill it once per replica; here
every request prefills it), and streaming a sample to the judge before the rollout stage ends
(the stage runs after the policy's responses).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from placer.cost.admission import run_replica
from placer.cost.batching import StepTerms
from placer.cost.efficiency import Efficiency
from placer.cost.generation import lpu_chips, max_concurrency
from placer.cost.roofline import Memory, infer_memory, kv_bytes_per_token
from placer.cost.sharding import Parallel
from placer.cost.tail_samples import tokens, varies
from placer.spec.arch import ModelArch
from placer.spec.distributions import Distribution
from placer.spec.hardware import DeviceKind, DeviceType
from placer.spec.judge import RewardModel

JUDGE_LEVELS = 256  # most quantile rows of one replica's verdicts in the planner's replay


@dataclass(frozen=True)
class JudgeCost:
    """A judge layout's memory per device, its queue's seconds per step and its first wave (the
    requests an empty replica admits at once); `reason` says why it cannot run (then empty)."""

    memory: Memory
    seconds: float
    concurrency: int
    reason: str = ""


def judge_replicas(m: ModelArch, dev: DeviceType, par: Parallel, eff: Efficiency) -> int:
    """Engine replicas of a judge layout: DP on GPUs and CPUs, whole chip sets on LPUs."""
    if dev.kind is DeviceKind.lpu:
        return max(par.devices // lpu_chips(m, dev, eff), 1)
    return par.dp


def verdict_rows(verdict: Distribution, count: int, replicas: int = 1
                 ) -> tuple[list[int], list[int]]:
    """(verdict tokens, requests) rows for the busiest of `replicas` replicas, `count` requests
    each: of the step's count x replicas verdicts at evenly spaced quantiles, every replica-th
    one from the top (the busiest replica is the one that drew the longest), at most
    `JUDGE_LEVELS` rows, the longest last; one row at the mean when the verdict does not vary."""
    if count <= 0:
        return [], []
    if not varies(verdict):
        return [max(int(round(verdict.mean_value())), 1)], [count]
    g = min(count, JUDGE_LEVELS)
    levels = ((np.arange(g) + 1) * replicas - 0.5) / (g * replicas)
    base, extra = divmod(count, g)
    return tokens(verdict, levels).tolist(), [base + (1 if i < extra else 0) for i in range(g)]


def replica_span(st: StepTerms, prompts: list[int], verdicts: list[int], weights: list[int]
                 ) -> float:
    """Seconds one judge replica takes for its requests (row i: weights[i] requests of
    prompts[i] tokens decoding verdicts[i]), from idle; replays are kept on `st`."""
    if not prompts:
        return 0.0
    key = ("judge", tuple(prompts), tuple(verdicts), tuple(weights))

    def replay() -> float:
        done = run_replica(st, prompts, [[v] for v in verdicts], [[] for _ in prompts],
                           weights, 0)
        return max(t for t, _ in done)
    return st.remember(key, replay)


def judge_cost(st: StepTerms, m: ModelArch, dev: DeviceType, par: Parallel, eff: Efficiency,
               spec: RewardModel, samples: int, context: float, longest: float) -> JudgeCost:
    """The planner's price of a judge layout for `samples` requests of mean `context` tokens
    (the judged sample's; the rubric is added here); `longest` is the longest judged sample."""
    assert spec.verdict is not None, "a generative judge has a verdict distribution"
    reps = judge_replicas(m, dev, par, eff)
    if dev.kind is DeviceKind.lpu:
        chips = lpu_chips(m, dev, eff)
        if par.devices < chips:
            return JudgeCost(Memory(), 0.0, 0, f"{m.name} needs {chips} {dev.name} chips per "
                             f"judge replica to hold its weights in SRAM, got {par.devices}")
        mem = Memory(weights=m.params() * 2 / chips / 1e9)
    else:
        mem = infer_memory(m, par, dev, eff)
    need = int(math.ceil(longest + spec.rubric_tokens + spec.verdict.max_value()))
    if max_concurrency(m, dev, par, need, eff) < 1:
        return JudgeCost(mem, 0.0, 0, f"one {need}-token judge request (sample, rubric and "
                         f"longest verdict) needs {need * kv_bytes_per_token(m) / 1e9:.2f} GB "
                         f"of KV cache per replica; {dev.name} has too little left after "
                         f"{mem.total:.1f} GB of weights and engine per device")
    prompt = max(int(round(context + spec.rubric_tokens)), 1)
    verdicts, weights = verdict_rows(spec.verdict, math.ceil(samples / reps), reps)
    span = replica_span(st, [prompt] * len(verdicts), verdicts, weights)
    kv = mem.total if dev.kind is DeviceKind.lpu else dev.memory_gb * eff.kv_mem_fraction
    held = Memory(weights=mem.weights, overhead=mem.overhead, kv_cache=max(kv - mem.total, 0.0))
    return JudgeCost(held, span, st.kv.first_wave(prompt, math.ceil(samples / reps)))


def judge_queue_s(st: StepTerms, replicas: int, contexts: list[int], verdicts: list[int],
                  rubric: int) -> float:
    """The simulator's judge stage: the step's kept samples (final `contexts`, drawn
    `verdicts`) dealt round-robin over `replicas`, each replica's queue replayed sample by
    sample; the busiest replica's seconds."""
    spans = []
    for r in range(max(replicas, 1)):
        mine = range(r, len(contexts), max(replicas, 1))
        spans.append(replica_span(st, [contexts[i] + rubric for i in mine],
                                  [verdicts[i] for i in mine], [1] * len(mine)))
    return max(spans, default=0.0)
