"""Fixtures shared by the test files, and the suite's settings.

`PLACER_STRICT_TRACES=1`: every trace the suite writes or reads through `TraceEvent.fields` must
use only the keys `traces.schema.EventArgs` names (outside the tests a foreign key is kept).

Parallel runs (`make test`: pytest-xdist, `-n 2 --dist loadgroup`): `pytest_collection_modifyitems`
puts every test that starts Ray (marked `ray`, or using a fixture of `RAY_FIXTURES`) in the xdist
group "ray", so that one worker runs them one after another (one embedded Ray at a time, none
beside another's placement groups and ports) while the other worker runs the rest; the users of
each costly session fixture (`SHARED_SESSION_FIXTURES`) in one group, so that it is computed once
per run, not once per worker; and the tests of a module that share state (`MODULE_GROUPS`) in
one. Without xdist the groups are inert marks.
"""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("PLACER_STRICT_TRACES", "1")

ROOT = Path(__file__).resolve().parent.parent

# Session fixtures that start Ray: their users carry the `ray` mark and run in the "ray" group.
RAY_FIXTURES = frozenset({"grpo_api_run", "grpo_cli_run"})
# Costly session fixtures -> the xdist group of their users (one worker computes each once).
SHARED_SESSION_FIXTURES = {"published_loo": "published-loo", "golden_runs": "golden-runs"}
# Modules whose tests share state across tests, so that one worker runs all of them in file order:
# test_fuzz_cli's last test checks the input kinds the ones before it counted (module-level KINDS).
MODULE_GROUPS = {"test_fuzz_cli.py": "fuzz-cli"}


def xdist_group_of(item: pytest.Item) -> str | None:
    """The xdist group a test runs in (None: any worker). A Ray test's group wins over a shared
    fixture's: Ray tests must never run beside one another."""
    fixtures = set(getattr(item, "fixturenames", ()))
    if item.get_closest_marker("ray") is not None or fixtures & RAY_FIXTURES:
        return "ray"
    groups = sorted({g for f, g in SHARED_SESSION_FIXTURES.items() if f in fixtures}
                    | ({MODULE_GROUPS[item.path.name]} if item.path.name in MODULE_GROUPS else set()))
    assert len(groups) <= 1, f"{item.nodeid}: uses the fixtures of groups {groups}"
    return groups[0] if groups else None


class GroupIds:
    """pytest-xdist (3.8) tags a grouped test's id with "@GROUP" (what --dist loadgroup schedules
    by) by setting `item._nodeid`, which pytest 9 no longer reads (the id is `item._id`): where
    the tag did not take, it is set here, after xdist's hook, so that a group stays on one worker."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        if not getattr(config.option, "loadgroup", False):  # not an xdist worker of loadgroup
            return
        for item in items:
            names = sorted({str(m.args[0]) for m in item.iter_markers("xdist_group")})
            nodeid = item.nodeid
            if names and nodeid.rfind("@") <= nodeid.rfind("]"):  # as xdist tells a tag
                from _pytest.nodeid import coerce_node_id  # lazy: pytest 9's, where needed
                item._id = coerce_node_id(f"{nodeid}@{'_'.join(names)}")  # type: ignore[attr-defined]


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(GroupIds(), "placer-xdist-group-ids")


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    groups = {item.nodeid: xdist_group_of(item) for item in items}
    for item in items:
        group = groups[item.nodeid]
        if group == "ray" and item.get_closest_marker("ray") is None:
            item.add_marker(pytest.mark.ray)  # `-m "not ray"` leaves it out too
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    if hasattr(config, "workerinput"):  # an xdist worker (each collects the same list)
        # The Ray group, the longest unit of work, goes first: one worker starts it at once
        # while the other takes the rest, instead of one worker running it alone at the end.
        items.sort(key=lambda item: groups[item.nodeid] != "ray")


@dataclass(frozen=True)
class ApiRun:
    result: Any  # the executor's RunResult
    seen: list[Any]  # the steps `on_step` was given
    ray_up: bool  # whether Ray was still up after the call
    phases: list[str | None]  # the set-up phases `on_phase` was told


@pytest.fixture(scope="session")
def grpo_api_run(tmp_path_factory: pytest.TempPathFactory) -> ApiRun:
    """`placer.execute` (the Python API, which starts the embedded Ray and must stop it) of the
    GRPO hand plan (tests/exec_util.py), GRPO_STEPS steps: tests/test_exec_grpo.py checks the
    run, and `grpo_cli_run` continues a copy of its --out through the CLI."""
    import ray  # lazy: Ray (~1 s) loads when a Ray test runs, not at collection
    from exec_util import GRPO_LAYOUT, GRPO_STEPS, curve, hand_plan  # lazy: the planner

    import placer
    if ray.is_initialized():  # so that this call starts the embedded Ray itself
        ray.shutdown()
    seen: list[Any] = []
    phases: list[str | None] = []
    r = placer.execute(hand_plan(GRPO_LAYOUT), steps=GRPO_STEPS,
                       out=tmp_path_factory.mktemp("grpo"), on_step=seen.append,
                       on_phase=phases.append)
    print("GRPO reward curve:", curve(r))
    print("set-up:", ", ".join(f"{p} {t:.1f}s" for p, t in r.setup_phases))
    return ApiRun(r, seen, ray.is_initialized(), phases)


@dataclass(frozen=True)
class CliRun:
    plan: Path  # the plan file run
    out: Path  # its --out
    trace: Path  # its --trace
    doc: dict[str, Any]  # the JSON document it printed
    stderr: str
    listening: dict[str, str]  # every socket its process tree listened on -> process names
    first: Any  # the API run it resumed (`grpo_api_run`'s RunResult)


@pytest.fixture(scope="session")
def grpo_cli_run(tmp_path_factory: pytest.TempPathFactory, grpo_api_run: ApiRun) -> CliRun:
    """`placer execute PLAN --resume --steps GRPO_STEPS+2` through the real CLI: it continues a
    copy of `grpo_api_run`'s --out (the same plan), whose model folder is first left
    half-written (its weights file removed), for two more steps, its listening sockets read
    while it runs (with `ss`). One Ray run serves the CLI's checks (tests/test_execute_cli.py:
    what it prints and writes), tests/test_listeners.py (where it listened) and
    tests/test_execute_resume.py (that it resumed). A fresh CLI run's path (no --resume) runs
    by default in tests/test_exec_tiny_moe.py."""
    import shutil

    from exec_util import GRPO_LAYOUT, GRPO_STEPS, execute_cli, hand_plan  # lazy: as above
    from listening import listening

    from placer.solve.planfile import save_plan
    d = tmp_path_factory.mktemp("cli-run")
    plan, out, trace = d / "plan.json", d / "out", d / "trace.json"
    save_plan(hand_plan(GRPO_LAYOUT), plan)
    # a copy, so that tests/test_exec_grpo.py reads its own run's checkpoints whatever the order
    shutil.copytree(grpo_api_run.result.out_dir, out)
    (out / "model-v0" / "model.safetensors").unlink()  # a half-written --out: weights missing
    seen: dict[str, str] = {}
    watch = (lambda pid: seen.update(listening(pid))) if shutil.which("ss") else None
    doc, stderr = execute_cli(plan, out, "--steps", str(GRPO_STEPS + 2), "--resume",
                              "--trace", str(trace), watch=watch)
    return CliRun(plan, out, trace, doc, stderr, seen, grpo_api_run.result)


@pytest.fixture(scope="session")
def placer_cmd() -> list[str]:
    """The `placer` console script next to this interpreter (else `python -m placer.cli`)."""
    script = Path(sys.executable).with_name("placer")
    return [str(script)] if script.exists() else [sys.executable, "-m", "placer.cli"]



@pytest.fixture(scope="session")
def published_loo() -> Any:
    """The published rows' leave-one-out report (`workflows.loo.loo_report`), computed once for
    the suite (~25 s): tests/test_loo.py bounds its errors and tests/test_band.py compares the
    shipped band and factor ranges with it. The CLI's own `--loo` path runs in test_loo."""
    from workflows.loo import loo_report  # lazy: the cost model loads when a test asks
    from workflows.published import published_rows
    return loo_report(published_rows())


