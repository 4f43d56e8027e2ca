"""The RL loop (GRPO, PPO) over a `Runtime`: versioned weight sync, traces, checkpoints, recovery.

One step, in the plan's four stages:
  sync     trainer rank 0's weights (version v = optimizer steps so far) go to every rollout
           worker that does not hold v yet (one object in Ray's store, fetched by each);
  rollout  prompts for the step (seeded) x samples per prompt, sharded over rollout workers, in
           rounds and turns (`executors.rollouts`): between a multi-turn sample's turns the
           environment runs its code in the sandbox and the output joins its context; every
           token carries the version it was generated with; then each final answer runs in
           the sandbox for the verifier;
  score    rule or model reward, reference log-probs (KL), critic values (PPO);
  train    advantages (GRPO: group-normalised rewards; PPO: GAE over critic values with a KL
           penalty), one optimizer step on each data-parallel rank (gradients all-reduced), critic
           step; checkpoint every `checkpoint_every` steps (atomic files).
Sync mode: a step's samples are generated with version == step. Async mode: the rollout of step
s+1 starts before step s scores and trains (its first round runs meanwhile), so its version is s
(staleness 1 <= max_staleness).

Recovery: a rollout, environment, reference or reward worker that dies mid-call is restarted by
Ray (`max_restarts`) and its in-flight samples are re-run (rollouts after re-syncing weights); a
trainer or critic that dies restarts every training rank, re-forms the process group, reloads the
last checkpoint and re-runs the steps after it. The ledger (`executors.ledger`) records sample ids
per step and proves nothing was lost or counted twice. A node that dies (or joins) changes the
plan itself: see `executors.recovery` and `executors.elastic`. Slow calls: `executors.stragglers`.

Tail policy (the job's `tail_policy`, `executors.tails`): `overprovision` generates ceil(n (1 + f))
samples and trains the first n to finish; `reissue` sets the environment's per-call deadline;
`partial` cuts samples at the token budget and resumes them next step under the newer weights.
"""
from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from executors import rl
from executors.ledger import Ledger
from executors.model import decode
from executors.elastic import ClusterChanged
from executors.recovery import Recovery, TrainingLost
from executors.placement import Member
from executors.stragglers import Busy
from executors.rollouts import Rollouts
from executors.tails import TailPolicies
from executors.task import exact
from executors.trajectory import Traj
from placer.plan import Plan, atomic_write_text
from traces.schema import Trace


@dataclass(frozen=True)
class Fault:
    """Kill a worker right after its work of `step` was dispatched (`kind`: ray.kill | signal)."""

    step: int
    role: str
    kind: str = "ray.kill"
    rank: int = 0


@dataclass
class LoopConfig:
    steps: int
    out_dir: Path
    mode: str = "sync"
    max_staleness: int = 0
    checkpoint_every: int = 1
    retries: int = 3
    faults: list[Fault] = field(default_factory=list)
    deadlines: dict[str, float] = field(default_factory=dict)  # role -> per-call deadline (s)


@dataclass
class StepStat:
    step: int
    reward: float
    exact: float
    step_s: float
    role_s: dict[str, float]
    versions: list[int]
    loss: float
    reruns: int = 0


