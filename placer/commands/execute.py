"""`placer execute PLAN.json`: run a plan on Ray (embedded, or `--address` to join a cluster).

Prints one line per step (mean reward, exact answers, step time, policy versions, and per role
its wall time within the step beside its rank-seconds summed over its ranks) to stdout, then a
summary: the set-up phase by phase and the per-role means; or with `--json` one JSON document at
the end (the step lines, and a line as each set-up phase begins, then go to stderr). On a
terminal the set-up phases (starting Ray, reserving placement groups, starting actors and loading
models, ...) show with their elapsed time before the step bar starts. Pools whose devices this
machine lacks run emulated and the output says so. A job file (YAML) may be
given instead of a plan: it is planned first with the ILP. With `--trace T.json` the trace names
its plan (metadata `plan_path`), saved beside it as T.plan.json when a job file was given, so
`placer calibrate T.json` needs no --plan.
"""
from __future__ import annotations

# Heavy imports (ortools, simpy, torch, Ray) wait for `run`: the CLI imports every command
# module to build `placer --help`, and a command pays only for what it runs.
import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from placer.base.errors import SpecError
from placer.base.inputs import check_output
from placer.base.phases import PhaseListener
from placer.cli import emit_json, note

if TYPE_CHECKING:
    from executors.context import StepStat
    from executors.run import ExecResult


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan", metavar="PLAN.json", help="plan from `placer plan` (or a job YAML)")
    p.add_argument("--steps", type=int, default=5, help="RL steps to run (default 5)")
    p.add_argument("--address", help="join the Ray cluster at this address instead of starting one")
    p.add_argument("--trace", help="write the execution trace (Chrome trace JSON) here")
    p.add_argument("--out", default="out/execute", help="checkpoints, ledger, model (default out/execute)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its last checkpoint up to --steps steps")
    from executors.backends import DEFAULT_BACKEND, backends_help  # a light module: the registry
    p.add_argument("--backend", default=DEFAULT_BACKEND,
                   help=f"rollout backend: {backends_help()}")
    p.add_argument("--max-restarts", type=int, default=3, help="actor restarts allowed (default 3)")
    p.add_argument("--deadline", action="append", default=[], metavar="ROLE=SECONDS",
                   help="per-call deadline for rollout or environment calls: a late call is "
                        "re-issued to another worker of the role (repeatable)")
    p.add_argument("--unsafe-sandbox", action="store_true",
                   help="run generated code even where kernel isolation cannot be set up "
                        "(rlimits, seccomp and the cgroup only; UNSAFE, printed loudly)")
    p.add_argument("--json", action="store_true", help="print one JSON document")


