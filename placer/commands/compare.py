"""`placer compare JOB.yaml`: the ILP's plan against every baseline on the same job and cost model.

    placer compare JOB.yaml [--json] [--simulate [--iterations N] [--ci F] [--sim-seed S]]
                            [--time-limit S] [--calibration F] [--objective time|cost]
                            [--framework F|all]

For each plan: predicted iteration time, throughput, cost per sample, where the roles sit, and
the ratio of its time to the ILP's (> 1: the baseline is slower), and its rank (1 = fastest)
by predicted time, by its error band's low end and by its high end (`placer.solve.robust.ranks`):
where they differ, which plan is fastest depends on where in the band the truth lies. With
`--simulate`, every plan is also run through the simulator and ranked by its steady-state
iteration time (`simulator.steady`: warm-up and drain excluded, iterations added until the 95% confidence
interval is within `--ci` of the mean or a cap; `--iterations N` simulates exactly N). Plans that
place every role the same way are simulated once. A plan whose interval overlaps the ILP's is
marked tied with it: the simulation cannot tell them apart. On a terminal (not with `--json`)
a spinner on stderr names what is under way (planning the ILP, the baselines, simulating plan
k/n) with its elapsed time. `--framework F` compares the plans of framework F
(`placer.spec.framework`); `--framework all` instead shows the ILP's best plan for each
framework side by side (`placer.commands.frameworks`).
"""
from __future__ import annotations

# Heavy imports (ortools, simpy, torch, Ray) wait for `run`: the CLI imports every command
# module to build `placer --help`, and a command pays only for what it runs.
import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from placer.base.errors import SpecError
from placer.base.phases import PhaseClock, PhaseListener
from placer.cli import emit_json
from placer.commands.plan import add_framework_argument, add_solver_arguments, load_inputs
from placer.commands.simulate import add_steady_arguments, steady_targets
from placer.cost.efficiency import Calibration
from placer.solve.planfile import Plan
from placer.spec.catalog import Resolved

if TYPE_CHECKING:
    from simulator.steady import SteadyState


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", metavar="JOB.yaml")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--simulate", action="store_true", help="also rank by simulated time")
    add_steady_arguments(p)
    p.add_argument("--sim-seed", type=int, default=0, help="simulator seed (default 0)")
    add_solver_arguments(p)
    add_framework_argument(p, every=True)


def _simulator(args: argparse.Namespace) -> Callable[[Plan], SteadyState]:
    """Plan -> its steady state, as `--iterations`/`--ci`/`--sim-seed` ask."""
    try:
        from simulator.api import simulate_plan
        from simulator.steady import simulate_steady, steady_state
    except ModuleNotFoundError as e:
        if e.name in ("simulator", "simulator.api", "simulator.steady"):
            raise SpecError(f"--simulate: the simulator is missing (no module {e.name})") \
                from None
        raise
    _, rel = steady_targets(args)

    def run(p: Plan) -> SteadyState:
        if args.iterations is None:
            return simulate_steady(p, seed=args.sim_seed, rel_ci=rel)[1]
        return steady_state(simulate_plan(p, iterations=args.iterations, seed=args.sim_seed), rel)
    return run


def _same_placement(p: Plan) -> str:
    """Plans equal in everything the simulator runs (the name of the solver aside)."""
    return p.model_dump_json(include={"mode", "roles", "slots", "bundles", "sync_routes",
                                      "calibration"})


def placement(p: Plan) -> dict[str, str]:
    """Where each role sits: `POOLxN tpT ppP dpD [slot]`, with cp/ep/etp where above 1
    (`placer.solve.moves.dims`, the notation `placer explain` and `diff` print); a split role: each
    part's `POOLxN tpT ppP dpD` joined by " + "."""
    from placer.solve.moves import dims

    def one(x) -> str:
        if x.parts:
            return " + ".join(f"{q.pool}x{q.devices} {dims(q.par)}" for q in x.parts)
        return f"{x.pool}x{x.devices} {dims(x)}"
    return {r: f"{one(x)} [{x.slot}]" for r, x in p.roles.items()}


def _devices(placed: str) -> str:
    """`POOLxN` of a `placement` entry; a split role's parts joined by "+"."""
    return "+".join(part.split(" ")[0] for part in placed.split(" [")[0].split(" + "))


