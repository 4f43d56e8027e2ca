"""Engine groups: the rollout role's replicas, one group per pool the role runs on.

A rollout role on one pool is one group: `rollout_shape` of the role's layout gives its replicas
and each replica's concurrency, and the iteration's rows are dealt round-robin over the replicas.

A rollout role split over pools (`placer.cost.split`, the plan's `roles.rollout.parts`) is one group
per part, each with its own device type, layout and replicas, priced as the planner prices the
part: `rollout_shape` on the job of the part's own samples (`Resolved.with_samples`), so
a part's engines hold the concurrency the planner gave them. The dispatch rule (the plan
contract): rows are dealt to the parts in order as contiguous index ranges, part i taking
`parts[i].samples` rows of the kept batch (group-aligned counts keep GRPO groups whole); rows
beyond the kept batch (over-provisioning's extra samples) are dealt by the same shares, largest
remainder first, and a step that runs fewer rows than the batch (partial rollouts after whole
groups are taken) deals them by the shares likewise. Inside a part, rows go round-robin over its
replicas. Over-provisioning's quota and partial rollouts stay global over all parts (one `Quota`,
one carried set), and every part's tool calls queue on the one environment core pool.

The split role's slot lists its devices part by part (`SlotPlan.parts`), so part i's devices are
the slot's devices [offset_i, offset_i + devices_i): stragglers on those devices slow that part's
replicas only (`simulator.faults.replica_slowdowns`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from placer.base.roles import Role
from placer.cost.batching import StepTerms
from placer.cost.generation import lpu_chips
from placer.cost.pricer import Pricer
from placer.cost.split import deal
from placer.cost.vision import rollout_encode_s
from placer.solve.planfile import Plan
from placer.spec.hardware import DeviceKind
from simulator.engine import Engine, EngineSpec, Quota
from simulator.environment import CorePool
from simulator.faults import replica_slowdowns
from simulator.recorder import Recorder
from simulator.workload import Samples


@dataclass(frozen=True)
class Group:
    """The replicas of the rollout role on one pool."""

    spec: EngineSpec
    steps: StepTerms  # shared by the group's replicas
    replicas: int
    replica_size: int  # devices of one replica (an LPU placement: its chips)
    first: int  # index of its first engine: thread ids stay unique within the slot
    offset: int  # its first device among the slot's (straggler factors)
    devices: int | None  # its devices in the slot; None: the role's single group, whole slot
    samples: int  # rows of the kept batch it generates
    busy_div: float  # an engine's busy seconds / this = its share of the slot's device-seconds
    part_div: float  # an engine's busy seconds / this = its share of the group's device-seconds


def groups_of(px: Pricer, plan: Plan) -> list[Group]:
    """The rollout role's engine groups, in part order (one group when it is on one pool); each
    group's replicas share the pricer's `StepTerms` of their layout."""
    res, calib = px.res, px.calib
    r = plan.roles[Role.ROLLOUT]
    m = res.arch_of(Role.ROLLOUT)
    if not r.parts:
        dev = res.device_of(r.pool)
        eff = calib.for_device(dev)
        shape = px.rollout_shape(dev, r.par)
        spec = EngineSpec(m, dev, replace(r.par, dp=1), eff, r.pool, r.slot)
        size = lpu_chips(m, dev, eff) if dev.kind is DeviceKind.lpu else r.tp * r.pp
        return [Group(spec, px.step_terms(m, dev, spec.par, eff), shape.replicas, size, 0, 0, None,
                      res.job.batch.samples, shape.replicas, shape.replicas)]
    slot = next(s for s in plan.slots if s.name == r.slot)
    slot_devices = slot.devices
    # part i's devices start where the slot's devices on its pool do (a mixed rollout's first
    # part shares the slot's first pool with the slot's other roles)
    starts, at = {}, 0
    for sp in slot.parts:
        starts[sp.pool] = at
        at += sp.devices
    out: list[Group] = []
    first = offset = 0
    for q in r.parts:
        offset = starts.get(q.pool, offset)
        dev = res.device_of(q.pool)
        eff = calib.for_device(dev)
        shape = px.with_samples(q.samples).rollout_shape(dev, q.par)
        spec = EngineSpec(m, dev, replace(q.par, dp=1), eff, q.pool, r.slot)
        size = lpu_chips(m, dev, eff) if dev.kind is DeviceKind.lpu else q.tp * q.pp
        out.append(Group(spec, px.step_terms(m, dev, spec.par, eff), shape.replicas, size, first,
                         offset, q.devices, q.samples,
                         shape.replicas * slot_devices / q.devices, shape.replicas))
        first += shape.replicas
        offset += q.devices
    return out


def dispatch(n: int, groups: list[Group]) -> list[list[list[int]]]:
    """Per group, per replica: the row indices it runs (contiguous per group, round-robin over
    the group's replicas)."""
    out = []
    start = 0
    for g, count in zip(groups, deal(n, [g.samples for g in groups])):
        end = start + count
        out.append([list(range(start + k, end, g.replicas)) for k in range(g.replicas)])
        start = end
    return out



def engines_for(groups: list[Group], smp: Samples, images_per_prompt: int,
                slot_factors: np.ndarray, tools: CorePool | None, tool_overhead: float,
                rec: Recorder, step: int, quota: Quota | None = None
                ) -> list[tuple[Group, Engine]]:
    """One `Engine` per replica of every group, running the rows `dispatch` deals it of `smp`,
    slowed by its devices' factors (`slot_factors`: the rollout slot's, per device; a part
    reads its own devices of the slot) and paying a VLM's image encoding
    (`placer.cost.vision`)."""
    out = []
    for g, rows in zip(groups, dispatch(smp.n, groups)):
        f = slot_factors if g.devices is None else slot_factors[g.offset:g.offset + g.devices]
        slow = replica_slowdowns(f, g.replicas, g.replica_size)
        sp = g.spec
        for k in range(g.replicas):
            enc = rollout_encode_s(sp.model, sp.dev, sp.par.devices, len(rows[k]),
                                   images_per_prompt, sp.eff)
            out.append((g, Engine(sp, g.first + k, smp, rows[k], slow[k], tools, tool_overhead,
                                  rec, step, g.steps, quota=quota, encode_s=slow[k] * enc)))
    return out
