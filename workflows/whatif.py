"""What-if sweeps: the questions asked before buying or booking hardware.

Each sweep changes one thing about a job, re-plans it with the ILP (so every point shows the best
placement for that hardware, not a fixed one), simulates the plan, and returns one row per point:
knob, value, predicted_s (the plan's), simulated_s / p99_s, samples_per_s, usd_per_hour and
booked_usd_per_hour (the whole cluster, idle nodes included: `placer.solve.pricing`),
cost_per_sample and booked_cost_per_sample, placement (slot@pool xdevices, ...); or, where the job
cannot be placed, the planner's diagnosis in `infeasible`. Without simulation the throughput and
cost per sample are the plan's predicted ones.

Simulated figures are the steady state's (`simulator.steady`, as `placer simulate` reports):
warm-up and drain left out, which matters in async mode. `iterations=None` (the default)
simulates until the mean's 95% interval is within 5%; `iterations=N` simulates exactly N and
measures their steady window. `p99_s` is over every simulated iteration.

  pool_nodes(job, pool, counts)        LPU chip count (an LPU pool's nodes), CPU pool size, ...
  gpu_mix(job, a, b, mixes)            how many nodes of two GPU pools, e.g. H100 vs L40S
  response_tail(job, sigmas)           the lognormal response length's sigma (median kept)
  staleness(job, bounds)               sync (0) against async with a staleness bound
  frontier(job)                        the ILP's own time/cost frontier on the job's cluster
  baselines(job)                       the ILP's plan against the baselines (placer/solve/baselines.py)
  pareto(rows)                         the throughput/cost frontier of any rows
  grid(job, varies, simulate=...)      any fields at once: the cartesian product of `Vary`s
                                       (`parse_vary("POOL.nodes=1..8")`), each point planned and,
                                       if asked, simulated; what `placer sweep` runs

Every random draw comes from the job's seed (`seed=` overrides it).
"""
from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from placer.base.errors import Infeasible, SpecError
from placer.base.phases import PhaseClock, PhaseListener
from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.solve.baselines import baseline_assignments
from placer.solve.planfile import Plan
from placer.solve.planner import build_problem, plan_assignment, plan_job, sweep_job
from placer.solve.pricing import booked_per_hour, usd_per_hour
from placer.spec.catalog import Resolved, resolve, with_nodes
from placer.spec.job import Job
from placer.spec.load import dump_job, job_from_dict
from simulator.api import check_size, simulate_plan
from simulator.steady import simulate_steady, steady_state

TIME_LIMIT_S = 2.0  # per point: the sweeps are for exploring; `placer plan` solves properly


def placement_summary(plan: Plan) -> str:
    """`slot@pool xN` per slot; a split role's slot: `slot@a xN+b xM`, each pool's devices."""
    return "; ".join(f"{s.name}@" + "+".join(f"{pool} x{n}" for pool, n in s.pool_devices())
                     for s in plan.slots)


def evaluate(res: Resolved, knob: str, value: Any, iterations: int | None = None,
             seed: int | None = None,
             calib: Calibration | None = None, time_limit_s: float = TIME_LIMIT_S,
             simulate: bool = True, solver: dict[str, Any] | None = None,
             phases: PhaseClock | None = None, what: str = "") -> dict[str, Any]:
    """Plan and (unless `simulate` is off) simulate one point of a sweep; `solver` holds more
    `plan_job` options (objective, workers, seed); `phases` is told "planning WHAT" and
    "simulating WHAT" as each begins (`what`: the point, by default its value)."""
    row: dict[str, Any] = {"knob": knob, "value": value}
    clock, what = phases or PhaseClock(), what or str(value)
    clock.begin(f"planning {what}")
    try:
        plan = plan_job(Pricer(res, calib or Calibration()), time_limit_s=time_limit_s, **(solver or {}))
    except Infeasible as e:
        return row | {"infeasible": str(e).splitlines()[0]}
    if not simulate:
        return _predicted(plan, knob, value)
    clock.begin(f"simulating {what}")
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


def frontier(job: Job, max_points: int = 5, iterations: int | None = None,
             seed: int | None = None,
             time_limit_s: float = TIME_LIMIT_S) -> list[dict[str, Any]]:
    """The ILP's own time/cost frontier on the job's cluster (`planner.sweep_job`), simulated."""
    plans = sweep_job(Pricer(resolve(job), Calibration()), time_limit_s=time_limit_s,
                      max_points=max_points)
    return [_simulated(p, "ILP frontier", f"#{k}", iterations, job.seed if seed is None else seed)
            for k, p in enumerate(plans)]


