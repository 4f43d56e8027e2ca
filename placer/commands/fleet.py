"""`placer fleet FLEET.yaml`: give every job of a fleet whole nodes under its team's quota.

    placer fleet FLEET.yaml [--json] [--explain] [-o FLEET.json] [--time-limit S]
                            [--job-time-limit S] [--calibration F] [--workers N] [--seed S]
                            [--export kueue DIR [--image IMAGE] [--namespace NS] [--steps N]]
                            [--simulate [--iterations N] [--no-variance | --config SIM.yaml]
                                        [--plots DIR]]
                            [--execute [--steps N] [--out DIR] [--trace T.json]
                                       [--check-weights] [--address ADDR]]

Each job is planned on the nodes the allocation model visits for it (`placer.fleet`); the table
gives each job's nodes, iteration time and iterations per hour, and the objective with its proven
gap over the allocation grids. `--explain` adds each team's use of each pool against its
nominal quota and cap (what it borrows or lends) and each job's roles. `--json` prints one
document (`FleetResult.to_dict`, each job's plan included); `-o` writes it atomically.
`--export kueue DIR` writes Kueue's ResourceFlavors, ClusterQueues (quotas and cohorts) and
LocalQueues, and one KubeRay RayJob per job placed by its plan (`placer.interop.kueue`).
`--simulate` then runs every job's iterations side by side in one simulation, sharing what the
fleet file's `contention` section names (CPU pools, spine links, checkpoint storage,
preemptions; `simulator.fleet`), and reports each job's iteration time alone and in the fleet,
its slowdown and lost work, and the fleet's goodput (`--json`: under `simulation`); `--plots DIR`
writes the fleet's Gantt chart and each team's usage against its quota (`simulator.fleetplots`).
`--execute` runs the plan on an embedded Ray (`executors.fleetrun`): every job its own RL
loop on its plan's nodes, all at once; a shared rollout pool's engines serve its jobs in turns,
each job's weights swapped in before its rollout; it reports each job's step times beside its
planned iteration and each swap measured beside its price (`--json`: under `execution`);
A CPU environment pool the plan shares (`shared.cpu_pools`) runs as one set of environment
workers that every member's sandbox calls queue on, first come first served; the report gives
each member's measured wait there beside the slowdown the plan priced (and, with `--simulate`
in the same command, the simulated one). `--trace` writes the engines' turns (each swap, each
rollout) and the shared CPU pools' calls (each wait, each call) as a Chrome trace.
`--address ADDR` runs on an existing Ray cluster (`auto`, HOST:PORT or ray://HOST:PORT) instead
of an embedded one, token authentication on; bundles are placed by pool there (each job numbers
its own nodes); a malformed or unreachable address exits 2 with one line.
It is a flag of `placer fleet`, not `placer execute`: the fleet's plan is the allocation and
every job's plan together (what `placer execute` reads is one job's plan), and the shared
pools' turns and prices come from the same `FleetResult` the flag runs.
Progress goes to stderr. Exit 2 for a bad fleet file (one line per mistake, naming the job and
the field), 3 for a fleet that cannot fit (naming the job and the resource).
"""
from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from placer.base.errors import SpecError
from placer.base.fileio import atomic_write_text
from placer.base.inputs import check_output
from placer.cli import emit_json, note
from placer.commands.plan import check_solver_arguments
from placer.fleet.result import FleetResult
from placer.fleet.spec import Fleet

