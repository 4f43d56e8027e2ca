"""Golden metrics: the simulator's regression check on every example.

For each `examples/*.yaml` the folder `traces/golden/` holds the plan that was simulated
(`NAME.plan.json`, so the check does not move when the planner changes) and the metrics the
simulator produced for it (`NAME.metrics.json`) under each scenario of `SCENARIOS` (the job as
written, and one with stragglers and failures). Checking re-simulates the stored plans and
compares every number (relative tolerance `RTOL`: the run is deterministic for its seed; the
tolerance only absorbs libm differences between machines).

A stored plan names local files (a checkpoint folder, a dataset, an empirical distribution's
JSONL) relative to the repository root, so a clone anywhere writes the same goldens; reading one
anchors those paths at this clone's root before the plan is checked and simulated.

When a model change is intended, regenerate and review the diff:

    python -m simulator.golden --write      # or: make golden
    python -m simulator.golden              # check; exit 1 and list what moved
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from placer.base.fileio import atomic_write_text
from placer.cost.calibration import load_calibration
from placer.solve.planfile import Plan, check_plan
from placer.spec.catalog import resolve
from placer.spec.load import load_job, read_structured
from simulator.api import SimResult, simulate_plan
from simulator.config import Failures, SimConfig, Stragglers
from simulator.handplans import plan_for

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
GOLDEN = ROOT / "traces" / "golden"
RTOL = 1e-6
SEED = 0
SCENARIOS: dict[str, SimConfig] = {
    "as_written": SimConfig(),
    "faults": SimConfig(stragglers=Stragglers(fraction=0.05),
                        failures=Failures(mtbf_hours={"gpu": 2000.0, "lpu": 4000.0},
                                          restart_s=120.0, checkpoint_every=2,
                                          checkpoint_s=10.0)),
}


def iterations_for(plan: Plan) -> int:
    return 4 if plan.pipeline.overlaps_steps else 2  # async: fill, two steady steps, drain


def example_names() -> list[str]:
    return sorted(p.stem for p in EXAMPLES.glob("*.yaml"))


def _map_strings(doc: Any, f: Callable[[str, str], str], key: str = "") -> Any:
    """`doc` with every string replaced by f(its key, it). The entries of a `paths` mapping
    (`models.paths`: role -> checkpoint folder) count as `path`; a list's items keep its key."""
    if isinstance(doc, dict):
        return {k: _map_strings(v, f, "path" if key == "paths" else k) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_map_strings(v, f, key) for v in doc]
    return f(key, doc) if isinstance(doc, str) else doc


def _from_root(_: str, s: str) -> str:
    """A path under the repository root made relative to it (also where a text names one)."""
    prefix = f"{ROOT}{os.sep}"
    if s.startswith(prefix):
        return os.path.relpath(os.path.normpath(s), ROOT)
    return s.replace(prefix, "")


def _at_root(key: str, s: str) -> str:
    """A relative local path (a `path` field, or an entry of `models.paths`) anchored at ROOT."""
    return str(ROOT / s) if key == "path" and s and not Path(s).is_absolute() else s


def save_golden_plan(plan: Plan, path: Path) -> None:
    rel = Plan.model_validate(_map_strings(plan.model_dump(mode="json"), _from_root))
    atomic_write_text(path, rel.to_json())


def load_golden_plan(path: Path) -> Plan:
    plan = Plan.model_validate(_map_strings(read_structured(path), _at_root))
    check_plan(plan, plan.resolved(), str(path))
    return plan


def golden_runs(plan_path: Path) -> dict[str, SimResult]:
    """The stored plan simulated under each scenario (its metrics and trace)."""
    plan = load_golden_plan(plan_path)
    return {name: simulate_plan(plan, iterations=iterations_for(plan), seed=SEED, config=cfg)
            for name, cfg in SCENARIOS.items()}


def simulate_golden(plan_path: Path) -> dict[str, Any]:
    """The metrics' JSON form (`SimMetrics.to_dict()`) under each scenario."""
    return {name: r.metrics.to_dict() for name, r in golden_runs(plan_path).items()}


def write(names: list[str]) -> None:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for name in names:
        res = resolve(load_job(EXAMPLES / f"{name}.yaml"), name)
        plan = plan_for(res, load_calibration(None))
        plan_path = GOLDEN / f"{name}.plan.json"
        save_golden_plan(plan, plan_path)
        metrics = simulate_golden(plan_path)
        atomic_write_text(GOLDEN / f"{name}.metrics.json", json.dumps(metrics, indent=1,
                                                                     sort_keys=True))
        print(f"wrote {plan_path.name}, {name}.metrics.json", file=sys.stderr)


def diff(expected: Any, got: Any, path: str = "") -> list[str]:
    """Every place where `got` differs from `expected` (numbers within RTOL are equal)."""
    if isinstance(expected, dict) and isinstance(got, dict):
        out = []
        for k in sorted(set(expected) | set(got)):
            if k not in got or k not in expected:
                out.append(f"{path}{k}: {'missing' if k not in got else 'new'}")
            else:
                out += diff(expected[k], got[k], f"{path}{k}.")
        return out
    num = (int, float)
    if isinstance(expected, num) and isinstance(got, num) and not isinstance(expected, bool):
        if math.isclose(expected, got, rel_tol=RTOL, abs_tol=1e-12):
            return []
        return [f"{path.rstrip('.')}: {expected!r} -> {got!r}"]
    return [] if expected == got else [f"{path.rstrip('.')}: {expected!r} -> {got!r}"]


def check(name: str, metrics: dict[str, Any] | None = None) -> list[str]:
    """What moved against the stored metrics. `metrics`: `simulate_golden`'s result for the
    stored plan when the caller has it already (else it is simulated here)."""
    plan_path = GOLDEN / f"{name}.plan.json"
    metrics_path = GOLDEN / f"{name}.metrics.json"
    if not plan_path.is_file() or not metrics_path.is_file():
        return [f"{name}: no golden files (run python -m simulator.golden --write)"]
    expected = json.loads(metrics_path.read_text())
    if metrics is None:
        metrics = simulate_golden(plan_path)
    got = json.loads(json.dumps(metrics))  # same JSON round trip as stored
    return [f"{name}: {d}" for d in diff(expected, got)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m simulator.golden", description=__doc__.split("\n")[0])
    p.add_argument("--write", action="store_true", help="regenerate plans and metrics")
    p.add_argument("names", nargs="*", help="examples (default: all)")
    args = p.parse_args(argv)
    names = args.names or example_names()
    if args.write:
        write(names)
        return 0
    problems = [d for n in names for d in check(n)]
    for line in problems:
        print(line)
    print(f"golden: {len(names)} example(s), {len(problems)} difference(s)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
