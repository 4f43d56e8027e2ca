"""The score and train stages of a step, and the checkpoints that training restarts from.

  score       rule or model reward (on the sandbox's results), reference log-probs (KL) and
              critic values (PPO); reference and critic work starts before the environment's
              (`dispatch_score`), so that the two overlap;
  advantages  GRPO: group-normalised rewards; PPO: GAE over the critic's values with a KL penalty;
  train       one optimizer step on each data-parallel trainer rank (gradients all-reduced over
              the process group `setup` forms), and the critic's step;
  checkpoint  every `checkpoint_every` steps: trainer and critic weights, the partial-rollout
              carry, and `latest.json` naming them (atomic files). `Checkpoints.restore` loads
              the last one into every training rank (none yet: version 0).
A training rank that fails raises `TrainingLost`: the loop restarts training from the last
checkpoint (`executors.recovery`).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import torch

from executors import rl
from executors.calls import Dispatcher
from executors.context import LoopContext, TrainingLost
from executors.runtime import Handle
from executors.stragglers import Call
from executors.tails import TailPolicies
from placer.fileio import atomic_write_text
from placer.roles import Role

Scored = dict[str, list[Any]]  # role -> per-sample values (rewards, log-probs, values)
EVENT_CAT = {Role.REWARD: "reward", Role.REFERENCE: "forward", Role.CRITIC: "forward"}


@dataclass
class ScoreJobs:
    """Scoring calls started ahead of the environment's: per role, the calls and handles."""

    t: float
    jobs: list[tuple[Role, list[Call]]]
    handles: list[list[Handle]]