if TYPE_CHECKING:
    from executors.fleetrun import FleetExecResult
    from placer.cost.efficiency import Calibration
    from simulator.config import SimConfig
    from simulator.fleetresult import FleetSimResult


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("fleet", metavar="FLEET.yaml")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--explain", action="store_true",
                   help="each team's use of each pool against its quota, each job's roles")
    p.add_argument("-o", "--output", metavar="FLEET.json", help="write the JSON document here")
    p.add_argument("--time-limit", type=float, default=60.0, metavar="S",
                   help="the allocation search's time limit in seconds (default 60)")
    p.add_argument("--job-time-limit", type=float, default=5.0, metavar="S",
                   help="each job plan's solver time limit in seconds (default 5)")
    p.add_argument("--calibration", metavar="F", help="calibration profile (YAML/JSON)")
    p.add_argument("--workers", type=int, default=2, help="CP-SAT search workers (default 2)")
    p.add_argument("--seed", type=int, default=0,
                   help="CP-SAT's random seed and --simulate's (default 0)")
    p.add_argument("--export", nargs=2, metavar=("kueue", "DIR"),
                   help="write Kueue queues and one KubeRay RayJob per job into DIR")
    p.add_argument("--image", help="the RayJobs' image (needs placer installed)")
    p.add_argument("--namespace", default="default",
                   help="the LocalQueues' and RayJobs' namespace (default: default)")
    p.add_argument("--steps", type=int, default=None,
                   help="RL steps each RayJob runs, or --execute runs per job (default 5)")
    p.add_argument("--simulate", action="store_true",
                   help="simulate the jobs side by side: slowdowns, lost work, goodput")
    p.add_argument("--iterations", type=int, default=None,
                   help="iterations of each job --simulate runs (default 4)")
    p.add_argument("--no-variance", action="store_true",
                   help="--simulate with mean lengths and latencies, no stragglers or failures")
    p.add_argument("--config", metavar="SIM.yaml",
                   help="--simulate's settings (simulator.config; failures.restart_s is a "
                        "preempted job's restart)")
    p.add_argument("--plots", metavar="DIR",
                   help="with --simulate: write fleet_gantt.png and fleet_usage.png here")
    p.add_argument("--execute", action="store_true",
                   help="run every job's plan on an embedded Ray (or --address), shared "
                        "rollout engines time-shared with weight swaps, shared CPU pools as "
                        "one queue of environment workers")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="with --execute: each job's checkpoints, ledger, model and trace "
                        "(default out/fleet)")
    p.add_argument("--trace", metavar="T.json",
                   help="with --execute: the shared engines' turns as a Chrome trace")
    p.add_argument("--address", metavar="ADDR",
                   help="with --execute: join the Ray cluster at ADDR (auto, HOST:PORT or "
                        "ray://HOST:PORT) instead of starting an embedded one")
    p.add_argument("--check-weights", action="store_true",
                   help="with --execute: after each swap, compare the engines' weights with "
                        "the job's trainer's")


def run(args: argparse.Namespace) -> int:
    from placer.cost.calibration import load_calibration
    from placer.fleet.planner import plan_fleet
    from placer.fleet.spec import load_fleet

    check_solver_arguments(args)
    if not 0 < args.job_time_limit <= 3600:
        raise SpecError(f"--job-time-limit: must be > 0 and at most 3600 seconds (got "
                        f"{args.job_time_limit!r})")
    check_output(args.output, "--output")
    check_export(args)
    cfg = check_simulate(args)
    check_execute(args)
    fleet = load_fleet(args.fleet)
    if args.export:
        from placer.base.inputs import SpecErrors
        from placer.interop.kueue import name_clashes

        clashes = name_clashes(fleet, args.fleet)
        if clashes:
            raise SpecErrors(clashes)
    calib = load_calibration(args.calibration)
    result = plan_fleet(fleet, calib, time_limit_s=args.time_limit,
                        job_time_limit_s=args.job_time_limit, workers=args.workers,
                        seed=args.seed, progress=note)
    doc = result.to_dict()
    sim = _simulate(args, fleet, result, calib, cfg) if cfg is not None else None
    if sim is not None:
        doc["simulation"] = sim.to_dict()
    if args.export:
        _export(args, fleet, result)
    ran = _execute(args, fleet, result) if args.execute else None
    if ran is not None:
        if sim is not None:
            ran.simulated = simulated_sharing(sim)
        doc["execution"] = ran.summary()
    if args.output:
        atomic_write_text(args.output, json.dumps(doc, indent=2, default=str) + "\n")
        note(f"wrote {args.output}")
    if args.json:
        emit_json(doc)
        return 0
    print(result.render())
    if args.explain:
        print(result.explain())
    if sim is not None:
        print()
        print(sim.render())
    if ran is not None:
        print()
        print("\n".join(ran.render()))
    return 0 if ran is None or ran.ledger_ok else 1


def check_execute(args: argparse.Namespace) -> None:
    """--execute's flags, checked before any planning."""
    if not args.execute:
        for flag in ("out", "trace", "check_weights", "address"):
            if getattr(args, flag) not in (None, False):
                raise SpecError(f"--{flag.replace('_', '-')}: applies to --execute only (got "
                                f"{getattr(args, flag)!r})")
        return
    if args.steps is not None and args.steps < 1:
        raise SpecError(f"--steps: must be at least 1 (got {args.steps})")
    check_output(args.out or "out/fleet", "--out", folder=True)
    check_output(args.trace, "--trace")
    if args.address is not None:
        from executors.cluster import reachable

        reachable(args.address)  # malformed or nothing listening: exit 2 before planning


