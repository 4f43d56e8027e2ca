"""The score and train stages of a step, and the checkpoints that training restarts from.

  score       rule or model reward (on the sandbox's results), reference log-probs (KL) and
              critic values (PPO); reference and critic work starts before the environment's
              (`dispatch_score`), so that the two overlap;
  advantages  GRPO: group-normalised rewards; PPO: GAE over the critic's values; the job's KL
              penalty here when it is in the reward (in the loss: the trainer's);
  train       the step's samples cut into the job's mini-batches (one optimizer step each), each
              cut over the trainer's data-parallel ranks and into micro-batches (`partition`);
              the ranks of the plan's layout train together (`executors.trainer`), and the
              critic takes its step;
  checkpoint  every `checkpoint_every` steps: trainer and critic weights, the partial-rollout
              carry, and `latest.json` naming them (atomic files). `Checkpoints.restore` loads
              the last one into every training rank (none yet: version 0).
A training rank that fails raises `TrainingLost`: the loop restarts training from the last
checkpoint (`executors.recovery`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from executors import rl
from executors.calls import Dispatcher
from executors.ckptindex import read_latest, write_latest
from executors.context import LoopContext, TrainingLost
from executors.judge import judge_calls, spans_of
from executors.runplan import Layout
from executors.runtime import Handle
from executors.stragglers import Call
from executors.tails import TailPolicies
from executors.task import Target
from executors.trainer import STATS, MiniBatch
from executors.vlm import record_encodes
from placer.base.roles import Role

Scored = dict[str, list[Any]]  # role -> per-sample values (rewards, log-probs, values)
EXACT = "exact"  # Scored key: a rule reward's per-sample verdict (exactly right), when it has one
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
        ranks = self.ctx.by_role[Role.ACTOR]
        if len(ranks) > 1:
            self._form_group(ranks, "trainer")
            self.probe_collectives(ranks)
        if len(self.critic_ranks()) > 1:  # a context-parallel critic (`executors.critic`)
            self._form_group(self.critic_ranks(), "critic")
        self.record_layouts()

    def _form_group(self, ranks: list[Any], what: str) -> None:
        rt = self.ctx.rt
        addr, port = rt.results([rt.call(ranks[0], "rendezvous")])[0].value
        outs = rt.results([rt.call(m, "init_group", addr, port) for m in ranks])
        if not all(o.ok for o in outs):
            raise RuntimeError(f"{what} process group: {next(o.error for o in outs if not o.ok)}")

    def critic_ranks(self) -> list[Any]:
        """The critic's working ranks: its CP group (the plan's critic cp, `executors.critic`)
        or its first rank; the others stand by."""
        critics = self.ctx.workers(Role.CRITIC)
        return critics[:self.ctx.cfg.critic_cp if len(critics) > 1 else 1]

    def probe_collectives(self, ranks: list[Any]) -> None:
        """Time the new group's collectives on every rank (`executors.collprobe`): one
        `collective` event per timed block of a kind and rank, which calibration fits
        `coll_base_s` and `gather_call_s` from."""
        rt = self.ctx.rt
        outs = rt.results([rt.call(m, "probe_collectives") for m in ranks])
        if not all(o.ok for o in outs):
            raise RuntimeError(f"collective probe: {next(o.error for o in outs if not o.ok)}")
        for m, o in zip(ranks, outs):
            for p in o.value:
                self.ctx.event(f"probe {p['collective']}", "collective", p["t0"], p["dur"], m, 0,
                               policy_version=0, collective=p["collective"], ranks=p["ranks"],
                               bytes=p["bytes"], calls=p["calls"])

    def record_layouts(self) -> None:
        """`metadata.executed_layout`: per role, the layout its workers report running; the
        trainer's read off its ranks' models (`executors.layoutread`), with each pipeline
        stage's decoder layers (`stage_layers`) from the stage's ranks."""
        rt, out = self.ctx.rt, {}
        judge = (Role.REWARD,) if self.ctx.cfg.judge is not None else ()
        for role in (Role.ACTOR, Role.CRITIC, Role.ROLLOUT, *judge):
            members = self.ctx.workers(role)
            if not members:
                continue
            asked = members if role == Role.ACTOR else members[:1]
            got = rt.results([rt.call(m, "executed_layout", len(members)) for m in asked])
            for i in [i for i, g in enumerate(got) if not g.ok]:
                # a worker still restarting from an earlier failure (a recovery's set-up runs
                # while a rollout Ray restarts may not be back): wait for it, ask once more
                try:
                    rt.wait_alive(asked[i])
                except Exception as e:  # it cannot come back
                    raise TrainingLost(str(got[i].error)) from e
                got[i] = rt.results([rt.call(asked[i], "executed_layout", len(members))])[0]
            if not all(g.ok for g in got):
                raise TrainingLost(next(g.error for g in got if not g.ok))
            out[str(role)] = got[0].value
            if role == Role.ACTOR:
                out[str(role)] = with_stages([g.value for g in got])
        self.ctx.trace.metadata["executed_layout"] = out

    def _score_jobs(self, s: rl.Samples) -> list[tuple[Role, list[Call]]]:
        """Reference log-probs and critic values: they need only the samples."""
        jobs: list[tuple[Role, list[Call]]] = []
        refs = self.ctx.workers(Role.REFERENCE)
        if refs:
            n = len(s.ids)
            jobs.append((Role.REFERENCE, [
                (m, "logprobs", (s.take(list(range(k * n // len(refs), (k + 1) * n // len(refs)))),))
                for k, m in enumerate(refs)]))
        critics = self.critic_ranks()
        if critics:
            jobs.append((Role.CRITIC, [(m, "values", (s,)) for m in critics]))
        return jobs

    def dispatch_score(self, s: rl.Samples) -> ScoreJobs:
        """Start reference and critic work now, so that it overlaps the environment's."""
        rt, jobs = self.ctx.rt, self._score_jobs(s)
        return ScoreJobs(time.time(), jobs,
                         [[rt.call(m, meth, *a) for m, meth, a in calls] for _, calls in jobs])

    def score(self, step: int, s: rl.Samples, results: list[dict[str, Any]], targets: list[Target],
              started: ScoreJobs) -> Scored:
        """The reward (now) and the started scoring's values, per role."""
        ctx, out = self.ctx, {}
        judges = ctx.workers(Role.REWARD) if ctx.cfg.judge is not None else []
        reward: tuple[Role, list[Call]] = (Role.REWARD, judge_calls(judges, s, results, targets)
                                           if judges else [(ctx.by_role[Role.REWARD][0], "score",
                                                            (s, results, targets))])
        handles: list[list[Handle] | None] = [None, *started.handles]
        for (role, calls), hs in zip([reward, *started.jobs], handles):
            try:
                vals = self.calls.call_all(calls, step, role, handles=hs).values
            except RuntimeError as e:
                if role == Role.CRITIC:
                    raise TrainingLost(str(e)) from None
                raise
            for (m, _, _), (_, timing) in zip(calls, vals):
                # a judge's call is two spans (its verdicts' generation, their reading)
                for cat, t0, dur, args in spans_of(timing, EVENT_CAT[role]):
                    ctx.event(str(role), cat, t0, dur, m, step, policy_version=s.version,
                              sample_ids=timing["sample_ids"], **args)
                record_encodes(ctx.event, m, step, timing, "log-probs", s.version)
            ctx.counters.busy(role, [(v[1]["t0"], v[1]["dur"]) for v in vals])
            # each of a CP critic's ranks returns the whole batch's values
            out[str(role)] = [x for v in (vals[:1] if role == Role.CRITIC else vals) for x in v[0]]
            if all(EXACT in v[1] for v in vals):  # a rule reward's verdicts: exact or not
                out[EXACT] = [x for v in vals for x in v[1][EXACT]]
        ctx.event("score", "stage", started.t, time.time() - started.t, None, step,
                  policy_version=s.version)
        return out

    def advantages(self, s: rl.Samples, scored: Scored
                   ) -> tuple[list[list[float]], dict[str, list[Any]]]:
        """Per-token advantages, and for PPO the critic's returns and values.

        The job's KL in the reward (`kl.in: reward`) is a per-token penalty at the rollout's
        log-probs: PPO's GAE reads it token by token, GRPO's group baseline its sum per
        sample. In the loss it is the trainer's (`rl.policy_loss`): never both."""
        rewards = list(scored[Role.REWARD])
        cfg = self.ctx.cfg
        w = max(max((len(r) for r in s.responses), default=1), 1)
        _, _, rmask = rl.pack(s)
        tok_r = torch.zeros_like(rmask)
        if Role.REFERENCE in scored and s.logprobs:
            tok_r = cfg.kl.reward_penalty(rl.to_padded(s.logprobs, w),
                                          rl.to_padded(scored[Role.REFERENCE], w), rmask)
        if cfg.algorithm != "ppo":
            pen = tok_r.sum(-1).tolist()
            adv = rl.grpo_advantages([r + p for r, p in zip(rewards, pen)], s.group)
            return [[a] * len(r) for a, r in zip(adv, s.responses)], {}
        values = rl.to_padded(scored[Role.CRITIC], w)
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
              extra: dict[str, list[Any]], ref: list[list[float]] | None
              ) -> tuple[float, dict[str, float]]:
        """The step's mini-batches on every trainer rank (and the critic's step); the loss and
        the trainer's statistics (`trainer_stats`)."""
        ctx, t = self.ctx, time.time()
        ranks = ctx.by_role[Role.ACTOR]
        # the run plan's layout, or one plain rank (the one-process runtime)
        layout = ctx.run.roles[Role.ACTOR].layout if len(ranks) > 1 else Layout()
        parts = partition(s, adv, ref, layout, ctx.cfg.mini_batches, ctx.cfg.accumulate)
        calls: list[Call] = [(m, "train", (part,)) for m, part in zip(ranks, parts)]
        calls += [(m, "train", (s, extra["returns"], extra["values"])) for m in self.critic_ranks()]
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
                      sample_ids=timing["sample_ids"], tokens=timing["tokens"],
                      gathers=int(m.role == Role.ACTOR and len(ranks) > 1))
            record_encodes(ctx.event, m, step, timing, "training", info.get("version", step + 1))
            ctx.counters.busy(m.role, [(timing["t0"], timing["dur"])])
        leaders = [o.value for k, o in enumerate(outs[:len(ranks)]) if layout.leads(k)]
        ctx.optimizer_steps += leaders[0][0]["optimizer_steps"]
        ctx.trace.metadata["optimizer_steps"] = ctx.optimizer_steps
        ctx.ledger.trained(step, list(dict.fromkeys(i for v in leaders for i in v[1]["sample_ids"])))
        ctx.event("train", "stage", t, time.time() - t, None, step, policy_version=step + 1)
        # Each DP group's loss is its share of every mini-batch's token mean: their sum is it.
        return float(sum(v[0]["loss"] for v in leaders)), trainer_stats([v[0] for v in leaders])