class Training:
    """The trainer and critic ranks' work, and the reward and reference scoring before it."""

    def __init__(self, ctx: LoopContext, calls: Dispatcher) -> None:
        self.ctx, self.calls = ctx, calls

    def setup(self) -> None:
        """Form the trainers' process group (more than one data-parallel rank)."""
        rt, ranks = self.ctx.rt, self.ctx.by_role[Role.ACTOR]
        if len(ranks) > 1:
            addr, port = rt.results([rt.call(ranks[0], "rendezvous")])[0].value
            outs = rt.results([rt.call(m, "init_group", addr, port) for m in ranks])
            if not all(o.ok for o in outs):
                raise RuntimeError(f"trainer process group: {next(o.error for o in outs if not o.ok)}")

    def _score_jobs(self, s: rl.Samples) -> list[tuple[Role, list[Call]]]:
        """Reference log-probs and critic values: they need only the samples."""
        jobs: list[tuple[Role, list[Call]]] = []
        refs = self.ctx.workers(Role.REFERENCE)
        if refs:
            n = len(s.ids)
            jobs.append((Role.REFERENCE, [
                (m, "logprobs", (s.take(list(range(k * n // len(refs), (k + 1) * n // len(refs)))),))
                for k, m in enumerate(refs)]))
        critics = self.ctx.workers(Role.CRITIC)
        if critics:
            jobs.append((Role.CRITIC, [(critics[0], "values", (s,))]))
        return jobs

    def dispatch_score(self, s: rl.Samples) -> ScoreJobs:
        """Start reference and critic work now, so that it overlaps the environment's."""
        rt, jobs = self.ctx.rt, self._score_jobs(s)
        return ScoreJobs(time.time(), jobs,
                         [[rt.call(m, meth, *a) for m, meth, a in calls] for _, calls in jobs])

    def score(self, step: int, s: rl.Samples, results: list[dict[str, Any]], targets: list[int],
              started: ScoreJobs) -> Scored:
        """The reward (now) and the started scoring's values, per role."""
        ctx, out = self.ctx, {}
        reward: tuple[Role, list[Call]] = (
            Role.REWARD, [(ctx.by_role[Role.REWARD][0], "score", (s, results, targets))])
        handles: list[list[Handle] | None] = [None, *started.handles]
        for (role, calls), hs in zip([reward, *started.jobs], handles):
            try:
                vals = self.calls.call_all(calls, step, role, handles=hs).values
            except RuntimeError as e:
                if role == Role.CRITIC:
                    raise TrainingLost(str(e)) from None
                raise
            for (m, _, _), (_, timing) in zip(calls, vals):
                ctx.event(str(role), EVENT_CAT[role], timing["t0"], timing["dur"], m, step,
                          policy_version=s.version, sample_ids=timing["sample_ids"],
                          tokens=timing.get("tokens", 0))
            ctx.counters.role_s[role] += max(v[1]["dur"] for v in vals)
            out[str(role)] = [x for v in vals for x in v[0]]
        ctx.event("score", "stage", started.t, time.time() - started.t, None, step,
                  policy_version=s.version)
        return out

    def advantages(self, s: rl.Samples, scored: Scored
                   ) -> tuple[list[list[float]], dict[str, list[Any]]]:
        """Per-token advantages, and for PPO the critic's returns and values."""
        rewards = scored[Role.REWARD]
        cfg = self.ctx.cfg
        if cfg.algorithm != "ppo":
            adv = rl.grpo_advantages(rewards, s.group)
            return [[a] * len(r) for a, r in zip(adv, s.responses)], {}
        w = max(len(r) for r in s.responses)
        _, _, rmask = rl.pack(s)
        old = rl.to_padded(s.logprobs, w)
        ref = rl.to_padded(scored[Role.REFERENCE], w) if Role.REFERENCE in scored else old
        values = rl.to_padded(scored[Role.CRITIC], w)
        tok_r = -cfg.kl_coef * (old - ref) * rmask
        last = torch.tensor([len(r) - 1 for r in s.responses])
        tok_r[torch.arange(len(rewards)), last] += torch.tensor(rewards)
        gae, ret = rl.gae(tok_r, values, rmask)
        n = rmask.sum()
        mean = (gae * rmask).sum() / n
        std = (((gae - mean) ** 2 * rmask).sum() / n).sqrt()
        gae = (gae - mean) / (std + 1e-6) * rmask

        def rows(x: torch.Tensor) -> list[list[float]]:
            return [x[i, :len(r)].tolist() for i, r in enumerate(s.responses)]
        return rows(gae), {"returns": rows(ret), "values": scored[Role.CRITIC]}

    def train(self, step: int, s: rl.Samples, adv: list[list[float]],
              extra: dict[str, list[Any]], ref: list[list[float]] | None) -> float:
        """One optimizer step on every trainer rank (and the critic); the mean loss."""
        ctx, t = self.ctx, time.time()
        ranks = ctx.by_role[Role.ACTOR]
        calls: list[Call] = []
        total = s.generated_tokens()
        for k, m in enumerate(ranks):
            idx = list(range(k * len(s.ids) // len(ranks), (k + 1) * len(s.ids) // len(ranks)))
            calls.append((m, "train", (s.take(idx), [adv[i] for i in idx],
                                       [ref[i] for i in idx] if ref else None, total)))
        critics = ctx.workers(Role.CRITIC)
        if critics:
            calls.append((critics[0], "train", (s, extra["returns"], extra["values"])))
        handles = [ctx.rt.call(m, meth, *args) for m, meth, args in calls]
        self.calls.inject(step, Role.ACTOR)
        self.calls.inject(step, Role.CRITIC)
        outs = ctx.rt.results(handles)
        if not all(o.ok for o in outs):
            raise TrainingLost(next(o.error for o in outs if not o.ok))
        for (m, _, _), o in zip(calls, outs):
            info, timing = o.value
            ctx.event(f"train {m.role}", "train", timing["t0"], timing["dur"], m, step,
                      policy_version=info.get("version", step + 1), os_pid=timing.get("pid"),
                      sample_ids=timing["sample_ids"], tokens=timing["tokens"])
            ctx.counters.role_s[m.role] += timing["dur"]
        ctx.ledger.trained(step, [i for o in outs[:len(ranks)] for i in o.value[1]["sample_ids"]])
        ctx.event("train", "stage", t, time.time() - t, None, step, policy_version=step + 1)
        return float(sum(o.value[0]["loss"] for o in outs[:len(ranks)]) / len(ranks))


class Checkpoints:
    """Trainer and critic weights and the partial-rollout carry, every `checkpoint_every` steps;
    `last` is the step of the newest (-1: none yet)."""

    def __init__(self, ctx: LoopContext, tails: TailPolicies) -> None:
        self.ctx, self.tails = ctx, tails
        self.last = -1

    def due(self, step: int) -> bool:
        every = self.ctx.lc.checkpoint_every
        return bool(every) and (step + 1) % every == 0

    def save(self, step: int) -> None:
        ctx, t = self.ctx, time.time()
        d = ctx.lc.out_dir / "checkpoints"
        critics = ctx.workers(Role.CRITIC)
        handles = [ctx.rt.call(ctx.by_role[Role.ACTOR][0], "save",
                               str(d / f"actor-{step:06d}.pt"), step)]
        if critics:
            handles.append(ctx.rt.call(critics[0], "save", str(d / f"critic-{step:06d}.pt"), step))
        outs = ctx.rt.results(handles)
        if not all(o.ok for o in outs):
            raise TrainingLost(next(o.error for o in outs if not o.ok))
        carry = self.tails.save_carry(d, step) if self.tails.budget else None
        atomic_write_text(d / "latest.json", json.dumps(
            {"step": step, "actor": outs[0].value,
             "critic": outs[1].value if len(outs) > 1 else None, "carry": carry}))
        self.last = step
        ctx.event("checkpoint", "checkpoint", t, time.time() - t, None, step,
                  policy_version=step + 1)

    def restore(self) -> None:
        """Every trainer and critic rank loads the last checkpoint (none yet: version 0), and
        the tail policies their carry."""
        ctx = self.ctx
        if self.last < 0:
            self.tails.load_carry(None)
            return
        latest = json.loads((ctx.lc.out_dir / "checkpoints" / "latest.json").read_text())
        self.tails.load_carry(latest)
        rt = ctx.rt
        outs = rt.results([rt.call(m, "load", latest["actor"]) for m in ctx.by_role[Role.ACTOR]]
                          + [rt.call(m, "load", latest["critic"])
                             for m in ctx.workers(Role.CRITIC)])
        if not all(o.ok for o in outs):
            raise RuntimeError(f"reloading checkpoint failed: {[o.error for o in outs if not o.ok]}")
