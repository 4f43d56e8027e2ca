"""Readable tables of plans: one plan, and a time/cost frontier.

The library owns these so that the CLI, the benchmarks and the notebooks print the same table;
the `placer plan` and `placer replan` commands only call them.
"""
from __future__ import annotations

from collections.abc import Sequence

from placer.solve.planfile import Plan, RolePlacement, SlotPlan
from placer.solve.pricing import usd_per_hour


def render_plan(plan: Plan, release: Sequence[str] = ()) -> str:
    """The readable table of one plan; `release` lines (`placer.solve.booking.releases`) follow
    the booked-against-used cost."""
    s = plan.solver
    job = plan.spec
    unit = "s" if plan.objective == "time" else "USD/sample"
    w = max([12, *(len(n) for n in plan.roles)])  # an agent's roles are AGENT.ROLE
    lines = [f"plan for {job.name}: {job.algorithm.value}, {plan.mode} "
             f"mode, objective {plan.objective}",
             f"solver: {s.name} {s.status}, objective {s.objective:.6g} {unit}, bound "
             f"{s.bound:.6g}, gap {s.gap:.2%}, {s.solve_s:.2f} s",
             f"predicted iteration {plan.predicted_iteration_s:.3f} s | "
             f"{plan.throughput_samples_s:.2f} samples/s | {plan.cost_per_sample:.6f} USD/sample | "
             f"{usd_per_hour(plan):.2f} USD/h",
             *_band(plan), *_booking(plan, release), "",
             f"{'role':<{w}} {'pool':<8} {'devices':>7} {'tp':>3} {'pp':>3} {'dp':>5} "
             f"{'cp':>3} {'ep':>3} {'slot':<28} {'time s':>9} {'mem GB':>7}"]
    for name, r in plan.roles.items():
        lines += _role_lines(name, r, w)
    lines += [f"{name}: dp {r.dp} (shard {r.shard}): HSDP, ZeRO inside {r.dp // r.shard} groups of "
              f"{r.shard} dp ranks that replicate each other" for name, r in plan.roles.items()
              if 0 < r.shard < r.dp]
    lines += [f"{name}: attention data-parallel in {r.attn_dp} groups of {r.tp // r.attn_dp} "
              f"rank(s) per replica, each with its own KV cache; experts over ep {r.ep}"
              for name, r in plan.roles.items() if r.attn_dp > 1]
    lines += [f"{name}: micro-batch {r.micro_batch} sequence(s) per device (the fastest tried "
              "that fits the device)" for name, r in plan.roles.items() if r.micro_batch > 0]
    lines += [f"{name}: optimizer state parked in host memory between phases ({r.parked_gb:.1f} "
              "GB per device), brought back for the step on the GPU" for name, r in
              plan.roles.items() if r.park_optimizer]
    lines += [f"{name}: weights held in host memory ({r.stream_params_bytes:g} B a parameter) and "
              "streamed to the GPU on every forward micro-batch (FSDP CPU offload)"
              for name, r in plan.roles.items() if r.stream_params_bytes > 0]
    lines += ["", f"{'slot':<28} {'pool':<8} {'devices':>7} {'nodes':>6}  busy s"]
    for sl in plan.slots:
        lines += _slot_lines(sl, plan.breakdown.slot_busy_s.get(sl.name, 0.0))
    st = plan.breakdown.stage_s
    lines.append("")
    lines.append("stages: " + ", ".join(f"{k} {v:.3f} s" for k, v in st.items()) +
                 f" ({'busiest slot' if plan.pipeline.overlaps_steps else 'sum of stages'})")
    lines.append(f"bundles: {len(plan.bundles)}, weight-sync routes: {len(plan.sync_routes)}")
    return "\n".join(lines)


