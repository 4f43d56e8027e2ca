"""What moved between two plans: the one definition that `placer replan`, the executor's elastic
rebuild and the benchmarks share.

A role's *layout* is its actors as the executor builds them: pool, TP, PP, how many actors
(`role_counts`) and whether it offloads. The actor count is one per data-parallel rank for the
actor, rollout and reference roles (of every part, for a role split over pools) and for a
generative judge's reward role (one engine per replica, `executors.judge`), one per bundle
of its slot for the environment (whatever dp the plan records: the executor starts one
environment worker per bundle), one otherwise.

A role *moved* when its layout changed (`why == "config"`) or, when colocation counts, when the
set of roles it time-shares its slot with changed (`why == "colocation"`); a role that only one of
the plans runs moved too (its missing side reads "absent"). Colocation is a parameter because the
callers ask different questions: `placer replan` reports every change a user would see, while
the executor's rebuild report lists the roles whose actors change (a slot whose partners change
is rebuilt through its signature, `executors.elastic.slot_signature`).

The solver's movement cost (`placer.solve.ilp_solve`) charges a role whose candidate config changes; it
is an objective term, not a report: what moved is always computed here, from the two plans.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from placer.base.roles import Role, base_role
from placer.cost.sharding import Parallel
from placer.solve.planfile import Plan, RolePlacement

ABSENT = "absent"


def role_counts(plan: Plan) -> dict[str, int]:
    """Actors the executor builds per role (see the module docstring)."""
    out = {}
    judge = (plan.job.get("reward_model") or {}).get("kind") == "generative"
    engines = (Role.ACTOR, Role.ROLLOUT, Role.REFERENCE, *((Role.REWARD,) if judge else ()))
    for role, r in plan.roles.items():
        base = base_role(role)  # a multi-agent job's `AGENT.ROLE` counts as its role does
        if base in engines:  # a split role: every part's
            out[role] = sum(max(p.dp, 1) for p in r.parts) or max(r.dp, 1)
        elif base == Role.ENVIRONMENT:
            out[role] = sum(1 for b in plan.bundles if b.slot == r.slot)
        else:
            out[role] = 1
    return out


def dims(x: RolePlacement | Parallel, dp: int | None = None, micro: bool = True) -> str:
    """`tpT ppP dpD`, with `cpC` after tp and `epE` (and `etpF`) last where they are above 1
    (Megatron-Core's order; most layouts have neither, so they are left out there), and
    `shardS` after dp for a trainer's HSDP shard group, `mbsM` last for a trainer's chosen
    micro-batch (sequences per device; `micro` False leaves it out). A split role's part:
    `dims(part.par)`."""
    out = (f"tp{x.tp}" + (f" cp{x.cp}" if x.cp > 1 else "")
           + f" pp{x.pp} dp{x.dp if dp is None else dp}")
    shard = getattr(x, "shard", 0)  # HSDP (a training role's; a split part has none)
    if 0 < shard < x.dp:
        out += f" shard{shard}"
    if x.ep > 1:
        out += f" ep{x.ep}" + (f" etp{x.etp}" if x.etp > 1 else "")
    attn_dp = getattr(x, "attn_dp", 1)  # a rollout engine's data-parallel attention
    if attn_dp > 1:
        out += f" attn-dp{attn_dp}"
    mbs = getattr(x, "micro_batch", 0) if micro else 0  # a trainer's, where the plan chose one
    if mbs > 0:
        out += f" mbs{mbs}"
    return out


def layout(plan: Plan, role: str, micro: bool = True) -> str:
    """A role's actors: `pool tpT ppP dpN` (`dims`: cp and ep where above 1; + ` offload`,
    + ` park-optimizer` where its optimizer is parked between phases, + ` sharded-weights` and
    + ` streamed` for a frozen model whose weights are FSDP-sharded or held on the host), or
    "absent" when the plan lacks it; a role split over pools: each part's `pool tpT ppP dpN`
    joined by " + " (a new share of the samples alone is no move: the same actors serve it).
    `micro` False leaves the micro-batch out (what a role's processes are built for: a running
    trainer takes a new micro-batch in place, `executors.elastic`)."""
    x = plan.roles.get(role)
    if x is None:
        return ABSENT
    if x.parts:  # split over pools: each part's actors on its pool (its share is not a layout)
        return " + ".join(f"{p.pool} {dims(p.par)}" for p in x.parts)
    return (f"{x.pool} {dims(x, role_counts(plan)[role], micro)}"
            + (" offload" if x.offload else "")
            + (" park-optimizer" if x.park_optimizer else "")
            + (" sharded-weights" if x.sharded_weights else "")
            + (" streamed" if x.stream_params_bytes else ""))


def partners(plan: Plan, role: str) -> frozenset[str]:
    """The roles that share `role`'s slot (itself included); empty when the plan lacks it."""
    x = plan.roles.get(role)
    if x is None:
        return frozenset()
    return frozenset(r for r, y in plan.roles.items() if y.slot == x.slot)


@dataclass(frozen=True)
class Move:
    role: str
    before: str  # layout in the old plan (with its slot when colocation counts)
    after: str
    why: Literal["config", "colocation"]

    def to_dict(self) -> dict[str, str]:
        return {"from": self.before, "to": self.after, "why": self.why}

    def __str__(self) -> str:
        return f"{self.role}: {self.before} -> {self.after}"


def moves(old: Plan, new: Plan, *, colocation: bool = True) -> dict[str, Move]:
    """Roles that moved from `old` to `new`, in role-name order."""
    out = {}
    for role in sorted(set(old.roles) | set(new.roles)):
        a, b = layout(old, role), layout(new, role)
        if a != b:
            why: Literal["config", "colocation"] = "config"
        elif colocation and partners(old, role) != partners(new, role):
            why = "colocation"
        else:
            continue
        if colocation:
            a += f" [{old.roles[role].slot}]" if role in old.roles else ""
            b += f" [{new.roles[role].slot}]" if role in new.roles else ""
        out[role] = Move(role, a, b, why)
    return out
