"""What-if sweeps: the questions asked before buying or booking hardware.

Each sweep changes one thing about a job, re-plans it with the ILP (so every point shows the best
placement for that hardware, not a fixed one) and simulates the plan, and returns one row per
point:

    knob, value, predicted_s (the plan's), simulated_s / p99_s (the simulator's, with lengths and
    tool latencies drawn from the job's distributions), samples_per_s (simulated), usd_per_hour,
    cost_per_sample (USD, at the simulated throughput), placement (slot@pool xdevices, ...)

or, where the job cannot be placed, the planner's diagnosis in `infeasible`.

  pool_nodes(job, pool, counts)        LPU chip count (an LPU pool's nodes), CPU pool size, ...
  gpu_mix(job, a, b, mixes)            how many nodes of two GPU pools, e.g. H100 vs L40S
  response_tail(job, sigmas)           the lognormal response length's sigma (median kept)
  staleness(job, bounds)               sync (0) against async with a staleness bound
  frontier(job)                        the ILP's own time/cost frontier on the job's cluster
  baselines(job)                       the ILP's plan against the baselines (placer/baselines.py)
  pareto(rows)                         the throughput/cost frontier of any rows

Every random draw comes from the job's seed (`seed=` overrides it).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from placer.baselines import baseline_assignments
from placer.catalog import Resolved, resolve
from placer.costmodel import Calibration
from placer.errors import Infeasible
from placer.plan import Plan
from placer.planner import build_problem, plan_assignment, plan_job, sweep_job, with_nodes
from placer.pricing import usd_per_hour
from placer.spec import Job, SpecError
from simulator.api import simulate_plan

TIME_LIMIT_S = 2.0  # per point: the sweeps are for exploring; `placer plan` solves properly


def placement_summary(plan: Plan) -> str:
    return "; ".join(f"{s.name}@{s.pool} x{s.devices}" for s in plan.slots)


def evaluate(res: Resolved, knob: str, value: Any, iterations: int = 2, seed: int | None = None,
             calib: Calibration | None = None, time_limit_s: float = TIME_LIMIT_S
             ) -> dict[str, Any]:
    """Plan and simulate one point of a sweep."""
    row: dict[str, Any] = {"knob": knob, "value": value}
    try:
        plan = plan_job(res, calib or Calibration(), time_limit_s=time_limit_s)
    except Infeasible as e:
        return row | {"infeasible": str(e).splitlines()[0]}
    return _simulated(plan, knob, value, iterations, res.job.seed if seed is None else seed)


def sweep(job: Job, knob: str, values: list[Any], edit: Callable[[Job, Any], Resolved],
          **kw: Any) -> list[dict[str, Any]]:
    return [evaluate(edit(job, v), knob, v, **kw) for v in values]


def pool_nodes(job: Job, pool: str, counts: list[int], **kw: Any) -> list[dict[str, Any]]:
    """The pool at each node count (0 removes it)."""
    _pool(job, pool)
    return sweep(job, f"{pool} nodes", counts, lambda j, n: with_nodes(j, {pool: n}), **kw)


def gpu_mix(job: Job, a: str, b: str, mixes: list[tuple[int, int]], **kw: Any
            ) -> list[dict[str, Any]]:
    """Node counts of two pools, e.g. [(4, 0), (3, 1), (2, 2)] for (H100, L40S) nodes."""
    pa, pb = _pool(job, a), _pool(job, b)
    knob = f"{a} ({pa.device}) / {b} ({pb.device}) nodes"
    return sweep(job, knob, [f"{x}/{y}" for x, y in mixes],
                 lambda j, v: with_nodes(j, dict(zip((a, b), map(int, v.split("/"))))), **kw)


def response_tail(job: Job, sigmas: list[float], **kw: Any) -> list[dict[str, Any]]:
    """The lognormal response length with each sigma, its median kept (a longer tail)."""
    resp = job.lengths.response
    if resp.kind != "lognormal":
        raise SpecError(f"lengths.response.kind: the tail sweep needs a lognormal "
                        f"(got {resp.kind})")

    def edit(j: Job, s: float) -> Resolved:
        r = resp.model_copy(update={"sigma": s})
        return resolve(j.model_copy(update={"lengths": j.lengths.model_copy(
            update={"response": r})}))
    return sweep(job, "response sigma", sigmas, edit, **kw)


def staleness(job: Job, bounds: list[int], **kw: Any) -> list[dict[str, Any]]:
    """0: sync; k >= 1: async with staleness bound k."""
    def edit(j: Job, k: int) -> Resolved:
        p = j.pipeline.model_copy(update={"mode": "async" if k else "sync", "max_staleness": k})
        return resolve(j.model_copy(update={"pipeline": p}))
    return sweep(job, "staleness bound (0 = sync)", bounds, edit, **kw)


def frontier(job: Job, max_points: int = 5, iterations: int = 2, seed: int | None = None,
             time_limit_s: float = TIME_LIMIT_S) -> list[dict[str, Any]]:
    """The ILP's own time/cost frontier on the job's cluster (`planner.sweep_job`), simulated."""
    plans = sweep_job(resolve(job), Calibration(), time_limit_s=time_limit_s,
                      max_points=max_points)
    return [_simulated(p, "ILP frontier", f"#{k}", iterations, job.seed if seed is None else seed)
            for k, p in enumerate(plans)]


def _simulated(plan: Plan, knob: str, value: Any, iterations: int, seed: int) -> dict[str, Any]:
    sim = simulate_plan(plan, iterations=iterations, seed=seed)
    it, thr = sim.metrics["iteration_s"], sim.metrics["samples_per_s"]
    per_hour = usd_per_hour(plan)
    return {"knob": knob, "value": value, "predicted_s": round(plan.predicted_iteration_s, 3),
            "simulated_s": round(it["mean"], 3), "p99_s": round(it["p99"], 3),
            "samples_per_s": round(thr, 3), "usd_per_hour": round(per_hour, 2),
            "cost_per_sample": per_hour / 3600 / thr if thr > 0 else float("inf"),
            "placement": placement_summary(plan), "plan": plan}


def baselines(job: Job, iterations: int = 2, seed: int | None = None,
              time_limit_s: float = TIME_LIMIT_S) -> list[dict[str, Any]]:
    """The ILP's plan and each baseline's (placer/baselines.py), all simulated."""
    res = resolve(job)
    rows = [evaluate(res, "planner", "ILP", iterations, seed, time_limit_s=time_limit_s)]
    problem = build_problem(res, Calibration())
    for name, a in baseline_assignments(problem).items():
        if a is None:
            rows.append({"knob": "planner", "value": name, "infeasible": "cannot place the job"})
            continue
        rows.append(_simulated(plan_assignment(problem, a, name), "planner", name, iterations,
                               job.seed if seed is None else seed))
    return rows


def _pool(job: Job, name: str) -> Any:
    for p in job.cluster.pools:
        if p.name == name:
            return p
    raise SpecError(f"cluster.pools: no pool {name!r} (pools: "
                    f"{', '.join(p.name for p in job.cluster.pools)})")


def pareto(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows no other row beats on both throughput (higher) and cost per sample (lower)."""
    ok, seen = [], set()
    for r in rows:  # identical points (the same plan reached twice) count once
        if "infeasible" not in r and (r["samples_per_s"], r["cost_per_sample"]) not in seen:
            seen.add((r["samples_per_s"], r["cost_per_sample"]))
            ok.append(r)
    front = [r for r in ok if not any(
        q["samples_per_s"] >= r["samples_per_s"] and q["cost_per_sample"] <= r["cost_per_sample"]
        and (q["samples_per_s"], q["cost_per_sample"]) != (r["samples_per_s"], r["cost_per_sample"])
        for q in ok)]
    return sorted(front, key=lambda r: r["cost_per_sample"])


COLUMNS = ("value", "predicted_s", "simulated_s", "p99_s", "samples_per_s", "usd_per_hour",
           "cost_per_sample", "placement")


def format_rows(rows: list[dict[str, Any]], columns: tuple[str, ...] = COLUMNS) -> str:
    """A plain-text table (the notebooks print it)."""
    def cell(r: dict[str, Any], c: str) -> str:
        if "infeasible" in r and c not in ("value",):
            return r["infeasible"][:70] if c == "predicted_s" else ""
        v = r.get(c, "")
        return f"{v:.3g}" if isinstance(v, float) else str(v)
    cells = [[c for c in columns]] + [[cell(r, c) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    title = rows[0]["knob"] if rows else ""
    return "\n".join([title] + ["  ".join(x.ljust(w) for x, w in zip(row, widths))
                                for row in cells])