def plans_for(res: Resolved, calib: Calibration, args: argparse.Namespace,
              on_phase: PhaseListener | None = None) -> dict[str, Plan | None]:
    """The ILP's plan and every baseline's, all through `assemble` (each records `calib`);
    `on_phase` is told which is being planned."""
    from placer.cost.pricer import Pricer
    from placer.solve.planner import plan_job
    from placer.solve.robust import alternatives

    clock = PhaseClock(on_phase)
    clock.begin("planning: the ILP")
    ilp = plan_job(Pricer(res, calib), time_limit_s=args.time_limit, objective=args.objective,
                   workers=args.workers, seed=args.seed)
    clock.begin("planning: the baselines")
    out = alternatives(Pricer(res, calib), ilp, args.objective)
    clock.end()
    return out


def run(args: argparse.Namespace) -> int:
    if args.sim_seed < 0:  # the simulator's seed sequences take non-negative integers only
        raise SpecError(f"--sim-seed: must be >= 0 (got {args.sim_seed})")
    if args.framework == "all":
        if args.simulate:
            raise SpecError("--simulate: compares one framework's plans (got --framework all)")
        from placer.commands.frameworks import compare_frameworks
        return compare_frameworks(args)
    simulate = _simulator(args) if args.simulate else None
    res, calib = load_inputs(args)
    from placer.progress import progress  # a spinner on stderr, off under --json
    from placer.solve.robust import ranks

    with progress("compare", json_out=args.json) as bar:
        plans = plans_for(res, calib, args, bar.phase)
        rows = _rows(plans, simulate, bar.phase)
    for name, rk in ranks(plans).items():
        rows[name]["rank"] = rk
    base = plans["ilp"]
    assert base is not None, "plan_job returns a plan or raises Infeasible"
    if simulate is not None:
        ilp = rows["ilp"]
        for r in rows.values():
            if r["applicable"]:
                r["simulated_ratio_to_ilp"] = r["simulated_iteration_s"] / ilp["simulated_iteration_s"]
                r["tied_with_ilp"] = _overlap(r["simulated_ci95_s"], ilp["simulated_ci95_s"])
    key = "simulated_iteration_s" if simulate is not None else "predicted_iteration_s"
    ranking = sorted((n for n, r in rows.items() if r["applicable"]), key=lambda n: rows[n][key])
    doc = {"job": res.job.name, "mode": res.job.pipeline.mode, "objective": base.objective,
           "ranked_by": key, "ranking": ranking, "plans": rows,
           "solver": base.solver.model_dump()}
    if args.json:
        emit_json(doc)
    else:
        print(render(doc))
    return 0


def _rows(plans: dict[str, Plan | None], simulate: Callable[[Plan], SteadyState] | None,
          on_phase: PhaseListener | None = None) -> dict[str, dict[str, Any]]:
    """One row per plan: its predicted figures and, with `simulate`, its steady state (plans
    placed the same way simulated once); `on_phase` is told "simulating plan k/n (NAME)"."""
    base = plans["ilp"]
    assert base is not None, "plan_job returns a plan or raises Infeasible"
    clock = PhaseClock(on_phase)
    seen: dict[str, SteadyState] = {}
    distinct = len({_same_placement(p) for p in plans.values() if p is not None})
    rows: dict[str, dict[str, Any]] = {}
    for name, p in plans.items():
        if p is None:
            rows[name] = {"applicable": False}
            continue
        band = p.predicted_iteration_s_band
        row = {"applicable": True, "predicted_iteration_s": p.predicted_iteration_s,
               "predicted_iteration_s_band": None if band is None else list(band),
               "throughput_samples_s": p.throughput_samples_s,
               "cost_per_sample": p.cost_per_sample,
               "ratio_to_ilp": p.predicted_iteration_s / base.predicted_iteration_s,
               "cost_ratio_to_ilp": (p.cost_per_sample / base.cost_per_sample
                                     if base.cost_per_sample else None),
               "placement": placement(p)}
        if simulate is not None:
            key = _same_placement(p)
            if key not in seen:
                clock.begin(f"simulating plan {len(seen) + 1}/{distinct} ({name})")
                seen[key] = simulate(p)
            row.update(_simulated(seen[key]))
        rows[name] = row
    clock.end()
    return rows