class Loop(Recovery, Rollouts, TailPolicies):
    def __init__(self, plan: Plan, rt: Any, cfg: Any, lc: LoopConfig, trace: Trace,
                 progress: Callable[[StepStat], None] | None = None, *, elastic: Any = None,
                 note: Callable[[str], None] | None = None,
                 on_step: Callable[[int], None] | None = None) -> None:
        self.plan, self.rt, self.cfg, self.lc, self.trace = plan, rt, cfg, lc, trace
        self.job = plan.resolved().job
        self.elastic, self.note, self.on_step = elastic, note, on_step
        self._index_members()
        self.recoveries: list[dict[str, Any]] = []
        self.stragglers: list[dict[str, Any]] = []
        self.busy = Busy()
        self.ran_on: dict[int, Member] = {}  # call index -> worker whose result was taken
        self.synced: int | None = None  # the version the last weight sync sent
        self.ledger = Ledger()
        self.stats: list[StepStat] = []
        self.known: dict[int, int | None] = {}  # rollout rank -> weight version it holds
        self.faults = list(lc.faults)
        self.progress = progress
        self.t0 = time.time()
        self.last_ckpt = -1
        self._role_s: dict[str, float] = defaultdict(float)
        self._reruns = 0
        self.rerun_idx: set[int] = set()
        self._next_pending: dict[str, Any] | None = None
        self.carry: list[Traj] = []  # partial rollouts: samples not trained yet
        self.targets: dict[str, int] = {}  # sample id -> the task's answer, until it trains

    # ------------------------------------------------------------------ helpers
    def _index_members(self) -> None:
        self.by_role: dict[str, list[Member]] = defaultdict(list)
        for m in sorted(self.rt.members, key=lambda m: (m.role, m.rank)):
            self.by_role[m.role].append(m)

    def _event(self, name: str, cat: str, ts: float, dur: float, m: Member | None, step: int,
               **args: Any) -> None:
        pid, tid = (m.trace_pid, f"{m.role}{m.rank}") if m else ("driver", "loop")
        if m is not None:
            args.setdefault("role", m.role)
            args.setdefault("devices", m.device_ids)
        self.trace.add(name, cat, max(ts - self.t0, 0.0), max(dur, 0.0), pid, tid, step=step,
                       **args)

    def _inject(self, step: int, role: str) -> None:
        for f in [f for f in self.faults if f.step == step and f.role == role]:
            self.faults.remove(f)
            m = self.by_role[role][f.rank]
            t = time.time()
            self.rt.kill(m, f.kind)
            self._event(f"kill {role}{f.rank}", "failure", t, 0.0, m, step, kind=f.kind,
                        policy_version=None)

    def _call_all(self, calls: list[tuple[Member, str, tuple]], step: int, role: str,
                  on_retry: Callable[[Member], None] | None = None,
                  handles: list[Any] | None = None) -> list[Any]:
        """Run calls in parallel (or wait for `handles` already started); a call whose worker
        died is re-run on the restarted worker."""
        self.rerun_idx: set[int] = set()
        self.ran_on = {i: c[0] for i, c in enumerate(calls)}
        if handles is None:
            handles = [self.rt.call(m, meth, *args) for m, meth, args in calls]
        self._inject(step, role)
        if self.lc.deadlines.get(role):
            handles = self._race(calls, handles, step, role)
        outs = self.rt.results(handles)
        for attempt in range(self.lc.retries + 1):
            bad = [i for i, o in enumerate(outs) if not o.ok]
            if not bad:
                break
            self._check_cluster()
            if any(outs[i].lost_node for i in bad):  # Ray has not marked the node dead yet
                raise ClusterChanged({}, outs[bad[0]].error)
            if attempt == self.lc.retries:
                raise RuntimeError(f"{role}: calls keep failing: {outs[bad[0]].error}")
            for i in bad:
                m, meth, args = calls[i]
                self.ran_on[i] = m
                t = time.time()
                try:
                    self.rt.wait_alive(m)
                except Exception:  # noqa: BLE001 - its node may have gone meanwhile
                    self._check_cluster()
                    raise
                self._event(f"restart {m.role}{m.rank}", "restart", t, time.time() - t, m, step,
                            error=outs[i].error, policy_version=None)
                if on_retry:
                    on_retry(m)
                self._reruns += 1
                self.rerun_idx.add(i)
                outs[i] = self.rt.results([self.rt.call(m, meth, *args)])[0]
        return [o.value for o in outs]

    # ------------------------------------------------------------------ stages
    def setup_training(self) -> None:
        ranks = self.by_role["actor"]
        if len(ranks) > 1:
            addr, port = self.rt.results([self.rt.call(ranks[0], "rendezvous")])[0].value
            outs = self.rt.results([self.rt.call(m, "init_group", addr, port) for m in ranks])
            if not all(o.ok for o in outs):
                raise RuntimeError(f"trainer process group: {next(o.error for o in outs if not o.ok)}")

    def sync_weights(self, step: int, force: Member | None = None) -> int:
        t = time.time()
        trainer = self.by_role["actor"][0]
        out = self.rt.results([self.rt.call(trainer, "weights_info")])[0]
        if not out.ok:
            raise TrainingLost(out.error)
        version, nbytes = out.value
        free = self.busy.free(self.rt, self.by_role["rollout"])
        for m in self.by_role["rollout"]:
            if all(m is not f for f in free):  # still busy with an abandoned call: sync later
                self.known[m.rank] = None
        targets = [m for m in free if m is force or self.known.get(m.rank) != version]
        self.synced = version
        if not targets:
            return version
        # The weights go from the trainer's process to each rollout worker through Ray's object
        # store (the driver passes the reference on; it never holds the tensors).
        ref = self.rt.call(trainer, "weights")
        outs = self.rt.results([self.rt.call(m, "load_weights", ref, version) for m in targets])
        self.rt.forget(ref)
        failed = []
        for m, o in zip(targets, outs):
            if not o.ok:  # a rollout worker died while loading: it re-syncs before its next work
                self.known[m.rank] = None
                failed.append(o.error)
                continue
            self.known[m.rank] = version
            self._event("weight sync", "transfer", o.value["t0"], o.value["dur"], m, step,
                        policy_version=version, bytes=nbytes, src="actor0")
        if failed and not any(self.known.get(m.rank) == version for m in self.by_role["rollout"]):
            # No rollout worker holds version v: the trainer's copy was lost with its process or
            # its node (a process can answer for a moment after its node is gone). Rolling
            # out with older weights would break the mode's staleness bound: recover instead.
            self._check_cluster()
            raise TrainingLost(f"weight sync of version {version} reached no rollout worker: "
                               f"{failed[0]}")
        self._event("sync", "stage", t, time.time() - t, None, step, policy_version=version)
        self.synced = version
        return version

    def _resync(self, step: int) -> Callable[[Member], None]:
        def fix(m: Member) -> None:
            self.known[m.rank] = None
            self.sync_weights(step, force=m)
        return fix

    def environment(self, step: int, s: rl.Samples) -> list[dict]:
        """Each sample's final answer run as code in the sandbox (what the rule reward checks)."""
        vocab = self.cfg.arch["vocab"]
        return self._run_environment(step, s.ids, [decode(s.answer(i), vocab)
                                                   for i in range(len(s.ids))], "verify")

    def _score_jobs(self, s: rl.Samples) -> list[tuple[str, list[tuple[Member, str, tuple]]]]:
        """Reference log-probs and critic values: they need only the samples."""
        jobs = []
        if self.by_role.get("reference"):
            refs = self.by_role["reference"]
            jobs.append(("reference", [(m, "logprobs", (s.take(list(range(
                k * len(s.ids) // len(refs), (k + 1) * len(s.ids) // len(refs)))),))
                for k, m in enumerate(refs)]))
        if self.by_role.get("critic"):
            jobs.append(("critic", [(self.by_role["critic"][0], "values", (s,))]))
        return jobs

    def dispatch_score(self, step: int, s: rl.Samples) -> dict[str, Any]:
        """Start reference and critic work now, so that it overlaps the environment's."""
        jobs = self._score_jobs(s)
        return {"t": time.time(), "jobs": jobs,
                "handles": [[self.rt.call(m, meth, *a) for m, meth, a in calls]
                            for _, calls in jobs]}

    def score(self, step: int, s: rl.Samples, results: list[dict], targets: list[int],
              started: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        reward = ("reward", [(self.by_role["reward"][0], "score", (s, results, targets))])
        for (role, calls), hs in zip([reward] + started["jobs"], [None] + started["handles"]):
            try:
                vals = self._call_all(calls, step, role, handles=hs)
            except RuntimeError as e:
                if role == "critic":
                    raise TrainingLost(str(e)) from None
                raise
            cat = {"reward": "reward", "reference": "forward", "critic": "forward"}[role]
            for (m, _, _), (_, timing) in zip(calls, vals):
                self._event(role, cat, timing["t0"], timing["dur"], m, step,
                            policy_version=s.version, sample_ids=timing["sample_ids"],
                            tokens=timing.get("tokens", 0))
            self._role_s[role] += max(v[1]["dur"] for v in vals)
            out[role] = [x for v in vals for x in v[0]]
        self._event("score", "stage", started["t"], time.time() - started["t"], None, step,
                    policy_version=s.version)
        return out

    def advantages(self, s: rl.Samples, scored: dict[str, Any]) -> tuple[list[list[float]], dict]:
        rewards = scored["reward"]
        if self.cfg.algorithm != "ppo":
            adv = rl.grpo_advantages(rewards, s.group)
            return [[a] * len(r) for a, r in zip(adv, s.responses)], {}
        w = max(len(r) for r in s.responses)
        _, _, rmask = rl.pack(s)
        old = rl.to_padded(s.logprobs, w)
        ref = rl.to_padded(scored["reference"], w) if "reference" in scored else old
        values = rl.to_padded(scored["critic"], w)
        tok_r = -self.cfg.kl_coef * (old - ref) * rmask
        last = torch.tensor([len(r) - 1 for r in s.responses])
        tok_r[torch.arange(len(rewards)), last] += torch.tensor(rewards)
        adv, ret = rl.gae(tok_r, values, rmask)
        n = rmask.sum()
        mean = (adv * rmask).sum() / n
        std = (((adv - mean) ** 2 * rmask).sum() / n).sqrt()
        adv = (adv - mean) / (std + 1e-6) * rmask
        rows = lambda x: [x[i, :len(r)].tolist() for i, r in enumerate(s.responses)]  # noqa: E731
        return rows(adv), {"returns": rows(ret), "values": scored["critic"]}

    def train(self, step: int, s: rl.Samples, adv: list[list[float]], extra: dict,
              ref: list[list[float]] | None) -> float:
        t = time.time()
        ranks = self.by_role["actor"]
        calls = []
        total = s.generated_tokens()
        for k, m in enumerate(ranks):
            idx = list(range(k * len(s.ids) // len(ranks), (k + 1) * len(s.ids) // len(ranks)))
            calls.append((m, "train", (s.take(idx), [adv[i] for i in idx],
                                       [ref[i] for i in idx] if ref else None, total)))
        if self.by_role.get("critic"):
            calls.append((self.by_role["critic"][0], "train",
                          (s, extra["returns"], extra["values"])))
        handles = [self.rt.call(m, meth, *args) for m, meth, args in calls]
        self._inject(step, "actor")
        self._inject(step, "critic")
        outs = self.rt.results(handles)
        if not all(o.ok for o in outs):
            raise TrainingLost(next(o.error for o in outs if not o.ok))
        for (m, _, args), o in zip(calls, outs):
            info, timing = o.value
            self._event(f"train {m.role}", "train", timing["t0"], timing["dur"], m, step,
                        policy_version=info.get("version", step + 1), os_pid=timing.get("pid"),
                        sample_ids=timing["sample_ids"], tokens=timing["tokens"])
            self._role_s[m.role] += timing["dur"]
        self.ledger.trained(step, [i for o in outs[:len(ranks)] for i in o.value[1]["sample_ids"]])
        self._event("train", "stage", t, time.time() - t, None, step, policy_version=step + 1)
        return sum(o.value[0]["loss"] for o in outs[:len(ranks)]) / len(ranks)

    def checkpoint(self, step: int) -> None:
        t = time.time()
        d = self.lc.out_dir / "checkpoints"
        handles = [self.rt.call(self.by_role["actor"][0], "save", str(d / f"actor-{step:06d}.pt"), step)]
        if self.by_role.get("critic"):
            handles.append(self.rt.call(self.by_role["critic"][0], "save",
                                        str(d / f"critic-{step:06d}.pt"), step))
        outs = self.rt.results(handles)
        if not all(o.ok for o in outs):
            raise TrainingLost(next(o.error for o in outs if not o.ok))
        carry = self._save_carry(d, step) if self._partial_budget() else None
        atomic_write_text(d / "latest.json", json.dumps(
            {"step": step, "actor": outs[0].value, "critic": outs[1].value if len(outs) > 1 else None,
             "carry": carry}))
        self.last_ckpt = step
        self._event("checkpoint", "checkpoint", t, time.time() - t, None, step,
                    policy_version=step + 1)

    # ------------------------------------------------------------------ the loop
    def run(self) -> list[StepStat]:
        self.setup_training()
        step, pending = 0, None
        restarts = 0
        while step < self.lc.steps:
            try:
                try:
                    if pending is None or pending["step"] != step:
                        self._boundary(step)
                        self.sync_weights(step)
                        pending = self.launch_rollout(step)
                    self._step(step, pending)
                    pending = self._next_pending
                    step += 1
                except TrainingLost as e:
                    self._check_cluster()  # a lost node, not a lost process: re-plan instead
                    restarts += 1
                    if restarts > self.lc.retries:
                        raise RuntimeError(f"training keeps failing: {e}") from None
                    try:
                        step, pending = self.recover_training(step, str(e)), None
                    except Exception:
                        self._check_cluster()
                        raise
            except ClusterChanged as e:
                restarts += 1
                if restarts > self.lc.retries:
                    raise RuntimeError(f"the cluster keeps changing: {e}") from None
                step, pending = self.recover_cluster(step, e), None
            self.stats = [st for st in self.stats if st.step < step]
        return self.stats

    def _boundary(self, step: int) -> None:
        """Between steps: the test hook, then a check that the cluster is still the plan's (a
        joined node is used from here on; a lost one is usually noticed earlier, by a call)."""
        if self.on_step is not None:
            self.on_step(step)
        self._check_cluster()

    def _step(self, step: int, pending: dict[str, Any]) -> None:
        t = time.time()
        self._role_s, self._reruns = defaultdict(float), 0
        s = self.collect_rollout(pending)
        self._next_pending = None
        if self.lc.mode == "async" and step + 1 < self.lc.steps:
            self.sync_weights(step + 1)  # version == step: one behind the next step
            self._next_pending = self.launch_rollout(step + 1)
        targets = [self.targets.pop(i) for i in s.ids]
        started = self.dispatch_score(step, s)
        results = self.environment(step, s)
        scored = self.score(step, s, results, targets, started)
        adv, extra = self.advantages(s, scored)
        loss = self.train(step, s, adv, extra, scored.get("reference"))
        self.ledger.commit(step)
        if self.lc.checkpoint_every and (step + 1) % self.lc.checkpoint_every == 0:
            self.checkpoint(step)
        self.ledger.write(self.lc.out_dir / "ledger.json")
        rewards = scored["reward"]
        st = StepStat(step, sum(rewards) / len(rewards),
                      sum(exact(r, tg) for r, tg in zip(results, targets)) / len(rewards),
                      time.time() - t, dict(self._role_s), sorted({s.version, *s.started}),
                      loss, self._reruns)
        self._event(f"step {step}", "step", t, st.step_s, None, step, policy_version=s.version,
                    sample_ids=s.ids, tokens=s.tokens(), reward=st.reward)
        self.stats.append(st)
        if self.progress:
            self.progress(st)