def simulated_sharing(sim: FleetSimResult) -> dict[str, Any]:
    """The simulation's slowdown of each job and each shared CPU pool's mean wait (by its
    jobs), to set beside what the execution measured."""
    return {"slowdown": {j.name: j.slowdown for j in sim.jobs},
            "pool_wait_s": [(sorted(c.jobs), c.mean_wait_s) for c in sim.cpu_pools]}


def _execute(args: argparse.Namespace, fleet: Fleet, result: FleetResult) -> FleetExecResult:
    from executors.fleetrun import execute_fleet

    say = note if args.json else (lambda m: print(m, flush=True))
    steps = args.steps or 5
    note(f"fleet: executing {len(result.jobs)} jobs, {steps} steps each")
    ran = execute_fleet(fleet, result, steps, args.out or "out/fleet",
                        check_weights=args.check_weights, note=say, address=args.address,
                        progress=lambda job, st: say(f"{job}: step {st.step}: reward "
                                                     f"{st.reward:.3f} time {st.step_s:.2f}s"))
    if args.trace:
        ran.trace.write(args.trace)
        note(f"wrote {args.trace}")
    return ran


def check_simulate(args: argparse.Namespace) -> SimConfig | None:
    """--simulate's settings, checked before any work (None: no simulation)."""
    from placer.spec.load import read_structured
    from simulator.config import SimConfig, config_from_dict

    if not args.simulate:
        for flag in ("iterations", "plots", "no_variance", "config"):
            if getattr(args, flag) not in (None, False):
                raise SpecError(f"--{flag.replace('_', '-')}: applies to --simulate only (got "
                                f"{getattr(args, flag)!r})")
        return None
    if args.iterations is not None and not 1 <= args.iterations <= 10**4:
        raise SpecError(f"--iterations: must be 1 to 10000 (got {args.iterations})")
    check_output(args.plots, "--plots", folder=True)
    if args.no_variance and args.config:
        raise SpecError("--no-variance: cannot be combined with --config")
    if args.config:
        return config_from_dict(read_structured(args.config), args.config)
    return SimConfig.no_variance() if args.no_variance else SimConfig()


def _simulate(args: argparse.Namespace, fleet: Fleet, result: FleetResult,
              calib: Calibration, cfg: SimConfig) -> FleetSimResult:
    from simulator.fleet import simulate_fleet

    note(f"fleet: simulating {len(result.jobs)} jobs side by side, then each alone")
    sim = simulate_fleet(fleet, result, calib, iterations=args.iterations or 4, seed=args.seed,
                         config=cfg, job_time_limit_s=args.job_time_limit)
    if args.plots:
        from simulator.fleetplots import write_fleet_plots

        for path in write_fleet_plots(sim, args.plots):
            note(f"wrote {path}")
    return sim


def check_export(args: argparse.Namespace) -> None:
    from placer.interop.kuberay import check_image, dns_name

    if not args.export:
        for flag in ("image", "namespace") if args.execute else ("image", "steps", "namespace"):
            default = {"image": None, "steps": None, "namespace": "default"}[flag]
            if getattr(args, flag) != default:
                raise SpecError(f"--{flag}: applies to --export only (got {getattr(args, flag)!r})")
        return
    target, folder = args.export
    if target != "kueue":
        raise SpecError(f"--export: the one target is kueue (got {target!r})")
    check_output(folder, "--export", folder=True)
    check_image(args.image)
    if dns_name(args.namespace) != args.namespace:
        raise SpecError(f"--namespace: must be a DNS-1123 label (got {args.namespace!r})")
    if args.execute:
        raise SpecError("--export: cannot be combined with --execute (its --steps would be "
                        "both)")
    if args.steps is not None and not 1 <= args.steps <= 10**6:
        raise SpecError(f"--steps: must be 1 to 1000000 (got {args.steps})")


def _export(args: argparse.Namespace, fleet: Fleet, result: FleetResult) -> None:
    from pathlib import Path

    from placer.interop.kuberay import DEFAULT_IMAGE
    from placer.interop.kueue import export_kueue

    out = export_kueue(fleet, result, image=args.image or DEFAULT_IMAGE,
                       namespace=args.namespace, steps=args.steps or 5)
    folder = Path(args.export[1])
    for name, text in out.files.items():
        atomic_write_text(folder / name, text)
    for w in out.warnings:
        note(f"placer: warning: {w}")
    note(f"wrote {len(out.files)} files to {folder}: {out.command}")
