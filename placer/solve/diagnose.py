"""Why a job fits nowhere: for each role without a candidate, what cannot fit and the smallest
change that would (more nodes on a pool, another device, a different pin).

The planner calls `diagnose` when the cost table leaves a role without a candidate; the message
becomes the `Infeasible` that `placer plan` prints with exit code 3.
"""
from __future__ import annotations

import math
from dataclasses import replace

from placer.base.roles import TRAINING_ROLES, Role
from placer.cost.estimate import HOSTS, can_host
from placer.cost.generation import lpu_chips
from placer.cost.pricer import Pricer
from placer.solve.candidates import memory_floor_gb, role_candidates
from placer.solve.layouts import layouts
from placer.spec.catalog import Resolved, with_nodes
from placer.spec.hardware import DeviceKind, Pool
from placer.spec.job import pin_of
from placer.spec.pins import DIMS, Pin

GROWTH = [2**k for k in range(1, 13)]  # pool sizes tried by the diagnosis: up to 4,096x


# --------------------------------------------------------------------------------- diagnosis
def _need(role: str, res: Resolved) -> str:
    if role in TRAINING_ROLES:
        return "a training-capable GPU pool (a device with can_train: true)"
    if role == Role.REWARD and res.model_of(Role.REWARD) is None:
        return "a CPU pool (a rule reward runs on CPU cores)"
    return "a pool of kind " + " or ".join(k.value for k in HOSTS[role])


def _what(role: str) -> str:
    return "weights and optimizer state" if role in TRAINING_ROLES else "its weights and KV cache"


def diagnose(px: Pricer, roles: list[str]) -> str:
    """What cannot fit, for each role without a candidate, and the smallest change that would."""
    res = px.res
    msgs = []
    for role in roles:
        hosts = [p for p in res.cluster.pools if can_host(res, role, p)]
        m = res.model_of(role)
        label = f"{role} ({m.name})" if m else role
        if (pin := pin_of(res.job, role)) is not None:  # the pin, not the cluster, rules it out
            msgs.append(f"{label} is pinned to {pin.describe()} and no candidate keeps to the "
                        f"pin: {_pin_reason(px, role, pin)}; smallest change: change "
                        f"or drop pin.{role}")
            continue
        if not hosts:
            msgs.append(f"{label} cannot run on any pool: it needs {_need(role, res)}; "
                        f"smallest change: add such a pool")
            continue
        options: list[tuple[float, Pool, int | None, int, str]] = []
        for p in hosts:
            have = p.devices_per_node * p.nodes
            why = _reason(px, role, p)
            for f in GROWTH:
                grown = with_nodes(res.job, {p.name: p.nodes * f})
                cands = role_candidates(px.with_res(grown), role, grown.cluster.pool(p.name),
                                        prune=False)
                if cands:
                    n = min(c.devices for c in cands)
                    nodes = math.ceil(n / p.devices_per_node)
                    options.append((nodes - p.nodes, p, n, have, why))
                    break
            else:
                options.append((math.inf, p, None, have, why))
        parts = [f"needs >= {n} {p.device} for {_what(role)} on pool {p.name}, which has {have}"
                 if n is not None else f"does not fit on pool {p.name} at any size ({why})"
                 for _, p, n, have, why in options]
        floor = memory_floor_gb(res, role)
        head = f"{label} fits nowhere" + (f" ({floor:.0f} GB of state)" if floor else "")
        best = min(options, key=lambda o: o[0])
        fix = (f"smallest change: add {best[0]} node(s) to pool {best[1].name}"
               if best[0] != math.inf else "no pool size fits it: use a device with more memory")
        msgs.append(f"{head}: " + "; ".join(parts) + f". {fix}")
    return " | ".join(msgs)


def _pin_reason(px: Pricer, role: str, pin: Pin) -> str:
    """Why no layout keeps to the pin, per pool it allows: the pool cannot host the role, no
    layout the pool offers matches (and what it offers), or the matching ones do not fit."""
    res = px.res
    why = []
    for p in res.cluster.pools:
        if pin.pool is not None and p.name != pin.pool:
            continue
        if not can_host(res, role, p):
            if pin.pool is not None:  # named by the pin: say why it cannot be
                why.append(f"pool {p.name} cannot host {role} (it needs {_need(role, res)})")
            continue
        pars = layouts(px, role, p)
        match = [q for q in pars if pin.allows(p.name, q)]
        if not match:
            offered = {d: sorted({getattr(q, d) for q in pars}) for d in ("devices", *DIMS)}
            shown = "; ".join(f"{d} {', '.join(map(str, v))}" for d, v in offered.items()
                              if len(v) > 1 or v != [1])
            why.append(f"pool {p.name} offers no such layout ({shown or 'only one device'})")
            continue
        q = max(match, key=lambda q: q.devices)  # the roomiest pinned layout
        offload = (role in TRAINING_ROLES and res.device_of(p).kind is DeviceKind.gpu
                   and not res.device_of(p).host_backed)
        est = px.estimate(role, p, replace(q, offload=True) if offload else q)
        why.append(f"on pool {p.name} the pinned layout does not fit"
                   + (" even with the optimizer offloaded" if offload else "")
                   + f" ({est.reason or 'memory'})")
    return "; ".join(why) or f"no pool can host {role} (it needs {_need(role, res)})"


def _reason(px: Pricer, role: str, pool: Pool) -> str:
    """The cost model's reason at the largest layout the pool allows."""
    res = px.res
    pars = layouts(px, role, pool)
    if not pars:
        dev = res.device_of(pool)
        m = res.model_of(role)
        if dev.kind is DeviceKind.lpu and m is not None:
            return f"one replica needs {lpu_chips(m, dev, px.calib.for_device(dev))} chips"
        return "no layout fits the pool"
    est = px.estimate(role, pool, max(pars, key=lambda q: q.devices))
    return est.reason or "fits"
