"""A step's rollout: trajectories generated over rounds and turns (a mixin of `executors.loop.Loop`).

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

The first round's calls start in `launch_rollout`, so that in async mode step s+1 generates while
step s scores and trains; the later rounds run in `collect_rollout`. Every sample has a seed of its
own and a continuation seed per resumption (`rl.resume_seed`): the same trajectory whichever
worker, shard or re-run generates it.
"""
from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from executors import rl
from executors.model import BOS, EOS, decode, encode
from executors.placement import Member
from executors.tails import carry_steps, overprovision_extra
from executors.task import make_prompts
from executors.trajectory import Traj


def tool_text(result: dict) -> str:
    """What a tool call shows the policy: the value its code printed, or the failure."""
    return f"={result.get('value', '')}" if result.get("status") == "ok" else \
        f"!{result.get('status', 'error')}"


class Rollouts:
    """Needs the Loop's job, cfg, rt, lc, ledger, carry, targets, known, synced, busy, by_role,
    `_call_all`, `_event` and the tail-policy helpers."""

    def _turns(self) -> int:
        return self.job.environment.turns if self.by_role.get("environment") else 1

    def launch_rollout(self, step: int, fresh: bool = True) -> dict[str, Any]:
        """Plan step `step`'s trajectories and start its first round. Partial rollouts resume
        carried trajectories first and fill the step with fresh prompts up to n samples, in
        whole groups; `fresh=False` is another round of carried ones only (no group complete)."""
        spp = self.job.batch.samples_per_prompt
        n = self.job.batch.prompts * spp
        budget = self._partial_budget()
        resumed = [t for t in self.carry if not t.done] if budget else []
        count = (n - len(resumed)) // spp if fresh else 0
        prompts = make_prompts(self.cfg.seed, step, count)
        # overprovision: ceil(n (1 + f)) samples, the extra ones spread over the prompts
        extra = overprovision_extra(self.job.tail_policy, len(prompts) * spp)
        slots = [(p, j) for j in range(spp) for p in prompts]
        slots += [(prompts[k % len(prompts)], spp + k // len(prompts)) for k in range(extra)]
        slots.sort(key=lambda x: (int(x[0].id.rsplit("p", 1)[1]), x[1]))
        new = [Traj(f"{p.id}.{j}", p.id, [BOS] + encode(p.text, self.cfg.arch["vocab"]),
                    p.target, (self.cfg.seed * 1_000_003 + step * 100_003 + i) % 2**63)
               for i, (p, j) in enumerate(slots)]
        if fresh:
            self.ledger.plan(step, [t.id for t in new])
            self.ledger.carried_in(step, [t.id for t in self.carry])
        self.targets.update({t.id: t.target for t in new})
        pending = {"step": step, "trajs": resumed + new, "held": [t for t in self.carry if t.done],
                   "t": time.time(), "keep": len(new) - extra, "round": 0,
                   "spent": defaultdict(int), "cut": set(), "dropped": set()}
        self._dispatch(pending)
        return pending

    def _dispatch(self, pending: dict[str, Any]) -> None:
        """Start a round: every trajectory neither done, cut nor dropped, sharded over the
        rollout workers that hold the synced weights."""
        budget = self._partial_budget()
        gone = pending["cut"] | pending["dropped"]
        active = [t for t in pending["trajs"] if not t.done and t.id not in gone]
        # Workers still busy with a straggler's abandoned call get no new work this step.
        # (a worker freed since the sync still holds old weights: it waits for the next sync)
        workers = ([m for m in self.by_role["rollout"] if self.known.get(m.rank) == self.synced]
                   or self.by_role["rollout"])
        calls: list[tuple[Member, str, tuple]] = []
        for k, m in enumerate(workers):
            part = active[k * len(active) // len(workers):(k + 1) * len(active) // len(workers)]
            if not part:
                continue
            limits = [self.cfg.max_new_tokens - t.turn_tokens for t in part]
            if budget:  # at least one token: a cut trajectory resumes mid-turn, never on a tool
                limits = [min(lim, max(budget - pending["spent"][t.id], 1))
                          for lim, t in zip(limits, part)]
            calls.append((m, "generate", ([t.id for t in part], [t.group for t in part],
                                          [t.prompt + t.response for t in part],
                                          [rl.resume_seed(t.seed, len(t.response)) for t in part],
                                          limits)))
        over = self.job.tail_policy.kind == "overprovision" and self._turns() == 1
        pending["calls"] = calls
        # overprovision races single-turn shards (`_first_shards` starts them)
        pending["handles"] = None if over else [self.rt.call(m, meth, *a) for m, meth, a in calls]

    def collect_rollout(self, pending: dict[str, Any]) -> rl.Samples:
        """Run the step's rounds to the end; the samples it trains."""
        step = pending["step"]
        while pending["calls"]:
            calls, handles = pending["calls"], pending["handles"]
            if handles is None:
                calls, handles = self._first_shards(step, calls, pending)
            outs = self._call_all(calls, step, "rollout", on_retry=self._resync(step),
                                  handles=handles)
            self._check_versions(step, sorted({o[0].version for o in outs}))
            tools = self._absorb(pending, calls, outs)
            if tools:
                self._tool_calls(step, tools)
            self._overprovision_round(pending)
            pending["round"] += 1
            self._dispatch(pending)
        samples = self._settle(pending)
        if samples is None:  # partial: no group is complete yet: another round on the carry
            self._event("partial: another round", "tail", time.time(), 0.0, None, step,
                        policy_version=None, sample_ids=[t.id for t in self.carry])
            return self.collect_rollout({**self.launch_rollout(step, fresh=False),
                                         "t": pending["t"]})
        self._check_started(step, samples)
        self._event("rollout", "stage", pending["t"], time.time() - pending["t"], None, step,
                    policy_version=samples.version, sample_ids=samples.ids,
                    tokens=samples.tokens())
        return samples

    def _absorb(self, pending: dict[str, Any], calls: list[tuple[Member, str, tuple]],
                outs: list[Any]) -> list[Traj]:
        """Append a round's tokens to their trajectories; the ones whose turn ended with turns
        left (they need a tool call)."""
        step, by_id = pending["step"], {t.id: t for t in pending["trajs"]}
        turns, cap = self._turns(), self.cfg.max_new_tokens
        tools = []
        for k, (s, timing) in enumerate(outs):
            m = self.ran_on[k]
            self.ledger.generated(step, s.ids, rerun=k in self.rerun_idx)
            self._event("generate", "generate", timing["t0"], timing["dur"], m, step,
                        policy_version=s.version, sample_ids=s.ids, tokens=timing["tokens"],
                        batch=timing["batch"], os_pid=timing.get("pid"), round=pending["round"],
                        # per sample, aligned with sample_ids (traces/record.py, placer/fit.py):
                        # the context prefilled and the tokens generated in this call; steps:
                        # lockstep decode runs until the longest ends
                        prompt_tokens=[len(p) for p in s.prompts],
                        response_tokens=[len(r) for r in s.responses],
                        steps=max((len(r) for r in s.responses), default=1))
            for sid, new, lps in zip(s.ids, s.responses, s.logprobs):
                t = by_id[sid]
                t.response += new
                t.logprobs += lps
                t.mask += [1] * len(new)
                pending["spent"][sid] += len(new)
                t.version = s.version
                t.started = s.version if t.started is None else t.started
                if (new and new[-1] == EOS) or t.turn_tokens >= cap:
                    if t.turn + 1 < turns:
                        tools.append(t)
                    else:
                        t.done, t.done_at = True, (pending["round"], k, len(t.response))
                else:  # stopped by the step's budget in mid-turn
                    pending["cut"].add(sid)
        self._role_s["rollout"] += max(o[1]["dur"] for o in outs)
        return tools

    def _tool_calls(self, step: int, trajs: list[Traj]) -> None:
        """Run each ended turn's code in the sandbox; append the output for the next turn."""
        vocab, room = self.cfg.arch["vocab"], self.job.environment.tool_output_tokens
        answers = [decode(t.response[t.turn_start:], vocab) for t in trajs]
        results = self._run_environment(step, [t.id for t in trajs], answers, "tool call",
                                        turn=[t.turn for t in trajs])
        for t, res in zip(trajs, results):
            out = encode(tool_text(res), vocab)[:room]
            t.response += out
            t.logprobs += [0.0] * len(out)
            t.mask += [0] * len(out)
            t.turn, t.turn_start = t.turn + 1, len(t.response)

    def _run_environment(self, step: int, ids: list[str], answers: list[str], what: str,
                         **per_sample: list[Any]) -> list[dict]:
        """Answers run as code in the sandbox, sharded over the free environment workers."""
        envs = self.busy.free(self.rt, self.by_role.get("environment") or [])
        if not envs:
            return [{"status": "error", "error": "no environment"}] * len(answers)
        calls = []
        for k, m in enumerate(envs):
            sl = slice(k * len(answers) // len(envs), (k + 1) * len(answers) // len(envs))
            if answers[sl]:
                calls.append((m, "execute", (ids[sl], answers[sl])))
        outs = self._call_all(calls, step, "environment")
        results: list[dict] = []
        at = {sid: i for i, sid in enumerate(ids)}
        for k, ((_, _, args), (vals, timing)) in enumerate(zip(calls, outs)):
            m = self.ran_on[k]
            for sid, v in zip(args[0], vals):
                extra = {key: vs[at[sid]] for key, vs in per_sample.items()}
                self._event("tool", "tool", v.get("ts", timing["t0"]), v.get("dur", 0.0), m, step,
                            policy_version=None, sample_ids=[sid], status=v.get("status"),
                            call=what, **extra)
            results += vals
        self._role_s["environment"] += max(o[1]["dur"] for o in outs)
        return results

    def _overprovision_round(self, pending: dict[str, Any]) -> None:
        """Multi-turn overprovision: once n trajectories are done, the rest are abandoned."""
        if self.job.tail_policy.kind != "overprovision" or self._turns() == 1:
            return
        if sum(t.done for t in pending["trajs"]) >= pending["keep"]:
            left = [t.id for t in pending["trajs"]
                    if not t.done and t.id not in pending["dropped"]]
            pending["dropped"] |= set(left)
            self.ledger.dropped(pending["step"], left)

    def _settle(self, pending: dict[str, Any]) -> rl.Samples | None:
        """The samples this step trains: every trajectory (none), the first n done
        (overprovision), the finished ones of complete groups (partial: None when none)."""
        trajs = pending["trajs"]
        if self._partial_budget():
            return self._settle_partial(pending)
        done = [t for t in trajs if t.done]
        if self.job.tail_policy.kind == "overprovision" and len(done) > pending["keep"]:
            done = self._keep_first(pending["step"], done, pending["keep"])
        order = {t.id: i for i, t in enumerate(trajs)}
        return rl.Samples.concat([t.as_samples() for t in sorted(done, key=lambda t: order[t.id])])

    def _check_versions(self, step: int, versions: list[int]) -> None:
        for v in versions:
            lag = step - v
            ok = lag == 0 if self.lc.mode == "sync" else 0 <= lag <= self.lc.max_staleness
            if not ok:
                raise RuntimeError(f"step {step}: samples from policy version {v} break the "
                                   f"{self.lc.mode} bound (staleness {self.lc.max_staleness})")

    def _check_started(self, step: int, s: rl.Samples) -> None:
        """Partial rollouts: a trained sample's first tokens may be older than the mode allows
        by the steps it was carried (`carry_steps`), never more."""
        bound = (0 if self.lc.mode == "sync" else self.lc.max_staleness) + carry_steps(
            self.job.tail_policy, self.cfg.max_new_tokens * self._turns())
        old = min(s.started, default=step)
        if step - old > bound:
            raise RuntimeError(f"step {step}: a sample started under policy version {old}, "
                               f"beyond the bound of {bound} steps")
