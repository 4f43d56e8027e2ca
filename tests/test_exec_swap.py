"""The single-agent loop's colocated engines sleep through training and wake before the
refresh (`executors.weights.WeightSync.sleep` / `sync`), each call traced as a `transfer`
event on the engine's track, as the multi-agent loop traces its own
(tests/test_exec_agents_swap.py): the tiny GRPO plan's rollout marked colocated, run by the
loop in this process (`LocalRuntime`) for two steps; the engines are the torch backend's
rollout workers, wrapped so that each sleep and wake reports a change of state as a vLLM or
SGLang engine's does (`executors.engine_common.EngineWorker.sleep_engine`). An engine whose
wake fails is traced with the error and re-synced before it generates again."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from exec_util import GRPO_LAYOUT, hand_plan, spread_lengths

from executors.context import LoopConfig
from executors.loop import Loop
from executors.roles import run_config
from executors.runplan import resolve_plan
from executors.runtime import LocalRuntime
from placer.cost.sharding import Parallel
from traces.schema import Trace


def _colocated_loop(out: Path, steps: int) -> Loop:
    plan = hand_plan({**GRPO_LAYOUT, "actor": ("gpu", Parallel(dp=1), "train")})
    spread_lengths(plan, out)
    run = resolve_plan(plan)
    ro = run.roles["rollout"]
    ro = replace(ro, engines=tuple(replace(e, colocated=True) for e in ro.engines))
    run = replace(run, roles={**run.roles, "rollout": ro})
    cfg = run_config(run, model_dir=str(out / "model-v0"))
    return Loop(run, LocalRuntime(run, cfg), cfg, LoopConfig(steps=steps, out_dir=out), Trace())


def _stateful(handle: Any, log: list[str], fail_wake_at: int = -1) -> None:
    """The engine's sleep and wake as a sleeping engine's: True when its state changes
    (`fail_wake_at`: that wake call, 0-based, raises)."""
    state = {"asleep": False, "wakes": 0}

    def sleep() -> bool:
        log.append("sleep")
        changed, state["asleep"] = not state["asleep"], True
        return changed

    def wake() -> bool:
        log.append("wake")
        state["wakes"] += 1
        if state["wakes"] - 1 == fail_wake_at:
            raise RuntimeError("device memory held by another process")
        changed, state["asleep"] = state["asleep"], False
        return changed
    handle.sleep_engine, handle.wake_engine = sleep, wake


def _swaps(loop: Loop) -> list[Any]:
    return [e for e in loop.trace.of("transfer") if e.name.split()[0] in ("sleep", "wake")]


def test_single_agent_sleep_and_wake_are_traced(tmp_path: Path) -> None:
    loop = _colocated_loop(tmp_path, steps=2)
    engines = loop.by_role["rollout"]
    roles = loop.ctx.run.roles
    assert engines and all(roles["rollout"].group_of(m.rank).colocated for m in engines)
    log: list[str] = []
    for m in engines:
        _stateful(m.handle, log)
    loop.run()
    events = _swaps(loop)
    # each step: woken before its refresh (step 0's engine was awake: no change), asleep
    # after its rollout, one event per engine and call, in the order the calls ran
    assert [(e.name, e.args["step"], e.args["swapped"]) for e in events] == [
        ("wake rollout", 0, False), ("sleep rollout", 0, True),
        ("wake rollout", 1, True), ("sleep rollout", 1, True)]
    assert [e.name.split()[0] for e in events] == log
    assert all(e.args["role"] == "rollout" and e.dur_s >= 0 for e in events)
    sync = loop.trace.of("transfer")
    first_sync = min(e.ts_s for e in sync if e.name == "weight sync" and e.args["step"] == 1)
    wake1 = next(e for e in events if e.name == "wake rollout" and e.args["step"] == 1)
    assert wake1.ts_s <= first_sync  # woken before the refresh that loads it


def test_a_failed_wake_is_traced_and_the_engine_resyncs(tmp_path: Path) -> None:
    loop = _colocated_loop(tmp_path, steps=2)
    log: list[str] = []
    for m in loop.by_role["rollout"]:
        _stateful(m.handle, log, fail_wake_at=1)  # step 1's wake
    loop.run()
    failed = [e for e in _swaps(loop) if e.args.get("error")]
    assert [(e.name, e.args["step"]) for e in failed] == [("wake rollout", 1)]
    assert "device memory held by another process" in failed[0].args["error"]
    assert failed[0].args["swapped"] is False
    assert loop.ledger.balanced(2), loop.ledger.problems(2)
