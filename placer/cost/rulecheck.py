"""Time of a rule reward: the CPU checks of a step's samples, by the kind of check.

What the executor does (executors/loop.py `_verify`, executors/task.py, executors/roles.py):

  verify      a job with an environment runs each final answer as code first: one sandbox per
              environment worker (`EnvWorker.execute`, `Sandbox.run_batch`), its answers in
              turn, a forked child each;
  in process  the reward worker then checks each answer in its own process: a number compared
              (arithmetic) or a math answer's equivalence (sympy);
  code        a `data.reward: code` job runs no verify; its reward runs each answer once over
              its unit tests, one sandbox per answer, a few at a time (`CodeData.judge_all`).

Priced with three factors of the reward's device type (`Efficiency`): `sandbox_batch_s` per
sandbox started, `sandbox_sample_s` per answer run in a sandbox, `rule_reward_s` per in-process
check; the checks of n samples on c cores take ceil(n / c) rounds. The kinds are kept apart so
that a calibration fitted on one kind of job (code checked in a sandbox) does not price another
(math checked by sympy) with its figure: `placer.calibrate.fit_rule` fits each factor only from
the events of its own kind. Sources of the defaults: docs/cost-model.md.
"""
from __future__ import annotations

import math

from placer.cost.efficiency import Efficiency
from placer.spec.job import Job


def runs_code_reward(job: Job) -> bool:
    """Whether the reward runs every answer's unit tests in a sandbox (`data.reward: code`)."""
    return job.data is not None and job.data.reward == "code"


def verifies_in_sandbox(job: Job) -> bool:
    """Whether the answers run as code in the environment's sandbox before the reward (a job
    with an environment whose reward reads the results: every rule reward but code's)."""
    return job.environment.kind != "none" and not runs_code_reward(job)


def uses_sandbox(job: Job) -> bool:
    """Whether any of the job's rule-reward work runs in a sandbox."""
    return runs_code_reward(job) or verifies_in_sandbox(job)


def rule_reward_time(job: Job, samples: int, sandboxes: int, cores: int,
                     eff: Efficiency) -> float:
    """Seconds to check `samples` answers with the job's rule reward on `cores` CPU cores, with
    `sandboxes` verify batches at once (the environment's workers, at least one)."""
    return (sandbox_verify_time(job, samples, sandboxes, eff)
            + rule_check_time(job, samples, cores, eff))


def sandbox_verify_time(job: Job, samples: int, sandboxes: int, eff: Efficiency) -> float:
    """The verify part of `rule_reward_time`: the environment's sandbox running the answers as
    code (zero where the job has no verify), environment work whatever role is charged for it."""
    if not verifies_in_sandbox(job):
        return 0.0
    return eff.sandbox_batch_s + math.ceil(samples / max(sandboxes, 1)) * eff.sandbox_sample_s


def rule_check_time(job: Job, samples: int, cores: int, eff: Efficiency) -> float:
    """The reward's own part of `rule_reward_time`: its checks of every answer (a code reward's
    own sandboxes included: the reward worker runs them)."""
    rounds = math.ceil(samples / max(cores, 1))
    if runs_code_reward(job):  # one sandbox per answer: it starts, then runs the answer
        return rounds * (eff.sandbox_batch_s + eff.sandbox_sample_s)
    return rounds * eff.rule_reward_s
