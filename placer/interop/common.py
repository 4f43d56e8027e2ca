"""What every exporter needs from a plan: model paths, per-role node shapes, colocation groups.

Frameworks describe a role's devices as `nodes x GPUs per node` and its model as a Hugging Face
path; a plan describes devices as a count on a pool and a model as a catalog name. The catalog's
`source` field starts with the Hugging Face repository its numbers were read from
("Qwen/Qwen2.5-7B config.json"), which is the path a framework loads.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from placer.base.errors import SpecError
from placer.solve.planfile import Plan, RolePlacement
from placer.spec.catalog import Resolved
from placer.spec.hardware import DeviceKind
from placer.spec.names import hf_repo


@dataclass
class Export:
    """One framework's rendering of a plan: `files` (relative name -> text), the launch
    `command`, `warnings` naming every role or layout the framework cannot express, and the
    framework `version` the files were written for (their keys and checks are that release's)."""

    framework: str
    files: dict[str, str]
    command: str
    warnings: list[str] = field(default_factory=list)
    version: str = ""


def hf_path(res: Resolved, role: str, warnings: list[str]) -> str:
    """The Hugging Face repository of the model a role runs (from the catalog's source), or the
    catalog name with a warning when the catalog knows none (a local or test model)."""
    m = res.arch_of(role)
    repo = hf_repo(m.source)
    if repo:
        return repo
    warnings.append(f"{role}: model {m.name!r} has no Hugging Face repository in the catalog; "
                    f"the export uses {m.name!r} as its path (replace it with a local path)")
    return m.name


def node_shape(plan: Plan, role: str, warnings: list[str]) -> tuple[int, int]:
    """(nodes, devices per node) for a role's devices: whole nodes when it spans several, else
    one node with its devices. A count that is not whole nodes is rounded up, with a warning."""
    r = plan.roles[role]
    pool = plan.resolved().cluster.pool(r.pool)
    per = pool.devices_per_node
    if r.devices <= per:
        return 1, r.devices
    nodes = -(-r.devices // per)
    if nodes * per != r.devices:
        warnings.append(f"{role}: {r.devices} devices are not whole {per}-device nodes of pool "
                        f"{r.pool}; exported as {nodes} x {per}")
    return nodes, per


def kind_of(plan: Plan, role: str) -> DeviceKind:
    return plan.resolved().device_of(plan.roles[role].pool).kind


def slot_roles(plan: Plan, role: str) -> list[str]:
    """The roles sharing `role`'s slot (its colocation group), itself included."""
    slot = plan.roles[role].slot
    return next(list(s.roles) for s in plan.slots if s.name == slot)


def colocated(plan: Plan, a: str, b: str) -> bool:
    return a in plan.roles and b in plan.roles and plan.roles[a].slot == plan.roles[b].slot


def gpu_roles(plan: Plan) -> list[str]:
    return [r for r in plan.roles if kind_of(plan, r) is DeviceKind.gpu]


def memory_fraction(plan: Plan, role: str) -> float:
    """The share of a device's memory the plan gives a serving role (its KV cache and weights),
    as vLLM's gpu_memory_utilization: between 0.1 and 0.9, two decimals."""
    r: RolePlacement = plan.roles[role]
    dev = plan.resolved().device_of(r.pool)
    return round(min(0.9, max(0.1, r.memory_gb / dev.memory_gb)), 2)


def lengths(plan: Plan) -> tuple[int, int]:
    """(longest prompt, longest response of one turn) in tokens: the frameworks' length caps."""
    job = plan.spec
    return (int(job.lengths.prompt.max_value()), int(job.lengths.response.max_value()))


def mini_batch_prompts(plan: Plan) -> int:
    """Prompts per optimizer step (verl and OpenRLHF count a mini-batch in prompts or samples;
    the job in optimizer steps per iteration)."""
    b = plan.spec.batch
    return max(b.prompts // b.mini_batches, 1)


def names_a_file(text: str) -> bool:
    """Whether `text` (a path, or an OpenRLHF command line given inline) is an existing file;
    a command line too long for a file name is not one (stat would raise)."""
    try:
        return Path(text).is_file()
    except (OSError, ValueError):  # ENAMETOOLONG, or a NUL byte
        return False


def refuse_split(plan: Plan, framework: str) -> None:
    """SpecError (exit 2) when the plan splits a role over pools (`roles.NAME.parts`): `framework`
    runs each role's engines as one group of one device type, so the split cannot be expressed
    and exporting only the first part would silently drop the others' devices and samples."""
    split = {role: r for role, r in plan.roles.items() if r.parts}
    if not split:
        return
    role, r = next(iter(split.items()))
    over = " + ".join(f"{p.pool} x{p.devices} ({p.share:.0%} of samples)" for p in r.parts)
    fields = ", ".join(f"roles.{n}.parts" for n in split)
    raise SpecError(
        f"{fields}: {framework} cannot run one {role} role over two device types; this plan "
        f"splits it over {over}. Re-plan with the {role} kept on one pool (add `pin: {{{role}: "
        f"{{pool: {r.parts[0].pool}}}}}` to the job, or leave one {role} pool in its cluster), or "
        "export kuberay, which runs this plan as it is (`placer execute`)")


def hsdp_roles(plan: Plan) -> dict[str, RolePlacement]:
    """The roles whose training state the plan shards in HSDP groups (`roles.NAME.shard`
    smaller than their dp: `Parallel.shard`); 0, or all of dp, is plain ZeRO over every rank."""
    return {role: r for role, r in plan.roles.items() if 0 < r.shard < r.dp}


def refuse_hsdp(plan: Plan, framework: str, why: str, instead: str) -> None:
    """SpecError (exit 2) when the plan shards a training role's state in HSDP groups that
    `framework` cannot build (`why`): exporting it as plain ZeRO would silently change the
    layout the plan was priced with (state per device, and which links the gathers cross).
    The message names the pin that re-plans without HSDP (`shard` = dp: the pin's way of
    saying plain ZeRO, as a pin's values are positive) and `instead`, what else to do."""
    hsdp = hsdp_roles(plan)
    if not hsdp:
        return
    role, r = next(iter(hsdp.items()))
    pins = ", ".join(f"{n}: {{dp: {x.dp}, shard: {x.dp}}}" for n, x in hsdp.items())
    fields = ", ".join(f"roles.{n}.shard: {x.shard}" for n, x in hsdp.items())
    raise SpecError(
        f"{fields}: {framework} cannot shard the {role}'s training state in groups of {r.shard} "
        f"of its {r.dp} data-parallel ranks (HSDP): {why}. Re-plan with plain ZeRO over all dp "
        f"ranks (add `pin: {{{pins}}}` to the job), or {instead}")


def device_warnings(plan: Plan, warn: list[str], framework: str) -> None:
    """Warnings for what a GPU framework cannot place: a role on an LPU pool (once per role that
    has no warning yet) and several GPU types (the framework counts GPUs; which type a role
    lands on is the Ray cluster's business)."""
    res = plan.resolved()
    for role, r in plan.roles.items():
        said = any(w.startswith(f"{role}:") for w in warn)  # one warning per role is enough
        if res.device_of(r.pool).kind is DeviceKind.lpu and not said:
            warn.append(f"{role}: {framework} has no LPU backend; the plan's {r.pool} (LPU) "
                        "placement is not expressible")
    types = {res.device_of(r.pool).name for r in plan.roles.values()
             if res.device_of(r.pool).kind is DeviceKind.gpu}
    if len(types) > 1:
        warn.append(f"cluster: {framework} sizes pools in GPUs, not GPU types "
                    f"({', '.join(sorted(types))}); start the Ray cluster so each pool's nodes "
                    "carry its type (placer export kuberay)")


def refuse_park(plan: Plan, framework: str, instead: str) -> None:
    """SpecError (exit 2) when the plan parks a trained role's optimizer in host memory between
    phases (`roles.NAME.park_optimizer`, `placer.cost.optpark`) and `framework` has no such
    mode: exporting it without would need memory the plan's slot does not have."""
    parked = [n for n, r in plan.roles.items() if r.park_optimizer]
    if parked:
        fields = ", ".join(f"roles.{n}.park_optimizer: true" for n in parked)
        raise SpecError(f"{fields}: {framework} cannot park a trained role's optimizer state in "
                        "host memory between phases and step on the GPU. Re-plan under it "
                        f"(the job's `framework`), or {instead}")