def _simulated(st: SteadyState) -> dict[str, Any]:
    return {"simulated_iteration_s": st.iteration_s,
            "simulated_ci95_s": None if st.ci95_s is None else list(st.ci95_s),
            "simulated_samples_per_s": st.samples_per_s,
            "simulated_samples_per_s_ci95": (None if st.samples_per_s_ci95 is None
                                             else list(st.samples_per_s_ci95)),
            "simulation": st.to_dict()}


def _overlap(a: list[float] | None, b: list[float] | None) -> bool | None:
    """Do two intervals overlap (None: one of them is unknown)?"""
    if a is None or b is None:
        return None
    return a[0] <= b[1] and b[0] <= a[1]


def render(doc: dict[str, Any]) -> str:
    sim = doc["ranked_by"] == "simulated_iteration_s"
    head = (f"{'plan':<16} {'iteration s':>12} {'band s':>17} {'rank p/lo/hi':>12} "
            f"{'samples/s':>10} {'USD/sample':>11} "
            f"{'x ILP time':>10} {'x ILP cost':>10}"
            + (f" {'simulated s':>12} {'95% CI':>7} {'sim smp/s':>9} {'x ILP sim':>9}"
               if sim else "") + "  placement")
    lines = [f"compare on {doc['job']} ({doc['mode']} mode, objective {doc['objective']}; "
             f"ranked by {'simulated steady-state' if sim else 'predicted'} time)", head]
    for name in doc["ranking"] + [n for n, r in doc["plans"].items() if not r["applicable"]]:
        r = doc["plans"][name]
        if not r["applicable"]:
            lines.append(f"{name:<16} {'n/a (does not apply to this job)':>12}")
            continue
        where = ", ".join(f"{role}:{_devices(p)}" for role, p in r["placement"].items())
        cr = r["cost_ratio_to_ilp"]
        b = r["predicted_iteration_s_band"]
        rk = "/".join(str(r["rank"][k]) for k in ("predicted", "lo", "hi"))
        line = (f"{name:<16} {r['predicted_iteration_s']:>12.3f} "
                f"{(f'{b[0]:.3f}-{b[1]:.3f}' if b else '-'):>17} "
                f"{rk:>12} "
                f"{r['throughput_samples_s']:>10.2f} {r['cost_per_sample']:>11.6f} "
                f"{r['ratio_to_ilp']:>10.2f} {(f'{cr:.2f}' if cr is not None else '-'):>10}")
        if sim:
            rel = r["simulation"]["rel_half_width"]
            tie = " (tied)" if r["tied_with_ilp"] and name != "ilp" else ""
            line += (f" {r['simulated_iteration_s']:>12.3f} "
                     f"{(f'+-{rel:.1%}' if rel is not None else '-'):>7} "
                     f"{r['simulated_samples_per_s']:>9.2f} "
                     f"{r['simulated_ratio_to_ilp']:>9.2f}{tie}")
        lines.append(f"{line}  {where}")
    if sim:
        lines.append(_sim_note(doc))
    return "\n".join(lines)


def _sim_note(doc: dict[str, Any]) -> str:
    """How the simulated figures were measured (from the ILP's run; every plan's is in --json)."""
    ss = doc["plans"]["ilp"]["simulation"]
    short = [n for n, r in doc["plans"].items()
             if r["applicable"] and not r["simulation"]["converged"]]
    if not ss["warmup_excluded"]:
        return (f"WARNING: {ss['iterations']} simulated iteration(s) are too few to leave out the "
                f"pipeline's warm-up and drain: the figures are not steady state and may rank the "
                f"plans wrongly (drop --iterations to measure until the mean is stable)")
    return (f"simulated: steady state, {ss['warmup']} warm-up and {ss['drain']} drain iteration(s) "
            f"excluded, 95% CI over batches of {ss['batch_size']}; ILP: {ss['measured']} of "
            f"{ss['iterations']} iterations measured"
            + (f"; CI wider than the target for: {', '.join(short)}" if short else ""))