def parse_deadlines(items: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items:
        role, _, value = item.partition("=")
        if role not in ("rollout", "environment"):
            raise SpecError(f"--deadline: role must be rollout or environment (got {item!r})")
        try:
            secs = float(value)
        except ValueError:
            secs = float("nan")
        if not secs > 0 or secs == float("inf"):
            raise SpecError(f"--deadline: seconds must be a positive number (got {item!r})")
        out[role] = secs
    return out


def _is_job(path: str) -> bool:
    return Path(path).suffix in (".yaml", ".yml")


def _load(path: str):
    from placer.solve.planfile import load_plan
    if _is_job(path):
        from placer.cost.calibration import load_calibration
        from placer.cost.pricer import Pricer
        from placer.solve.planner import plan_job
        from placer.spec.catalog import resolve
        from placer.spec.load import load_job
        return plan_job(Pricer(resolve(load_job(path), path), load_calibration(None)))
    return load_plan(path)


def plan_beside(trace: str) -> Path:
    """Where a run of a job file (not a plan) saves the plan it made: TRACE.plan.json."""
    return Path(trace).with_suffix(".plan.json")


def name_plan(trace, plan, plan_arg: str, trace_path: str) -> None:
    """Make the trace name its plan (metadata `plan_path`, relative to the trace's folder when
    it can be), saving the plan beside the trace when it was made from a job file, so that
    `placer calibrate TRACE` and `placer fidelity` need no --plan."""
    from placer.solve.planfile import save_plan
    if _is_job(plan_arg):
        where = plan_beside(trace_path)
        save_plan(plan, where)
    else:
        where = Path(plan_arg)
    folder = Path(trace_path).resolve().parent
    try:
        trace.metadata["plan_path"] = str(where.resolve().relative_to(folder))
    except ValueError:  # not below the trace's folder: the absolute path
        trace.metadata["plan_path"] = str(where.resolve())


def run(args: argparse.Namespace) -> int:
    if args.steps < 1:
        raise SpecError(f"--steps: must be at least 1 (got {args.steps})")
    from executors.backends import backend_of  # lazy: with the run (a light module)
    backend_of(args.backend)  # an unknown one exits 2 before any planning or Ray
    if args.max_restarts < 0:
        raise SpecError(f"--max-restarts: must be >= 0 (got {args.max_restarts})")
    deadlines = parse_deadlines(args.deadline)
    if args.address is not None:  # malformed, empty or nothing listening: exit 2 before Ray
        from executors.cluster import reachable

        reachable(args.address)  # (an empty one ran an embedded Ray; a bad port hung in Ray)
    check_output(args.out, "--out", folder=True)  # before Ray starts, not after the run
    check_output(args.trace, "--trace")
    if args.trace and _is_job(args.plan):  # the plan made from the job is saved beside it
        check_output(plan_beside(args.trace), "--trace (its plan, beside it)")
    plan = _load(args.plan)
    from executors.run import execute, resume_point
    start = resume_point(args.out, args.steps, plan) if args.resume else 0  # checked before Ray starts

    show = note if args.json else (lambda m: print(m, flush=True))

    from placer.progress import progress as bar_for  # a bar on stderr, off under --json
    with bar_for("execute", total=args.steps - start, unit="step", json_out=args.json,
                 setup=True) as bar:
        def step_done(st: StepStat) -> None:
            show(step_line(st))
            kl = f", kl {st.rl['kl']:.4f}" if "kl" in st.rl else ""
            bar.advance(info=f"reward {st.reward:.3f}{kl}, {st.step_s:.1f} s/step")

        result = execute(plan, args.steps, args.out, address=args.address, backend=args.backend,
                         max_restarts=args.max_restarts, progress=step_done, note=show,
                         deadlines=deadlines or None, start=start,
                         unsafe_sandbox=args.unsafe_sandbox,
                         on_phase=phase_lines(note) if args.json else bar.phase)
    if args.trace:
        name_plan(result.trace, plan, args.plan, args.trace)
        result.trace.write(args.trace)
    if args.json:
        emit_json(result.summary())
    else:
        print("\n".join(summary_lines(result)))
    return 0 if result.ledger_ok else 1


def _roles(times: dict[str, float], unit: str = "s") -> str:
    return " ".join(f"{r}={t:.2f}{unit}" for r, t in sorted(times.items()))


def step_line(st: StepStat) -> str:
    """One step: its figures, then per role the wall time it was busy within the step (at most
    the step's time) and its rank-seconds (summed over its ranks)."""
    return (f"step {st.step}: reward {st.reward:.3f} exact {st.exact:.2f} "
            f"time {st.step_s:.2f}s policy_version {st.versions} "
            f"wall [{_roles(st.role_wall_s)}] rank-s [{_roles(st.role_rank_s, '')}]"
            + (f" reruns {st.reruns}" if st.reruns else "") + rl_line(st.rl))


def rl_line(rl: dict[str, float]) -> str:
    """The step's RL statistics, short (empty when the step has none)."""
    if not rl:
        return ""
    return (f" | kl {rl['kl']:.4f} entropy {rl['entropy']:.3f} clip {rl['clip_frac']:.3f} "
            f"tis-cut {rl['tis_truncated']:.3f} grad-norm {rl['grad_norm']:.3f} "
            f"len {rl['response_len_mean']:.1f} [{rl['response_len_min']:.0f}, "
            f"{rl['response_len_max']:.0f}] reward [{rl['reward_min']:.3f}, "
            f"{rl['reward_max']:.3f}]")


def phase_lines(say: Callable[[str], None]) -> PhaseListener:
    """Under --json, where no bar is shown: a line on stderr as each set-up phase begins, with
    the set-up's time so far (the per-step lines go there too)."""
    import time
    began = time.monotonic()

    def on_phase(name: str | None) -> None:
        if name is not None:
            say(f"set-up {time.monotonic() - began:.1f}s: {name}")
    return on_phase


def summary_lines(result: ExecResult) -> list[str]:
    """The text summary: the run, its set-up phase by phase (they add up to the set-up time),
    and per role the mean wall time per step beside the mean rank- and device-seconds per step."""
    tail = ("balanced" if result.ledger_ok
            else "NOT balanced: " + "; ".join(result.ledger_problems))
    emu = (f"emulated pools: {', '.join(result.emulated)}" if result.emulated
           else "no emulated pools")
    lines = [f"done: {len(result.stats)} steps, setup {result.setup_s:.1f}s, ledger {tail}, {emu}",
             "set-up: " + ", ".join(f"{p} {t:.1f}s" for p, t in result.setup_phases)]
    means = result.means()
    if result.stats:
        lines.append(f"per step (mean of {len(result.stats)}): {means['step_s']:.2f}s; per role, "
                     "wall = time in the step the role was busy (at most the step), "
                     "rank-s = its busy seconds summed over its ranks, "
                     "device-s = rank-s x the devices each rank holds in the plan")
        lines.append(f"  {'role':<12} {'wall s':>8} {'rank-s':>8} {'device-s':>9}")
        for role, rank_s in means["role_rank_s"].items():
            lines.append(f"  {role:<12} {means['role_wall_s'].get(role, 0.0):>8.2f} "
                         f"{rank_s:>8.2f} {means['role_device_s'].get(role, 0.0):>9.2f}")
    for s in result.stragglers:
        lines.append(f"straggler: step {s['step']} {s['slow_worker']} missed its "
                     f"{s['deadline_s']}s deadline; re-issued to {s['reissued_to']} "
                     f"({s['winner']} won)")
    return lines
