"""Execute a multi-agent plan on Ray: each agent's trainer, engines and reward where the plan put them.

A multi-agent job (`placer.spec.agents`) names its roles `AGENT.ROLE`. The run plan
(`executors.runplan.resolve_plan(agents=True)`) places every one of them as the single-policy
executor does: one placement group per slot, one actor per seat, checked against the plan's
bundles and nodes (`executors.placement.verify` / `check`). Each agent has its own config
(`RunConfig`: its policy's architecture and version-0 weights, its per-turn budget, its trainer
layout and engines), so that its trainer ranks, engines and reward worker are the single-policy
workers (`Trainer`, the backend's rollout worker) or the agents' rule reward (`AgentReward`).

One GRPO step, in sync mode:
  wake     every engine the plan colocates with its agent's trainer takes its device memory
           back (from step 1: vLLM's `wake_up`, SGLang's `resume_memory_occupation`; the
           torch engine's `wake_engine`), traced per engine (`swap`);
  sync     each agent's trainer weights to every engine of that agent (from step 1; version
           v = optimizer steps so far), by the single-policy refresh (`executors.weights.
           refresh_paths`): per agent its own refresh paths, its trainer ranks the senders and
           its engines the targets, over a weight-sync group (or, for engines the plan
           colocates with the trainer, handed over as shared memory), the groups held under
           the agent's name so that no two agents share one; Ray's object store carries only
           the control messages (each sync event's `control_bytes`), no weight bytes;
  rollout  every sample's episode, turn by turn in schedule order (`executors.agents`): each
           turn's contexts dealt in contiguous shares over the engines of its agent, its
           responses appended to the shared contexts;
  sleep    the colocated engines free their device memory for the training phase (vLLM's
           `sleep(level=1)`, SGLang's `release_memory_occupation`), the swap the plan prices
           for a colocated slot, traced per engine;
  score    each agent's rule reward on its own reward worker (`executors.agents`: the answer
           read as a number; a review rewarded for agreeing with the answer's exactness);
  train    each agent's GRPO update on its own samples (its turns in the loss, the others' as
           context), on its own trainer ranks, all agents at once.
The trace holds every call as an event on its actor's track, named by its `AGENT.ROLE`, and
`metadata.executed_layout` per `AGENT.ROLE`. What this driver does not run is refused before
anything starts, one line naming the field (`agent_problem`).
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from executors import cluster, rl
from executors import placement as pl
from executors.agents import (
    Episode,
    Turn,
    agent_samples,
    answerer,
    judged_turn,
    literal_result,
    roles_by_agent,
    turn_plan,
    verdict_score,
)
from executors.backends import Backend
from executors.context import StepCounters, StepStat, TrainingLost
from executors.ledger import Ledger
from executors.model import prompt_ids
from executors.placement import Member
from executors.roles import RunConfig, Worker, _timing, run_config
from executors.runplan import JobFacts, Layout, RunPlan
from executors.runtime import Calls, RayCalls
from executors.task import Target, task_of
from executors.trainer import Trainer
from executors.training import partition, trainer_stats, with_stages
from executors.weights import GroupRefresh, refresh_paths
from placer.base.errors import SpecError
from placer.base.phases import PhaseClock
from placer.base.roles import Role
from placer.spec.agents import Agents, role_name, split_role
from placer.spec.catalog import Resolved
from traces.schema import Trace


def agent_problem(res: Resolved, run: RunPlan) -> str | None:
    """One line naming the field of what this driver does not run, None when it runs it all:
    shared engine pools, frozen agents, KL references, reward models, agents of different
    vocabularies (one shared context), split rollouts, async mode, PPO, tool calls."""
    job, agents = res.job, res.job.agents
    assert agents is not None
    if agents.shared_engines:
        return ("job.agents.shared_engines: placer execute runs each agent on engines of its "
                "own; plan without shared_engines to execute, or simulate this plan")
    for name, a in agents.members.items():
        where = f"job.agents.members.{name}"
        if not a.trained:
            return f"{where}.trained: false: placer execute trains every agent"
        if a.use_reference:
            return (f"{where}.use_reference: true: placer execute runs agents without a KL "
                    "reference; set use_reference: false to execute")
        if a.reward != "rule":
            return f"{where}.reward: {a.reward!r}: placer execute scores agents by rule only"
    vocabs = {n: res.model_of(role_name(n, Role.ACTOR)) for n in agents.members}
    if len({v.vocab for v in vocabs.values() if v is not None}) > 1:
        return ("job.agents.members: the agents' policies have different vocabularies; every "
                "turn reads one shared context, so placer execute needs one tokenizer")
    if "policy" in job.models.paths:
        return "job.models.paths: placer execute builds each agent's policy from its architecture"
    for name, r in run.roles.items():
        if r.parts:
            return f"plan.roles.{name}.parts: placer execute runs an agent's engines on one pool"
    if job.algorithm.value != "grpo":
        return f"job.algorithm: {job.algorithm.value!r}: multi-agent jobs execute with grpo"
    if job.pipeline.mechanism.overlaps_steps:
        return (f"job.pipeline.mode: {job.pipeline.mode!r}: multi-agent jobs execute with one "
                "step's stages in sequence (sync mode)")
    if job.environment.turns != 1:
        return "job.environment.turns: multi-agent jobs execute without tool calls"
    if job.data is not None and job.data.reward != "math":
        return f"job.data.reward: {job.data.reward!r}: multi-agent rule rewards read answers"
    return None


class AgentReward(Worker):
    """An agent's rule reward (`executors.agents`): the answering agent's answers read as
    numbers and scored by the task; a reviewer's verdicts scored against the task's
    exactness of the answer each reviewed. `results[i]`: {"answer": text, "verdict": text or
    None (the answering agent)}."""

    def __init__(self, cfg: RunConfig, rank: int = 0) -> None:
        super().__init__(cfg, "reward", rank)
        self.task = task_of(cfg.data)

    def score(self, s: rl.Samples, results: list[dict[str, Any]], targets: list[Target]
              ) -> tuple[list[float], dict[str, Any]]:
        t0 = time.time()
        rewards, exact = [], []
        for r, tg in zip(results, targets):
            answer = r["answer"]
            ok = self.task.exact(answer, literal_result(answer), tg)
            if r["verdict"] is None:
                rewards.append(self.task.score(answer, literal_result(answer), tg))
            else:
                rewards.append(verdict_score(r["verdict"], ok))
            exact.append(ok)
        return rewards, _timing(t0, sample_ids=list(s.ids), exact=exact)


@dataclasses.dataclass
class AgentRun:
    """One agent as it runs: its config, its view of the run plan, its workers."""

    name: str
    cfg: RunConfig
    view: RunPlan  # the run plan over its own roles, named without the agent (`agent_view`)
    trainers: list[Member]
    engines: list[Member]
    rewards: list[Member]
    layout: Layout  # its trainer's (a one-rank trainer trains the whole batch as one)


def agent_facts(res: Resolved, base: JobFacts, agent: str, turns: Sequence[Turn]) -> JobFacts:
    """The agent's job facts: its policy, its per-turn budget."""
    policy = res.model_of(role_name(agent, Role.ACTOR))
    assert policy is not None
    budget = max(t.max_new_tokens for t in turns if t.agent == agent)
    return dataclasses.replace(base, policy=policy, max_new_tokens=budget, paths={})