def with_stages(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Rank 0's read layout, its own stage's `layers` and `stage` replaced by every stage's
    decoder layers in stage order (`stage_layers`, from the first rank of each stage)."""
    stages: dict[int, list[int]] = {}
    for r in ranks:
        stages.setdefault(int(r["stage"]), list(r["layers"]))
    first = {k: v for k, v in ranks[0].items() if k not in ("layers", "stage")}
    return {**first, "stage_layers": [stages[p] for p in sorted(stages)]}


def trainer_stats(leaders: list[dict[str, Any]]) -> dict[str, float]:
    """The step's policy statistics from each DP group's leading rank: the token means of
    `STATS` (each group reports its share of the step's mean: they add up) and the mean over
    the step's optimizer steps of the gradient norm before clipping (global: every rank has
    the same)."""
    out = {k: float(sum(v.get(k, 0.0) for v in leaders)) for k in STATS}
    norms = leaders[0].get("grad_norms", []) if leaders else []
    out["grad_norm"] = float(sum(norms) / len(norms)) if norms else 0.0
    return out


def _split(xs: list[int], k: int) -> list[list[int]]:
    """`k` contiguous parts of `xs`, near-equal, possibly empty."""
    return [xs[j * len(xs) // k:(j + 1) * len(xs) // k] for j in range(k)]


def partition(s: rl.Samples, adv: list[list[float]], ref: list[list[float]] | None,
              layout: Layout, mini: int, accumulate: int) -> list[list[MiniBatch]]:
    """Per trainer rank, its part of every mini-batch as `accumulate` micro-batches.

    The step's samples are cut into `mini` mini-batches (one optimizer step each), each into
    `layout.dp` parts (the TP and CP ranks and pipeline stages of a DP group get the same part:
    the first stage reads its tokens, the last its targets, each CP rank cuts its slice of every
    sequence, `executors.cpattn`), each into `accumulate`
    micro-batches. A micro-batch's loss scale is 1 / (its mini-batch's generated tokens), so the
    gradients summed over micro-batches and DP ranks are the mini-batch's token-mean gradient; an
    empty micro-batch runs the mini-batch's first sample at scale 0 (collectives stay paired)."""
    gens = s.gen_mask or [[1] * len(r) for r in s.responses]
    out: list[list[MiniBatch]] = [[] for _ in range(layout.world)]
    for idx in rl.mini_batches(len(s.ids), mini):
        scale = 1.0 / max(sum(sum(gens[i]) for i in idx), 1)
        for d, part in enumerate(_split(idx, layout.dp)):
            micros: MiniBatch = []
            for chunk in _split(part, accumulate):
                use, w = (chunk, scale) if chunk else ([idx[0]], 0.0)
                micros.append((s.take(use), [adv[i] for i in use],
                               [ref[i] for i in use] if ref is not None else None, w))
            for p in range(layout.pp):  # a DP group's stages, CP and TP ranks: the same part
                for c in range(layout.cp):
                    for t in range(layout.tp):
                        out[layout.rank_of(p, d, c, t)].append(micros)
    return out


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
        # every trainer (and CP critic) rank joins the gather of its shards; rank 0 writes
        actors = ctx.by_role[Role.ACTOR]
        handles = [ctx.rt.call(m, "save", str(d / f"actor-{step:06d}.pt"), step) for m in actors]
        cp = ctx.cfg.critic_cp if len(critics) > 1 else 1
        handles += [ctx.rt.call(m, "save", str(d / f"critic-{step:06d}.pt"), step)
                    for m in critics[:cp]]
        outs = ctx.rt.results(handles)
        if not all(o.ok for o in outs):
            raise TrainingLost(next(o.error for o in outs if not o.ok))
        carry = self.tails.save_carry(d, step) if self.tails.budget else None
        write_latest(ctx.lc.out_dir, step, outs[0].value,
                     outs[len(actors)].value if critics else None, carry)
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
        latest = read_latest(ctx.lc.out_dir)
        self.tails.load_carry(latest)
        rt = ctx.rt
        outs = rt.results([rt.call(m, "load", latest["actor"]) for m in ctx.by_role[Role.ACTOR]]
                          + [rt.call(m, "load", latest["critic"])
                             for m in ctx.workers(Role.CRITIC)])
        if not all(o.ok for o in outs):
            raise RuntimeError(f"reloading checkpoint failed: {[o.error for o in outs if not o.ok]}")
