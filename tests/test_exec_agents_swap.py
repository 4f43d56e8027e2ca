"""The multi-agent driver's colocated engines sleep through training and wake before the
refresh, as the single-agent loop's do (`executors.weights.WeightSync.sleep` / `sync`): the
tiny two-agent plan colocates each agent's engine with its trainer, and the driver
(`executors.agentrun.AgentLoop`) calls each engine's `sleep_engine` after the rollout and
`wake_engine` before the next step's sync, each traced as a `transfer` event. The engines are
the torch backend's rollout workers (their sleep frees nothing: `swapped` false) in this
process, called through an in-process `Calls`; the stages themselves are recorded, not run
(they need Ray: tests/test_exec_agents.py runs them)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_exec_agents import TINY, _planned

from executors import placement as pl
from executors.agentrun import AgentLoop, AgentRun, agent_facts, agent_view
from executors.agents import turn_plan
from executors.context import TrainingLost
from executors.modelroles import Rollout
from executors.roles import run_config
from executors.run import prepare_model
from executors.runplan import Layout, resolve_plan
from executors.runtime import Outcome
from placer.base.roles import Role
from placer.spec.agents import role_name
from placer.spec.catalog import resolve
from placer.spec.load import load_job
from traces.schema import Trace


class InProcess:
    """`Calls` over objects of this process: a call runs when made (the runtime's local way)."""

    def call(self, m: Any, method: str, *args: object) -> Outcome:
        try:
            return Outcome(True, getattr(m.handle, method)(*args))
        except Exception as e:  # noqa: BLE001 - an outcome, as a lost remote call's
            return Outcome(False, error=f"{type(e).__name__}: {e}")

    def results(self, handles: list[Outcome]) -> list[Outcome]:
        return list(handles)


def _logged(real: Any, method: str, role: str, log: list[tuple[str, ...]]) -> Any:
    """`real` (an engine's sleep or wake), its calls logged."""
    def call() -> Any:
        log.append((method, role))
        return real()
    return call


def _loop(tmp_path: Path, log: list[tuple[str, ...]]) -> AgentLoop:
    """The tiny plan's driver over torch rollout workers whose sleep and wake are logged."""
    plan = _planned()
    run = resolve_plan(plan, agents=True)
    res = resolve(load_job(TINY))
    spec = res.job.agents
    assert spec is not None
    turns = turn_plan(spec, res.job.lengths.response)
    members = pl.assign(run.seats)
    agents = {}
    for name in spec.members:
        facts = agent_facts(res, run.job, name, turns)
        view = agent_view(run, facts, name)
        (tmp_path / name).mkdir()
        cfg = run_config(view, None, prepare_model(facts, tmp_path / name))
        engines = [m for m in members if m.role == role_name(name, Role.ROLLOUT)]
        for m in engines:
            m.handle = Rollout(cfg, m.rank)
            for method in ("sleep_engine", "wake_engine"):
                setattr(m.handle, method, _logged(getattr(m.handle, method), method, m.role, log))
        agents[name] = AgentRun(name, cfg, view, [], engines, [], Layout())
    return AgentLoop(run, agents, spec, turns, Trace(), calls=InProcess())  # type: ignore[arg-type]


def _record_stages(loop: AgentLoop, log: list[tuple[str, ...]]) -> None:
    """Each stage logs itself, keeps the ledger as the real one does and answers what `step`
    reads of it."""
    def rollout(step: int) -> tuple[list, list[str], list[str], list]:
        log.append(("rollout",))
        loop.ledger.plan(step, ["a"])
        loop.ledger.generated(step, ["a"])
        return [], ["a"], ["g"], []

    def train(step: int, *a: object) -> tuple[float, dict]:
        log.append(("train",))
        loop.ledger.trained(step, ["a"])
        return 0.0, {n: {} for n in loop.agents}
    def sync(step: int) -> None:
        log.append(("sync",))

    def score(step: int, *a: object) -> dict[str, tuple[list[float], list[bool]]]:
        log.append(("score",))
        return {n: ([1.0], [True]) for n in loop.agents}
    loop.sync = sync  # type: ignore[method-assign]
    loop.rollout = rollout  # type: ignore[method-assign]
    loop.score = score  # type: ignore[method-assign, assignment]
    loop.train = train  # type: ignore[method-assign, assignment]


def test_colocated_engines_sleep_through_training_and_wake_before_the_refresh(tmp_path) -> None:
    log: list[tuple[str, ...]] = []
    loop = _loop(tmp_path, log)
    engines = sorted(m.role for m in loop.colocated())
    assert engines == ["solver.rollout", "verifier.rollout"]  # the plan colocates both
    _record_stages(loop, log)
    for step in range(3):
        loop.step(step)
    sleeps = [("sleep_engine", r) for r in engines]
    wakes = [("wake_engine", r) for r in engines]
    one = [("sync",), ("rollout",), *sleeps, ("score",), ("train",)]
    assert sorted(log[:6]) == sorted(one) and log[:2] == one[:2] and log[4:6] == one[4:]
    for step in (1, 2):  # from step 1: woken first, then the refresh
        mine = log[6 + (step - 1) * 8: 6 + step * 8]
        assert sorted(mine[:2]) == wakes and mine[2:4] == [("sync",), ("rollout",)]
        assert sorted(mine[4:6]) == sleeps and mine[6:] == [("score",), ("train",)]
    events = [e for e in loop.trace.of("transfer")]
    assert [(e.name.split()[0], e.args["step"]) for e in events] == [
        ("sleep", 0), ("sleep", 0), ("wake", 1), ("wake", 1), ("sleep", 1), ("sleep", 1),
        ("wake", 2), ("wake", 2), ("sleep", 2), ("sleep", 2)]
    assert {e.args["role"] for e in events} == set(engines)
    # the torch engine keeps its weights in host memory: its sleep frees nothing
    assert all(e.args["swapped"] is False for e in events)


def test_an_engine_that_cannot_sleep_stops_the_run(tmp_path) -> None:
    log: list[tuple[str, ...]] = []
    loop = _loop(tmp_path, log)
    m = loop.colocated()[0]

    def refuse() -> bool:
        raise RuntimeError("out of host memory")
    m.handle.sleep_engine = refuse
    with pytest.raises(TrainingLost, match=rf"sleep of {m.role}0 at step 4: .*out of host memory"):
        loop.swap(4, "sleep_engine")
