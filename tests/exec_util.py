"""Test helpers for the executor: hand-built plans (role -> pool, parallel layout, slot).

Plans go through the same `assemble()` as the planner's, so bundles and node mapping are real;
only the choice of configs is made by hand, so each test controls exactly where roles go.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.cost.roleestimate import Estimate, Part
from placer.cost.sharding import Parallel
from placer.cost.split import colocated, join
from placer.cost.timing import Placed
from placer.solve.assemble import assemble
from placer.solve.planfile import Plan, SolverInfo
from placer.spec.catalog import Resolved, resolve
from placer.spec.load import job_from_dict, load_job

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "examples" / "tiny-cpu.yaml"

# The layout the executor tests run: trainer DP=2 with the reference on the emulated GPUs,
# rollout on two emulated LPU chips, rule reward and sandboxed environment on the CPU node.
GRPO_LAYOUT = {"actor": ("gpu", Parallel(dp=2), "train"),
               "reference": ("gpu", Parallel(dp=1), "train"),
               "rollout": ("lpu", Parallel(dp=1), "gen"),
               "reward": ("cpu", Parallel(), "cpu"),
               "environment": ("cpu", Parallel(), "cpu")}
PPO_LAYOUT = {**GRPO_LAYOUT, "critic": ("gpu", Parallel(dp=1), "train")}
GRPO_STEPS = 10  # the shared GRPO run's (tests/conftest.py `grpo_api_run`)


def job_dict(**changes: Any) -> dict[str, Any]:
    data = yaml.safe_load(TINY.read_text())
    for k, v in changes.items():
        data[k] = v
    return data


def hand_plan(layout: dict[str, tuple[str, Parallel, str]], job: dict[str, Any] | None = None,
              split: tuple[str, list[tuple[str, Parallel, int]]] | None = None) -> Plan:
    """`split`: (slot, [(pool, layout, samples), ...]) puts the rollout role in that slot split
    over those pools (`placer.cost.split.join`, each part priced on its own samples) instead of
    `layout["rollout"]`; in another role's slot, a mixed rollout whose first part time-shares
    the slot (`placer.cost.split.colocated`)."""
    res = resolve(job_from_dict(job) if job is not None else load_job(TINY))
    calib = Calibration()
    placed = []
    for role in res.job.roles():
        if split is not None and role == "rollout":
            est = split_estimate(res, calib, split[1])
            if any(slot == split[0] for r, (_, _, slot) in layout.items() if r != role):
                est = colocated(est, split[1][0][0])
            placed.append(Placed(split[0], est))
            continue
        pool, par, slot = layout[role]
        est = Pricer(res, calib).estimate(role, res.job.cluster.pool(pool), par)
        assert est.feasible, f"{role} on {pool}: {est.reason}"
        placed.append(Placed(slot, est))
    info = SolverInfo(name="hand", status="hand", objective=0.0, bound=0.0, gap=0.0, solve_s=0.0)
    return assemble(Pricer(res, calib), placed, info)


def split_estimate(res: Resolved, calib: Calibration, parts: list[tuple[str, Parallel, int]]
                   ) -> Estimate:
    """The rollout role split over pools: each part estimated on the job of its own samples."""
    out = []
    for pool, par, n in parts:
        pres = res.with_samples(n)
        est = Pricer(pres, calib).estimate("rollout", pres.cluster.pool(pool), par)
        assert est.feasible, f"rollout part on {pool}: {est.reason}"
        out.append(Part(est, n))
    return join(out)


def run_module(plan: Plan, steps: int, out: Path, **kw: Any):
    """Start an embedded Ray for one test module, run the plan, and shut Ray down."""
    # lazy: Ray and torch: only the tests that run workers load them
    import ray

    from executors import cluster
    from executors.run import execute
    from executors.runplan import resolve_plan
    if ray.is_initialized():
        ray.shutdown()
    cluster.start(resolve_plan(plan, agents=True))
    try:
        return execute(plan, steps, out, **kw)
    finally:
        ray.shutdown()


def execute_cli(plan: Path, out: Path, *extra: str,
                watch: Callable[[int], None] | None = None) -> tuple[dict[str, Any], str]:
    """`placer execute PLAN --json --out OUT ...` as a user runs it (a subprocess with its own
    embedded Ray): the JSON document it prints and its stderr; it must exit 0. `watch(pid)` is
    called every 0.2 s while it runs (the output goes to files, so that no pipe fills)."""
    import json
    import os
    import subprocess
    import sys
    import time
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    argv = [sys.executable, "-m", "placer.cli", "execute", str(plan), "--json", "--out", str(out),
            *extra]
    logs = out.parent / f"{out.name}.stdout", out.parent / f"{out.name}.stderr"
    with logs[0].open("w") as so, logs[1].open("w") as se:
        proc = subprocess.Popen(argv, stdout=so, stderr=se, env=env, cwd=ROOT)
        try:
            deadline = time.monotonic() + 600
            while proc.poll() is None and time.monotonic() < deadline:
                if watch is not None:
                    watch(proc.pid)
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=60)
    stdout, stderr = logs[0].read_text(), logs[1].read_text()
    assert proc.returncode == 0, stderr[-3000:]
    doc: dict[str, Any] = json.loads(stdout)
    return doc, stderr


def curve(result) -> list[float]:
    return [round(s.reward, 3) for s in result.stats]


class VirtualRuntime:
    """Every rank as an in-process worker (calls run when made, like LocalRuntime), with a
    virtual duration per worker: which call finishes first is decided by `slow`, not by load."""

    kind = "virtual"
    concurrent = False  # calls run when made, as in LocalRuntime

    def __init__(self, run, cfg, slow: dict[tuple[str, int], float]) -> None:
        from executors.backends import backend_of  # lazy: with the runtime (torch) below
        from executors.placement import assign  # lazy: as above
        from executors.runtime import worker_spec  # lazy: torch, as in run_module
        self.members = assign(run.seats)
        for m in self.members:
            cls, args = worker_spec(m, cfg, run.roles.get("rollout"), backend_of("torch"),
                                    self.members)
            m.handle = cls(*args)
        self.slow, self.took, self.cancelled = slow, {}, []

    def call(self, m, method, *args):
        from executors.runtime import LocalRuntime  # lazy: torch, as in run_module
        o = LocalRuntime.call(self, m, method, *args)
        self.took[id(o)] = self.slow.get((m.role, m.rank), 0.1)
        return o

    def results(self, handles):
        return handles

    def wait(self, handles, timeout_s):
        return [self.took[id(h)] <= timeout_s for h in handles]

    def first(self, handles):
        return min(range(len(handles)), key=lambda i: self.took[id(handles[i])])

    def cancel(self, handle):
        self.cancelled.append(handle)

    def forget(self, handle):
        pass

    def close(self):
        self.members = []


def spread_lengths(plan: Plan, out: Path, eos_push: float = 1.0) -> None:
    """Write `out`/model-v0 (what `execute` loads) as the seeded random policy with its EOS
    logit raised by ~`eos_push` along the mean hidden state: a random init almost never emits
    EOS (every response runs to the cap); this one's lengths spread from 1 to the cap (at 1.0:
    mean ~13 of 24), as a trained policy's do - what long-tail policies act on."""
    # lazy: torch, as in run_module
    import torch

    from executors.model import EOS, build_policy, save_model_dir
    res = plan.resolved()
    arch = res.model_of("actor")
    model = build_policy(arch, res.job.seed)
    with torch.no_grad():
        ids = torch.randint(4, arch.vocab, (64, 24), generator=torch.Generator().manual_seed(0))
        h = model(input_ids=ids, output_hidden_states=True).hidden_states[-1]
        mu = h.reshape(-1, h.shape[-1]).mean(0)
        model.lm_head.weight[EOS] += eos_push * mu / mu.norm() ** 2
    save_model_dir(model, arch, out / "model-v0")
