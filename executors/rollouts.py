"""A step's rollout: trajectories generated over rounds and turns (`RolloutDriver`).

A trajectory (`Traj`) is one sample: its prompt, then its response so far - the policy's turns
with the environment's tool outputs between them (`mask` 0 on tool tokens: they are context, not
trained on) - and the policy versions that generated it. A step's rollout runs in rounds; each
round shards the unfinished trajectories over the rollout workers, and each worker continues its
trajectories (context prefilled: prompt + response so far) until EOS, the per-turn cap
`max_new_tokens`, or what is left of the step's partial-rollout budget. Then, per trajectory:
  turn ended, turns left   the environment runs the turn's code in the sandbox (a tool call on
                           an environment worker; re-issued past its deadline under `reissue`)
                           and appends its output, at most `tool_output_tokens` tokens;
  turn ended, last turn    done;
  budget used up           cut (partial rollouts, `executors.tails`): carried to the next step.
A single-turn job without partial rollouts takes one round: generate, done.

A rollout split over pools (the plan's `roles.rollout.parts`, `executors.placement` puts each
part's engines on its pool) gets the plan's dispatch rule, the simulator's too
(`placer.cost.split.deal`): a step's trajectories are dealt to the parts in order as contiguous
ranges, part i taking `parts[i].samples` of the batch (group-aligned: GRPO groups stay whole),
extra ones (over-provisioning) by the same shares, and a step with fewer (a carried remainder,
a smaller batch) all by the shares, largest remainder first. A trajectory stays on its part for
every round and turn of the step; inside a part it is sharded over the part's engines as a
one-pool rollout's are over all of them.

The first round's calls start in `RolloutDriver.launch`, so that in async mode step s+1 generates
while step s scores and trains; the later rounds run in `RolloutDriver.collect`. Every sample has
a seed of its own and a continuation seed per resumption (`rl.resume_seed`): the same trajectory
whichever worker, shard or re-run generates it. `EnvironmentCalls` runs answers as code in the sandbox:
the tool calls between turns, and each final answer for the verifier.
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from executors import rl
from executors.calls import Dispatcher, Ran
from executors.context import LoopContext, TrainingLost
from executors.envpool import SharedEnvPool
from executors.model import prompt_ids
from executors.placement import Member
from executors.runtime import Handle
from executors.sandbox import clean_text
from executors.stragglers import Call
from executors.tails import TailPolicies, carry_steps, overprovision_extra
from executors.task import task_of
from executors.trajectory import Traj
from executors.vlm import image_slots, record_encodes
from executors.weights import WeightSync
from placer.base.roles import Role
from placer.cost.split import deal


def tool_text(result: dict[str, Any]) -> str:
    """What a tool call shows the policy: the value its code printed, or the failure; text any
    tokenizer encodes (the sandbox cleans it already; a result from elsewhere is cleaned too)."""
    return clean_text(f"={result.get('value', '')}" if result.get("status") == "ok" else
                      f"!{result.get('status', 'error')}")


@dataclass
class StepRollout:
    """A step's rollout in progress: its trajectories and the round in flight."""

    step: int
    trajs: list[Traj]
    held: list[Traj]  # finished in earlier steps, waiting for their group (partial)
    t: float  # when the step's rollout started
    keep: int  # the fresh samples the step trains (overprovision generates more)
    round: int = 0
    spent: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))  # this step
    cut: set[str] = field(default_factory=set)  # stopped by the step's token budget
    dropped: set[str] = field(default_factory=set)  # abandoned by overprovision
    calls: list[Call] = field(default_factory=list)  # the round's calls
    handles: list[Handle] | None = None  # None: overprovision starts them as a race
    part_of: dict[str, int] = field(default_factory=dict)  # split rollout: trajectory -> part


def _call_times(vals: list[dict[str, Any]], timing: dict[str, Any]) -> list[tuple[float, float]]:
    """(start, seconds) of each call of a worker's batch: the sandbox's own per-answer times;
    an answer without them (the sandbox failed as a whole, or timed out before it) gets an
    equal share of the batch's wall time, in order, so that its event still says how long the
    environment was busy (a zero would be skipped by the calibration and hide the time)."""
    share = float(timing["dur"]) / max(len(vals), 1)
    out = []
    for j, v in enumerate(vals):
        ts, dur = v.get("ts"), v.get("dur")
        if isinstance(ts, (int, float)) and isinstance(dur, (int, float)) and dur > 0:
            out.append((float(ts), float(dur)))
        else:
            out.append((float(timing["t0"]) + j * share, share))
    return out