def _simulated(plan: Plan, knob: str, value: Any, iterations: int | None,
               seed: int) -> dict[str, Any]:
    """A row at the plan's simulated steady state (see the module docstring)."""
    if iterations is None:
        sim, st = simulate_steady(plan, seed=seed)
    else:
        sim = simulate_plan(plan, iterations=iterations, seed=seed)
        st = steady_state(sim)
    return _row(plan, knob, value, st.samples_per_s) | {
        "simulated_s": round(st.iteration_s, 3),
        "p99_s": round(sim.metrics.iteration_s.p99, 3),
        "ci95_s": None if st.ci95_s is None else [round(x, 3) for x in st.ci95_s],
        "converged": st.converged, "iterations": st.iterations}


def _predicted(plan: Plan, knob: str, value: Any) -> dict[str, Any]:
    return _row(plan, knob, value, plan.throughput_samples_s)


def _row(plan: Plan, knob: str, value: Any, thr: float) -> dict[str, Any]:
    """A sweep row at throughput `thr` (simulated or predicted samples per second)."""
    per_hour, booked = usd_per_hour(plan), booked_per_hour(plan.resolved())
    band = plan.predicted_iteration_s_band
    return {"knob": knob, "value": value, "predicted_s": round(plan.predicted_iteration_s, 3),
            "predicted_s_band": None if band is None else [round(x, 3) for x in band],
            "samples_per_s": round(thr, 3), "usd_per_hour": round(per_hour, 2),
            "cost_per_sample": per_hour / 3600 / thr if thr > 0 else float("inf"),
            "booked_usd_per_hour": round(booked, 2),
            "booked_cost_per_sample": booked / 3600 / thr if thr > 0 else float("inf"),
            "placement": placement_summary(plan), "plan": plan}


def baselines(job: Job, iterations: int | None = None, seed: int | None = None,
              time_limit_s: float = TIME_LIMIT_S) -> list[dict[str, Any]]:
    """The ILP's plan and each baseline's (placer/solve/baselines.py), all simulated."""
    res = resolve(job)
    rows = [evaluate(res, "planner", "ILP", iterations, seed, time_limit_s=time_limit_s)]
    problem = build_problem(Pricer(res, Calibration()))
    for name, a in baseline_assignments(problem).items():
        if a is None:
            rows.append({"knob": "planner", "value": name, "infeasible": "cannot place the job"})
            continue
        rows.append(_simulated(plan_assignment(problem, a, name), "planner", name, iterations,
                               job.seed if seed is None else seed))
    return rows


# ------------------------------------------------------------------------------------ grids
MAX_GRID_POINTS = 256  # one ILP solve (and simulation) per point
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class Vary:
    """One field of the job and the values it takes: `path` is dotted into the job document
    (`lengths.response.cap`, `batch.prompts`), or starts with a pool's name (`gen.nodes`,
    where 0 nodes removes the pool)."""

    path: str
    values: tuple[Any, ...]


def parse_vary(text: str) -> Vary:
    """`PATH=LO..HI` (whole numbers, both ends included) or `PATH=V1,V2,...` (numbers or words)."""
    path, sep, spec = text.partition("=")
    path, spec = path.strip(), spec.strip()
    if not sep or not path or not spec:
        raise SpecError(f"--vary: expected PATH=LO..HI or PATH=V1,V2,... (got {text!r})")
    if ".." in spec:
        lo, _, hi = spec.partition("..")
        try:
            a, b = int(lo), int(hi)
        except ValueError:
            raise SpecError(f"--vary {path}: a range takes whole numbers, LO..HI (got "
                            f"{spec!r})") from None
        if b < a or b - a >= MAX_GRID_POINTS:
            raise SpecError(f"--vary {path}: the range {spec} must run upwards over at most "
                            f"{MAX_GRID_POINTS} values")
        return Vary(path, tuple(range(a, b + 1)))
    items = [x.strip() for x in spec.split(",")]
    if any(not x for x in items):
        raise SpecError(f"--vary {path}: an empty value in {spec!r}")
    return Vary(path, tuple(_scalar(x) for x in items))