def _role_lines(name: str, r: RolePlacement, w: int = 12) -> list[str]:
    """A role's row; a role split over pools shows "split" and its total, then one row per part
    (its pool, devices, layout, share of the samples and time), so no row claims one pool holds
    devices it does not."""
    if not r.parts:
        return [f"{name:<{w}} {r.pool:<8} {r.devices:>7} {r.tp:>3} {r.pp:>3} {r.dp:>5} "
                f"{r.cp:>3} {r.ep:>3} {r.slot:<28} {r.time_s:>9.3f} {r.memory_gb:>7.1f}"]
    head = (f"{name:<{w}} {'split':<8} {r.devices:>7} {'':>3} {'':>3} {'':>5} {'':>3} {'':>3} "
            f"{r.slot:<28} {r.time_s:>9.3f} {r.memory_gb:>7.1f}")
    return [head] + [
        f"{f'  part {i + 1}':<{w}} {p.pool:<8} {p.devices:>7} {p.tp:>3} {p.pp:>3} {p.dp:>5} "
        f"{1:>3} {p.ep:>3} {f'{p.share:.1%} of samples ({p.samples})':<28} {p.time_s:>9.3f} "
        f"{p.memory_gb:>7.1f}" for i, p in enumerate(r.parts)]


def _slot_lines(sl: SlotPlan, busy: float) -> list[str]:
    """A slot's row; a split role's slot lists its devices and nodes on each pool under it."""
    if not sl.parts:
        return [f"{sl.name:<28} {sl.pool:<8} {sl.devices:>7} {len(set(sl.nodes)):>6}  "
                f"{busy:.3f}"]
    nodes = sum(len(set(p.nodes)) for p in sl.parts)
    return [f"{sl.name:<28} {'split':<8} {sl.devices:>7} {nodes:>6}  {busy:.3f}"] + [
        f"{'  on ' + p.pool:<28} {p.pool:<8} {p.devices:>7} {len(set(p.nodes)):>6}  "
        f"nodes {', '.join(map(str, sorted(set(p.nodes))))}" for p in sl.parts]


def where(r: RolePlacement) -> str:
    """A role's devices in one phrase: `POOLxN`, or each part's `POOLxN (share)` joined by " + "."""
    if not r.parts:
        return f"{r.pool}x{r.devices}"
    return " + ".join(f"{p.pool}x{p.devices} ({p.share:.0%})" for p in r.parts)


def band_range(plan: Plan) -> str:
    """The band as `lo-hi s`, or "-" for a plan written before bands were recorded."""
    b = plan.predicted_iteration_s_band
    return "-" if b is None else f"{b[0]:.3f}-{b[1]:.3f}"


def _band(plan: Plan) -> list[str]:
    src = plan.band_source
    if plan.predicted_iteration_s_band is None or src is None:
        return []
    rows = ", ".join(f"{r.name.split(' ')[0]} {r.error:+.0%}" for r in src.rows)
    return [f"band {band_range(plan)} s: leave-one-out errors of the {len(src.rows)} most "
            f"similar published runs to {', '.join(f'{k} {v}' for k, v in src.tags.items())} "
            f"({rows}), widened {src.widen:.0%} for the tags they do not share"]


def _booking(plan: Plan, release: Sequence[str]) -> list[str]:
    if not plan.booked_usd_per_hour:  # a plan written before booking was recorded
        return []
    return [f"booked {plan.booked_usd_per_hour:.2f} USD/h for the whole cluster "
            f"({plan.booked_cost_per_sample:.6f} USD/sample), used {plan.used_usd_per_hour:.2f} "
            f"USD/h ({plan.cost_per_sample:.6f} USD/sample)", *(f"  {r}" for r in release)]


def render_frontier(plans: list[Plan]) -> str:
    """The time/cost Pareto frontier, one plan a line, fastest first."""
    lines = ["time/cost Pareto frontier (fastest first)",
             f"{'#':>2} {'iteration s':>12} {'band s':>17} {'samples/s':>10} {'USD/sample':>11} "
             f"{'USD/h':>9}  placement"]
    for i, p in enumerate(plans):
        placed = ", ".join(f"{r}:{where(x)}" for r, x in p.roles.items())
        lines.append(f"{i:>2} {p.predicted_iteration_s:>12.3f} {band_range(p):>17} "
                     f"{p.throughput_samples_s:>10.2f} "
                     f"{p.cost_per_sample:>11.6f} {usd_per_hour(p):>9.2f}  {placed}")
    return "\n".join(lines)