@dataclass(frozen=True)
class GoldenRun:
    metrics: str  # JSON text of `simulator.golden.simulate_golden`'s result: each caller parses its own
    trace: Any  # the "as_written" scenario's simulated trace (`traces.schema.Trace`), only read


@pytest.fixture(scope="session")
def golden_runs() -> Callable[[str], GoldenRun]:
    """An example's stored plan (traces/golden/NAME.plan.json) simulated under each scenario of
    `simulator.golden.SCENARIOS`, once per run: tests/test_sim_golden.py compares the metrics
    with the stored ones and tests/test_contracts.py checks the simulated events against the
    trace schema (where it planned every example again and simulated it)."""
    from functools import cache

    from simulator import golden  # lazy: the simulator loads when a test asks

    @cache
    def run(name: str) -> GoldenRun:
        runs = golden.golden_runs(golden.GOLDEN / f"{name}.plan.json")
        metrics = json.dumps({s: r.metrics.to_dict() for s, r in runs.items()})
        return GoldenRun(metrics, runs["as_written"].trace)
    return run


PLAN_OPTIONS = ("time_limit_s", "objective", "workers", "seed")  # plan_job's, that key the cache


@pytest.fixture(scope="session")
def planned_example() -> Callable[..., Any]:
    """`planned_example(path, **options)`: `plan_job`'s plan of a job file (resolved as written,
    the default calibration) under `options` (those of `PLAN_OPTIONS`, defaults filled in), solved
    once per run (per xdist worker) for every test that plans the same file with the same
    options. Each call returns a deep copy: no test sees another's changes."""
    import inspect
    from functools import cache

    from placer.cost.pricer import Pricer  # lazy: the planner loads when a test asks
    from placer.solve.planner import plan_job
    from placer.spec.catalog import resolve
    from placer.spec.load import load_job
    defaults = {k: p.default for k, p in inspect.signature(plan_job).parameters.items()
                if k in PLAN_OPTIONS}

    @cache
    def solve(path: Path, options: tuple[tuple[str, Any], ...]) -> Any:
        return plan_job(Pricer(resolve(load_job(path))), **dict(options))

    def planned(path: str | Path, **options: Any) -> Any:
        unknown = sorted(set(options) - set(PLAN_OPTIONS))
        assert not unknown, f"planned_example: options {unknown} are not among {PLAN_OPTIONS}"
        key = tuple(sorted({**defaults, **options}.items()))
        return solve(Path(path).resolve(), key).model_copy(deep=True)
    return planned