class EnvironmentCalls:
    """Answers run as code in the sandbox, sharded over the free environment workers."""

    def __init__(self, ctx: LoopContext, calls: Dispatcher) -> None:
        self.ctx, self.calls = ctx, calls
        # a CPU pool shared with other jobs of a fleet (`executors.envpool`): its queue, and
        # this job's name there; None: the job's own environment workers
        self.shared: tuple[SharedEnvPool, str] | None = None

    def run(self, step: int, ids: list[str], answers: list[str], what: str,
            **per_sample: list[Any]) -> list[dict[str, Any]]:
        """Each answer's sandbox result; a `tool` event per sample (`what`: tool call or
        verify; `per_sample` values join each sample's event)."""
        ctx = self.ctx
        envs = (ctx.workers(Role.ENVIRONMENT) if self.shared is not None
                else ctx.busy.free(ctx.rt, ctx.workers(Role.ENVIRONMENT)))
        if not envs:
            return [{"status": "error", "error": "no environment"}] * len(answers)
        calls: list[Call] = []
        # one call per worker; on a shared pool, one per call of this job its cores run at
        # once (`SharedEnvPool.slots_of`)
        n = self.shared[0].slots_of(self.shared[1]) if self.shared is not None else len(envs)
        for k in range(n):
            sl = slice(k * len(answers) // n, (k + 1) * len(answers) // n)
            if answers[sl]:
                calls.append((envs[k % len(envs)], "execute", (ids[sl], answers[sl])))
        if self.shared is not None:  # queued with the other jobs' calls, served FCFS
            pool, job = self.shared
            got = pool.run(job, step, what, [c[2] for c in calls])
            ran = Ran([(v, t) for v, t, _ in got], [m for _, _, m in got])
        else:
            ran = self.calls.call_all(calls, step, Role.ENVIRONMENT)
        results: list[dict[str, Any]] = []
        at = {sid: i for i, sid in enumerate(ids)}
        for k, ((_, _, args), (vals, timing)) in enumerate(zip(calls, ran.values)):
            m = ran.workers[k]
            for sid, v, (ts, dur) in zip(args[0], vals, _call_times(vals, timing)):
                extra = {key: vs[at[sid]] for key, vs in per_sample.items()}
                ctx.event("tool", "tool", ts, dur, m, step, policy_version=None,
                          sample_ids=[sid], status=v.get("status"), call=what, **extra)
            results += vals
        ctx.counters.busy(Role.ENVIRONMENT, [(o[1]["t0"], o[1]["dur"]) for o in ran.values])
        return results


class RolloutDriver:
    """Launches, dispatches and collects a step's rollout: rounds, turns and tool calls, with
    the tail policy deciding what is cut, abandoned, carried and trained."""

    def __init__(self, ctx: LoopContext, calls: Dispatcher, tails: TailPolicies,
                 weights: WeightSync, env: EnvironmentCalls) -> None:
        self.ctx, self.calls, self.tails, self.weights, self.env = ctx, calls, tails, weights, env
        self.task = task_of(ctx.cfg.data)

    @property
    def turns(self) -> int:
        return self.ctx.job.turns if self.ctx.workers(Role.ENVIRONMENT) else 1

    def launch(self, step: int, fresh: bool = True) -> StepRollout:
        """Plan step `step`'s trajectories and start its first round. Partial rollouts resume
        carried trajectories first and fill the step with fresh prompts up to n samples, in
        whole groups; `fresh=False` is another round of carried ones only (no group complete)."""
        ctx, carry = self.ctx, self.tails.carry
        spp = ctx.job.samples_per_prompt
        n = ctx.job.prompts * spp
        resumed = [t for t in carry if not t.done] if self.tails.budget else []
        count = (n - len(resumed)) // spp if fresh else 0
        prompts = self.task.prompts(ctx.cfg.seed, step, count)
        # overprovision: ceil(n (1 + f)) samples, the extra ones spread over the prompts
        extra = overprovision_extra(ctx.job.tail_policy, len(prompts) * spp)
        slots = [(p, j) for j in range(spp) for p in prompts]
        slots += [(prompts[k % len(prompts)], spp + k // len(prompts)) for k in range(extra)]
        slots.sort(key=lambda x: (int(x[0].id.rsplit("p", 1)[1]), x[1]))
        images = image_slots(ctx.job.policy, ctx.job.images_per_prompt)  # a VLM's prompts
        new = [Traj(f"{p.id}.{j}", p.id, prompt_ids(ctx.cfg.codec, p.text) + images,
                    p.target, (ctx.cfg.seed * 1_000_003 + step * 100_003 + i) % 2**63)
               for i, (p, j) in enumerate(slots)]
        if fresh:
            ctx.ledger.plan(step, [t.id for t in new])
            ctx.ledger.carried_in(step, [t.id for t in carry])
        ctx.targets.update({t.id: t.target for t in new})
        r = StepRollout(step, resumed + new, [t for t in carry if t.done], time.time(),
                        len(new) - extra)
        self._dispatch(r)
        return r

    def _dispatch(self, r: StepRollout) -> None:
        """Start a round: every trajectory neither done, cut nor dropped, sharded over the
        rollout workers that hold the synced weights (`_shards`: per part when split)."""
        ctx, budget = self.ctx, self.tails.budget
        gone = r.cut | r.dropped
        active = [t for t in r.trajs if not t.done and t.id not in gone]
        calls: list[Call] = []
        for m, part in self._shards(r, active):
            limits = [ctx.cfg.max_new_tokens - t.turn_tokens for t in part]
            if budget:  # at least one token: a cut trajectory resumes mid-turn, never on a tool
                limits = [min(lim, max(budget - r.spent[t.id], 1))
                          for lim, t in zip(limits, part)]
            calls.append((m, "generate", ([t.id for t in part], [t.group for t in part],
                                          [t.prompt + t.response for t in part],
                                          [rl.resume_seed(t.seed, len(t.response)) for t in part],
                                          limits)))
        r.calls = calls
        # overprovision races single-turn shards (`TailPolicies.first_shards` starts them)
        race = self.tails.overprovision and self.turns == 1
        r.handles = None if race else [ctx.rt.call(m, meth, *a) for m, meth, a in calls]

    def _teams(self) -> list[list[Member]]:
        """The rollout engines per part of a split rollout; all of them as one team when the
        rollout is on one pool (or the runtime runs one engine for all: `LocalRuntime`)."""
        rollouts = self.ctx.by_role[Role.ROLLOUT]
        r = self.ctx.run.roles.get(Role.ROLLOUT)
        teams = [[m for m in rollouts if m.part == i] for i in range(len(r.parts) if r else 0)]
        return teams if len(teams) > 1 and all(teams) else [rollouts]

    def _shards(self, r: StepRollout, active: list[Traj]) -> list[tuple[Member, list[Traj]]]:
        """Each engine's trajectories for a round: per part (split) its dealt trajectories,
        contiguous chunks over the team's engines that hold the synced weights."""
        ctx, teams = self.ctx, self._teams()
        if len(teams) > 1 and not r.part_of:  # the step's first round: deal to the parts
            kept = [p.samples for p in ctx.run.roles[Role.ROLLOUT].parts]
            start = 0
            for i, count in enumerate(deal(len(r.trajs), kept)):
                r.part_of.update({t.id: i for t in r.trajs[start:start + count]})
                start += count
        out = []
        for i, team in enumerate(teams):
            mine = [t for t in active if r.part_of.get(t.id, 0) == i] if len(teams) > 1 else active
            # Engines still busy with a straggler's abandoned call get no new work this step.
            # (one freed since the sync still holds old weights: it waits for the next sync)
            workers = [m for m in team if ctx.known.get(m.rank) == ctx.synced] or team
            for k, m in enumerate(workers):
                chunk = mine[k * len(mine) // len(workers):(k + 1) * len(mine) // len(workers)]
                if chunk:
                    out.append((m, chunk))
        return out

    def record_layout(self) -> None:
        """A split rollout's `metadata.executed_layout`: per part, its pool and the layout its
        first engine reports running for the part's replicas (a one-pool rollout's entry is
        `Training.record_layouts`')."""
        teams, rt = self._teams(), self.ctx.rt
        if len(teams) < 2:
            return
        outs = rt.results([rt.call(team[0], "executed_layout", len(team)) for team in teams])
        bad = next((o.error for o in outs if not o.ok), None)
        if bad is not None:
            raise TrainingLost(bad)
        self.ctx.trace.metadata.setdefault("executed_layout", {})[str(Role.ROLLOUT)] = {
            "parts": [{"pool": team[0].bundle.pool, **o.value} for team, o in zip(teams, outs)]}

    def collect(self, r: StepRollout) -> rl.Samples:
        """Run the step's rounds to the end; the samples it trains."""
        step = r.step
        while r.calls:
            calls, handles = r.calls, r.handles
            if handles is None:
                calls, handles, dropped = self.tails.first_shards(step, calls, r.keep)
                r.dropped |= set(dropped)
            ran = self.calls.call_all(calls, step, Role.ROLLOUT,
                                      on_retry=self.weights.resync(step), handles=handles)
            self._check_versions(step, sorted({o[0].version for o in ran.values}))
            tools = self._absorb(r, calls, ran)
            if tools:
                self._tool_calls(step, tools)
            if self.turns > 1:
                r.dropped |= set(self.tails.overprovision_round(step, r.trajs, r.keep, r.dropped))
            r.round += 1
            self._dispatch(r)
        samples = self._settle(r)
        if samples is None:  # partial: no group is complete yet: another round on the carry
            self.ctx.event("partial: another round", "tail", time.time(), 0.0, None, step,
                           policy_version=None, sample_ids=[t.id for t in self.tails.carry])
            again = self.launch(step, fresh=False)
            again.t = r.t
            return self.collect(again)
        self._check_started(step, samples)
        self.ctx.event("rollout", "stage", r.t, time.time() - r.t, None, step,
                       policy_version=samples.version, sample_ids=samples.ids,
                       tokens=samples.tokens())
        if not self.ctx.lc.pipeline.overlaps_steps:  # no generation until the next refresh
            self.weights.sleep(r.step)
        return samples

    def _absorb(self, r: StepRollout, calls: list[Call], ran: Ran) -> list[Traj]:
        """Append a round's tokens to their trajectories; the ones whose turn ended with turns
        left (they need a tool call)."""
        ctx, step, by_id = self.ctx, r.step, {t.id: t for t in r.trajs}
        turns, cap, eos = self.turns, ctx.cfg.max_new_tokens, ctx.cfg.codec.eos
        tools = []
        for k, (s, timing) in enumerate(ran.values):
            ctx.ledger.generated(step, s.ids, rerun=k in ran.rerun)
            ctx.event("generate", "generate", timing["t0"], timing["dur"], ran.workers[k], step,
                      policy_version=s.version, sample_ids=s.ids, tokens=timing["tokens"],
                      batch=timing["batch"], os_pid=timing.get("pid"), round=r.round,
                      # per sample, aligned with sample_ids (traces/record.py, placer/calibrate/fit.py):
                      # the context prefilled and the tokens generated in this call; steps:
                      # lockstep decode runs until the longest ends
                      prompt_tokens=[len(p) for p in s.prompts],
                      response_tokens=[len(x) for x in s.responses],
                      steps=max((len(x) for x in s.responses), default=1))
            record_encodes(ctx.event, ran.workers[k], step, timing, "rollout prefill", s.version)
            for sid, new, lps in zip(s.ids, s.responses, s.logprobs):
                t = by_id[sid]
                t.response += new
                t.logprobs += lps
                t.mask += [1] * len(new)
                r.spent[sid] += len(new)
                t.version = s.version
                t.started = s.version if t.started is None else t.started
                if (new and new[-1] == eos) or t.turn_tokens >= cap:
                    if t.turn + 1 < turns:
                        tools.append(t)
                    else:
                        t.done, t.done_at = True, (r.round, k, len(t.response))
                else:  # stopped by the step's budget in mid-turn
                    r.cut.add(sid)
        ctx.counters.busy(Role.ROLLOUT, [(o[1]["t0"], o[1]["dur"]) for o in ran.values])
        return tools

    def _tool_calls(self, step: int, trajs: list[Traj]) -> None:
        """Run each ended turn's code in the sandbox; append the output for the next turn."""
        codec, room = self.ctx.cfg.codec, self.ctx.job.tool_output_tokens
        answers = [codec.decode(t.response[t.turn_start:]) for t in trajs]
        results = self.env.run(step, [t.id for t in trajs], answers, "tool call",
                               turn=[t.turn for t in trajs])
        for t, res in zip(trajs, results):
            out = codec.encode(tool_text(res))[:room]
            t.response += out
            t.logprobs += [0.0] * len(out)
            t.mask += [0] * len(out)
            t.turn, t.turn_start = t.turn + 1, len(t.response)

    def _settle(self, r: StepRollout) -> rl.Samples | None:
        """The samples this step trains: every trajectory (none), the first n done
        (overprovision), the finished ones of complete groups (partial: None when none)."""
        if self.tails.budget:
            return self.tails.settle_partial(r.step, r.trajs, r.held, r.cut)
        done = [t for t in r.trajs if t.done]
        if self.tails.overprovision and len(done) > r.keep:
            done = self.tails.keep_first(r.step, done, r.keep)
        order = {t.id: i for i, t in enumerate(r.trajs)}
        return rl.Samples.concat([t.as_samples() for t in sorted(done, key=lambda t: order[t.id])])

    def _check_versions(self, step: int, versions: list[int]) -> None:
        lc = self.ctx.lc
        for v in versions:
            lag = step - v
            ok = 0 <= lag <= lc.pipeline.staleness
            if not ok:
                raise RuntimeError(f"step {step}: samples from policy version {v} break the "
                                   f"{lc.mode} bound (staleness {lc.max_staleness})")

    def _check_started(self, step: int, s: rl.Samples) -> None:
        """Partial rollouts: a trained sample's first tokens may be older than the mode allows
        by the steps it was carried (`carry_steps`), never more."""
        lc = self.ctx.lc
        bound = lc.pipeline.staleness + carry_steps(
            self.ctx.job.tail_policy, self.ctx.cfg.max_new_tokens * self.turns)
        old = min(s.started, default=step)
        if step - old > bound:
            raise RuntimeError(f"step {step}: a sample started under policy version {old}, "
                               f"beyond the bound of {bound} steps")