def agent_view(run: RunPlan, facts: JobFacts, agent: str) -> RunPlan:
    """The run plan as the agent's own: its roles (named without the agent) and facts."""
    mine = roles_by_agent(run.roles)[agent]
    return dataclasses.replace(run, job=facts, roles={base: run.roles[full]
                                                      for base, full in mine.items()})


def worker_of(m: Member, cfg: RunConfig, run: RunPlan, backend: Backend,
              members: Sequence[Member]) -> tuple[type, tuple[object, ...]]:
    """A member's worker class and arguments, by the base of its `AGENT.ROLE` name."""
    base = split_role(m.role)[1]
    if base == Role.ACTOR:
        return Trainer, (cfg, m.rank, sum(1 for x in members if x.role == m.role))
    if base == Role.ROLLOUT:
        return backend.rollout_worker(cfg, run.roles[m.role].group_of(m.rank), m.rank)
    if base == Role.REWARD:
        return AgentReward, (cfg, m.rank)
    raise SpecError(f"plan.roles.{m.role}: placer execute runs no {base!r} for an agent")


def start_actors(run: RunPlan, agents: dict[str, AgentRun], backend: Backend,
                 groups: dict[str, Any], pinned: bool, timeout_s: float = 180.0
                 ) -> list[Member]:
    """One Ray actor per seat of the run plan, in its bundle; every one started."""
    import ray  # lazy: Ray run only
    members = pl.assign(run.seats)
    for m in members:
        agent = agents[split_role(m.role)[0] or ""]
        cls, args = worker_of(m, agent.cfg, run, backend, members)
        m.handle = ray.remote(cls).options(max_restarts=0, max_task_retries=0,
                                           **pl.actor_options(m, groups[m.slot], pinned)
                                           ).remote(*args)
        base = split_role(m.role)[1]
        {Role.ACTOR: agent.trainers, Role.ROLLOUT: agent.engines,
         Role.REWARD: agent.rewards}[Role(base)].append(m)
    try:
        ray.get([m.handle.where.remote() for m in members], timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise pl.PlacementError(f"agent actors not started after {timeout_s:.0f}s: a bundle "
                                "lacks the resources its actors ask for") from None
    return members


def shares(n: int, k: int) -> list[list[int]]:
    """`k` contiguous, near-equal shares of range(n), in order (some empty when k > n)."""
    return [list(range(j * n // k, (j + 1) * n // k)) for j in range(k)]


class AgentLoop:
    """The steps of a multi-agent run over started actors (see the module docstring)."""

    def __init__(self, run: RunPlan, agents: dict[str, AgentRun], spec: Agents,
                 turns: list[Turn], trace: Trace, calls: Calls | None = None) -> None:
        """`calls`: how the driver calls the actors (default Ray's)."""
        self.run, self.agents, self.spec, self.turns, self.trace = run, agents, spec, turns, trace
        self.ledger = Ledger()
        self.answerer = answerer(spec)
        self.task = task_of(agents[self.answerer].cfg.data)
        self.t0 = time.time()
        self.counters = StepCounters()
        self.weights = GroupRefresh(calls if calls is not None else RayCalls())

    def event(self, name: str, cat: str, timing: dict[str, Any], m: Member | None, step: int,
              **args: object) -> None:
        """A trace event on the member's track (the driver's for None)."""
        t0, dur = float(timing["t0"]), float(timing["dur"])
        if m is None:
            self.trace.add(name, cat, max(t0 - self.t0, 0.0), dur, "driver", "loop", step=step,
                           **args)
            return
        self.counters.busy(m.role, [(t0, dur)])
        self.trace.add(name, cat, max(t0 - self.t0, 0.0), dur, m.trace_pid,
                       f"{m.role}{m.rank}", step=step, role=m.role, devices=m.device_ids,
                       **args)

    def setup(self) -> None:
        """Each agent's trainer process group (more than one rank), then the executed layouts."""
        import ray  # lazy: Ray run only
        layouts: dict[str, Any] = {}
        for a in self.agents.values():
            if len(a.trainers) > 1:
                addr, port = ray.get(a.trainers[0].handle.rendezvous.remote())
                ray.get([m.handle.init_group.remote(addr, port) for m in a.trainers])
            got = ray.get([m.handle.executed_layout.remote(len(a.trainers)) for m in a.trainers])
            layouts[role_name(a.name, Role.ACTOR)] = with_stages(got)
            layouts[role_name(a.name, Role.ROLLOUT)] = ray.get(
                a.engines[0].handle.executed_layout.remote(len(a.engines)))
        self.trace.metadata["executed_layout"] = layouts

    def sync(self, step: int) -> None:
        """Every agent's weights of version `step` to its engines (none before step 1), one
        agent after the other, each by its own refresh paths (`refresh_paths`)."""
        if step == 0:
            return
        t = time.time()
        for a in self.agents.values():
            t_agent = time.time()
            for m, err, got in refresh_paths(self.weights, a.view, a.trainers, a.engines, step,
                                             scope=a.name):
                if err is not None:
                    raise TrainingLost(f"weight sync of {a.name}'s version {step} to "
                                       f"{m.role}{m.rank}: {err}")
                self.event(f"sync {m.role}", "sync",
                           {"t0": t_agent, "dur": max(got["end"] - t_agent, 0.0)}, m, step,
                           policy_version=step, bytes=got["bytes"], calls=got["calls"],
                           senders=got["senders"], src=got["src"], backend=got["backend"],
                           control_bytes=got["control_bytes"])
        self.event("sync", "stage", {"t0": t, "dur": time.time() - t}, None, step)

    def colocated(self) -> list[Member]:
        """Every agent's engines that share their slot with its trainer (they sleep while it
        trains)."""
        out = []
        for a in self.agents.values():
            role = a.view.roles.get(Role.ROLLOUT)
            out += [m for m in a.engines if role is not None and role.group_of(m.rank).colocated]
        return out

    def swap(self, step: int, method: str) -> int:
        """Every colocated engine's `method` at once (`sleep_engine`: free its device memory for
        the training phase; `wake_engine`: take it back before the refresh); one `transfer`
        event per engine (`swapped`: whether it changed state). TrainingLost when an
        engine fails to: a half-asleep colocated slot cannot train or generate. The engines
        that changed state."""
        ms = self.colocated()
        if not ms:
            return 0
        rt, t = self.weights.rt, time.time()
        outs = rt.results([rt.call(m, method) for m in ms])
        dur = time.time() - t
        what = "sleep" if method == "sleep_engine" else "wake"
        for m, o in zip(ms, outs):
            if not o.ok:
                raise TrainingLost(f"{what} of {m.role}{m.rank} at step {step}: {o.error}")
            self.event(f"{what} {m.role}", "transfer", {"t0": t, "dur": dur}, m, step,
                       swapped=bool(o.value))
        return sum(bool(o.value) for o in outs)

    def rollout(self, step: int) -> tuple[list[Episode], list[str], list[str], list[Target]]:
        """Every sample's episode, turn by turn, each turn on its agent's engines."""
        import ray  # lazy: Ray run only
        t, job = time.time(), self.run.job
        codec = self.agents[self.answerer].cfg.codec
        prompts = self.task.prompts(job.seed, step, job.prompts)
        slots = [(p, j) for p in prompts for j in range(job.samples_per_prompt)]
        ids = [f"{p.id}.{j}" for p, j in slots]
        groups = [p.id for p, _ in slots]
        targets = [p.target for p, _ in slots]
        seeds = [(job.seed * 1_000_003 + step * 100_003 + i) % 2**63 for i in range(len(ids))]
        episodes = [Episode(prompt_ids(codec, p.text)) for p, _ in slots]
        self.ledger.plan(step, ids)
        for turn in self.turns:
            engines = self.agents[turn.agent].engines
            calls = []
            for m, idx in zip(engines, shares(len(ids), len(engines))):
                if idx:
                    ctxs = [episodes[i].context() for i in idx]
                    calls.append((m, idx, m.handle.generate.remote(
                        [ids[i] for i in idx], [groups[i] for i in idx], ctxs,
                        [rl.resume_seed(seeds[i], len(c)) for i, c in zip(idx, ctxs)],
                        [turn.max_new_tokens] * len(idx))))
            for m, idx, h in calls:
                s, timing = ray.get(h)
                for k, i in enumerate(idx):
                    episodes[i].append(turn, s.responses[k], s.logprobs[k])
                self.event(f"generate {m.role}", "generate", timing, m, step, turn=turn.index,
                           agent=turn.agent, batch=len(idx), tokens=timing["tokens"],
                           policy_version=timing["version"], sample_ids=timing["sample_ids"])
        self.ledger.generated(step, ids)
        self.event("rollout", "stage", {"t0": t, "dur": time.time() - t}, None, step)
        return episodes, ids, groups, targets

    def score(self, step: int, episodes: list[Episode], ids: list[str], groups: list[str],
              targets: list[Target]) -> dict[str, tuple[list[float], list[bool]]]:
        """Each agent's rewards (and the exactness of the answers they score) on its worker."""
        import ray  # lazy: Ray run only
        t, codec = time.time(), self.agents[self.answerer].cfg.codec
        calls = []
        for a in self.agents.values():
            if a.name == self.answerer:
                results = [{"answer": codec.decode(e.last_of(a.name)), "verdict": None}
                           for e in episodes]
            else:
                k = judged_turn(self.spec, a.name)
                results = [{"answer": codec.decode(e.turns[k]),
                            "verdict": codec.decode(e.last_of(a.name))} for e in episodes]
            s = rl.Samples(ids, [e.prompt for e in episodes], [[] for _ in ids], [[] for _ in ids],
                           step, groups)
            m = a.rewards[0]
            calls.append((a.name, m, m.handle.score.remote(s, results, targets)))
        out = {}
        for name, m, h in calls:
            rewards, timing = ray.get(h)
            out[name] = (rewards, timing["exact"])
            self.event(f"score {m.role}", "reward", timing, m, step, tokens=0,
                       sample_ids=timing["sample_ids"], reward=sum(rewards) / len(rewards))
        self.event("score", "stage", {"t0": t, "dur": time.time() - t}, None, step)
        return out

    def train(self, step: int, episodes: list[Episode], ids: list[str], groups: list[str],
              scored: dict[str, tuple[list[float], list[bool]]]
              ) -> tuple[float, dict[str, dict[str, float]]]:
        """Every agent's GRPO update on its own samples, all agents at once."""
        import ray  # lazy: Ray run only
        t, started = time.time(), []
        for a in self.agents.values():
            s = agent_samples(episodes, ids, groups, a.name, step)
            adv = rl.grpo_advantages(scored[a.name][0], groups)
            rows = [[x] * len(r) for x, r in zip(adv, s.responses)]
            parts = partition(s, rows, None, a.layout, a.cfg.mini_batches, a.cfg.accumulate)
            started.append((a, [(m, m.handle.train.remote(p))
                                for m, p in zip(a.trainers, parts)]))
        loss, stats = 0.0, {}
        for a, calls in started:
            outs = ray.get([h for _, h in calls])
            for (m, _), (info, timing) in zip(calls, outs):
                self.event(f"train {m.role}", "train", timing, m, step,
                           policy_version=info.get("version", step + 1),
                           sample_ids=timing["sample_ids"], tokens=timing["tokens"])
            leaders = [o[0] for k, o in enumerate(outs) if a.layout.leads(k)]
            loss += float(sum(v["loss"] for v in leaders))
            stats[a.name] = trainer_stats(leaders)
        self.ledger.trained(step, ids)
        self.event("train", "stage", {"t0": t, "dur": time.time() - t}, None, step,
                   policy_version=step + 1)
        return loss, stats

    def save_final(self, out: Path, step: int) -> None:
        """Each agent's trained weights and optimizer state after step `step`,
        OUT/AGENT/final.pt, one file (every trainer rank joins: a sharded trainer gathers
        them, rather than writing each rank's shards as its per-step checkpoints do)."""
        import ray  # lazy: Ray run only
        ray.get([m.handle.save.remote(str(out / a.name / "final.pt"), step, False)
                 for a in self.agents.values() for m in a.trainers])

    def step(self, step: int) -> StepStat:
        t = time.time()
        self.counters = StepCounters()
        if step > 0:  # the engines slept through the last step's training
            self.swap(step, "wake_engine")
        self.sync(step)
        episodes, ids, groups, targets = self.rollout(step)
        self.swap(step, "sleep_engine")  # no generation until the next step's refresh
        scored = self.score(step, episodes, ids, groups, targets)
        loss, stats = self.train(step, episodes, ids, groups, scored)
        self.ledger.commit(step)
        end = time.time()
        rewards, exact = scored[self.answerer]
        rank_s = self.counters.rank_s()
        st = StepStat(step, sum(rewards) / len(rewards), sum(map(bool, exact)) / len(exact),
                      end - t, self.counters.wall_s(t, end), rank_s,
                      {r: v * self.run.devices_per_rank(r) for r, v in rank_s.items()},
                      [step], loss)
        self.event(f"step {step}", "step", {"t0": t, "dur": end - t}, None, step,
                   policy_version=step, sample_ids=ids, reward=st.reward)
        for name, (rw, _) in scored.items():
            self.trace.count("rl", max(end - self.t0, 0.0), "driver", **{
                f"{name}.{k}": v for k, v in {**stats[name],
                                              "reward_mean": sum(rw) / len(rw)}.items()})
        return st


def run_agents(run: RunPlan, res: Resolved, out: Path, backend: Backend, address: str | None,
               lr: float | None, steps: int, trace: Trace, prepare: Callable[[JobFacts, Path], str],
               clock: PhaseClock, progress: Callable[[StepStat], None] | None = None,
               note: Callable[[str], None] | None = None) -> tuple[AgentLoop, list[StepStat],
                                                                    list[dict[str, Any]], str,
                                                                    list[str]]:
    """Start Ray and the agents' actors, run `steps` steps, stop every actor; the loop (its
    ledger), the steps' stats, where each actor ran, the cluster in words, the emulated pools.
    `prepare` writes an agent's version-0 weights (`executors.run.prepare_model`); `clock`
    times the set-up's phases and is ended when the first step begins. Each agent's trained
    weights are written to OUT/AGENT/final.pt (`Trainer.save`'s format) after the last step."""
    import ray  # lazy: Ray run only
    spec = res.job.agents
    assert spec is not None
    turns = turn_plan(spec, res.job.lengths.response)
    agents = {}
    clock.begin("preparing the agents' initial models")
    for name in spec.members:
        facts = agent_facts(res, run.job, name, turns)
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        view = agent_view(run, facts, name)
        cfg = run_config(view, lr, prepare(facts, folder))
        actor = run.roles[role_name(name, Role.ACTOR)]
        agents[name] = AgentRun(name, cfg, view, [], [], [],
                                actor.layout if actor.actors > 1 else Layout())
    clock.begin(f"joining Ray at {address}" if address else "starting Ray")
    info = cluster.start(run, address)
    if note:
        note(f"cluster: {info.describe()}")
    groups: dict[str, Any] = {}
    members: list[Member] = []
    try:
        clock.begin("reserving placement groups")
        groups = pl.create_groups(run, info.pinned)
        clock.begin("starting actors, loading models")
        members = start_actors(run, agents, backend, groups, info.pinned)
        clock.begin("checking placement")
        placement = pl.verify(members, groups)
        pl.check(placement, info.pinned)
        trace.metadata.update(emulated_pools=info.emulated, cluster=info.describe())
        loop = AgentLoop(run, agents, spec, turns, trace)
        clock.begin("forming the trainers' process groups, reading the layouts")
        loop.setup()
        clock.end()  # the set-up is over: the steps begin
        stats = []
        for step in range(steps):
            stats.append(loop.step(step))
            if progress:
                progress(stats[-1])
        loop.save_final(out, steps - 1)
    finally:
        for m in members:
            ray.kill(m.handle)
        pl.remove_groups(groups)
        cluster.stop(info)  # an embedded Ray goes with the run that started it
    return loop, stats, placement, info.describe(), info.emulated