def _scalar(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def set_path(job: Job, path: str, value: Any) -> Job:
    """The job with the field at `path` set to `value`, validated (SpecError naming both)."""
    head, _, rest = path.partition(".")
    pools = [p.name for p in job.cluster.pools]
    if head in pools and rest == "nodes":  # through with_nodes: 0 removes the pool
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise SpecError(f"--vary {path}: a node count is a whole number >= 0 (got {value!r})")
        try:
            return with_nodes(job, {head: value}, f"--vary {path}={value}").job
        except Infeasible as e:
            raise SpecError(f"--vary {path}={value}: {e}") from None
    keys: list[Any] = (["cluster", "pools", pools.index(head), *rest.split(".")]
                       if head in pools and rest else path.split("."))
    data = dump_job(job)
    node: Any = data
    for depth, key in enumerate(keys[:-1]):
        node = node.get(key) if isinstance(node, dict) else (
            node[key] if isinstance(node, list) else None)
        if not isinstance(node, (dict, list)):
            where = ".".join(map(str, keys[:depth + 1]))
            raise SpecError(f"--vary {path}: {where} is not a section of the job (pools: "
                            f"{', '.join(pools)})")
    node[keys[-1]] = value
    try:
        return job_from_dict(data, f"--vary {path}={value}")
    except SpecError as e:
        raise SpecError(str(e).splitlines()[0]) from None


def point_label(varies: list[Vary], point: tuple[Any, ...]) -> str:
    return ", ".join(f"{v.path}={x}" for v, x in zip(varies, point))


def grid(job: Job, varies: list[Vary], simulate: bool = False, iterations: int | None = None,
         seed: int | None = None, calib: Calibration | None = None,
         time_limit_s: float = TIME_LIMIT_S, progress: Progress | None = None,
         solver: dict[str, Any] | None = None,
         on_phase: PhaseListener | None = None) -> list[dict[str, Any]]:
    """Every combination of the `varies`' values, planned (and simulated): one row each, with
    `point` (path -> value). Every point's job is built and checked before the first solve.
    `on_phase` is told what is under way: checking the points, planning point i/n (label),
    simulating point i/n (label); None at the end."""
    points = list(itertools.product(*(v.values for v in varies)))
    if len(points) > MAX_GRID_POINTS:
        raise SpecError(f"--vary: {len(points)} points exceed the {MAX_GRID_POINTS} a sweep "
                        "plans (one solve each)")
    clock = PhaseClock(on_phase)
    clock.begin(f"checking the {len(points)} points' jobs")
    jobs = []
    for pt in points:
        j = job
        for v, x in zip(varies, pt):
            j = set_path(j, v.path, x)
        if simulate:  # a point too big to simulate fails now, not after the solves before it
            check_size(resolve(j), iterations or 1)  # a steady run stays within the bound
        jobs.append(j)
    rows = []
    for i, (pt, j) in enumerate(zip(points, jobs)):
        label = point_label(varies, pt)
        if progress is not None:
            progress(i, len(points), label)
        row = evaluate(resolve(j), "sweep", label, iterations, seed, calib, time_limit_s,
                       simulate, solver, clock, f"point {i + 1}/{len(points)} ({label})")
        rows.append(row | {"point": dict(zip((v.path for v in varies), pt))})
    clock.end()
    return rows


def _pool(job: Job, name: str) -> Any:
    for p in job.cluster.pools:
        if p.name == name:
            return p
    raise SpecError(f"cluster.pools: no pool {name!r} (pools: "
                    f"{', '.join(p.name for p in job.cluster.pools)})")


def pareto(rows: list[dict[str, Any]], cost: str = "cost_per_sample") -> list[dict[str, Any]]:
    """Rows no other row beats on both throughput (higher) and `cost` (lower; the sweep command
    ranks by `booked_cost_per_sample`, what the booking of each point costs)."""
    ok, seen = [], set()
    for r in rows:  # identical points (the same plan reached twice) count once
        if "infeasible" not in r and (r["samples_per_s"], r[cost]) not in seen:
            seen.add((r["samples_per_s"], r[cost]))
            ok.append(r)
    front = [r for r in ok if not any(
        q["samples_per_s"] >= r["samples_per_s"] and q[cost] <= r[cost]
        and (q["samples_per_s"], q[cost]) != (r["samples_per_s"], r[cost])
        for q in ok)]
    return sorted(front, key=lambda r: r[cost])


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
