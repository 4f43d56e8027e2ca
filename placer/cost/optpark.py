"""Optimizer parking: a trained role's optimizer state held in host memory between phases.

verl and NeMo-RL run colocated jobs this way: the optimizer state (fp32 master weights and Adam
moments) is copied to the host after the update and back to the GPU before the next one, and
the step itself runs on the GPU. verl's `optimizer_offload` (Megatron or FSDP) loads the state
before `update_policy` and offloads it after, synchronously (volcengine/verl
verl/workers/megatron_workers.py `update_actor`, lines ~740-780 at b178a3c); NeMo-RL's colocated
runs always move the optimizer off the GPU before the refit, and `policy.
offload_optimizer_for_logprob` does it for the log-prob pass (NVIDIA-NeMo/RL
examples/configs/grpo_math_1B.yaml:139 at 7ea279a). This is distinct from `Parallel.offload`,
DeepSpeed's / Megatron's CPU optimizer, where the state stays on the host and the step runs there.

What it buys: a colocated slot fits when its members' resident memory (a parked member's total
less its optimizer state) plus the largest parked state brought back at a time fits a device
(`slot_peak_gb`): the state need not be resident while the other members run. What it costs:
the state's copy to the host and back over the host link once per RL step (`park_time`: the
optimizer steps of one RL step run back to back with the state on the GPU; `moved_gb`: the bytes
as the job's framework moves them, `placer.cost.offload`), and the host memory it occupies
(`placer.solve.hostmem`). A published run may park the weights too (`Parallel.park_params`,
verl's `param_offload`), loaded for every phase that runs the module. A slot whose members do
not fit even so switches whole (`timing.slot_switch`), where a parked member pays at least its
onload (`timing.member_switch`).
"""
from __future__ import annotations

from collections.abc import Iterable

from placer.cost.efficiency import Efficiency
from placer.cost.model import host_round_trip_time
from placer.cost.offload import parked_moves_gb, parked_states, phases_of
from placer.cost.roleestimate import Estimate
from placer.cost.roofline import Memory
from placer.cost.sharding import Parallel


def parked_gb(mem: Memory, par: Parallel) -> float:
    """GB per device the role parks between phases: its on-device optimizer state, if parked,
    and its weights, if parked too (`offload.parked_states`)."""
    held = {"params": mem.weights, "optimizer": mem.optimizer}
    return sum(held[s] for s in parked_states(par))


def resident_gb(mem: Memory, par: Parallel) -> float:
    """GB per device the role holds while another member of its slot runs."""
    return mem.total - parked_gb(mem, par)


def slot_peak_gb(members: Iterable[tuple[float, float]]) -> float:
    """A slot's peak GB per device from its members' (total, parked) GB: every member's
    resident memory plus the largest parked state brought back at a time (members take turns,
    so one parked state is on the device at once)."""
    rows = list(members)
    return sum(t - p for t, p in rows) + max((p for _, p in rows), default=0.0)


def park_time(parked: float, eff: Efficiency) -> float:
    """Seconds per RL step to copy `parked` GB per device to the host and back: the round trip a
    whole switch pays for the same bytes (`model.host_round_trip_time`), in sequence with the
    step (verl loads and offloads synchronously)."""
    return host_round_trip_time(parked, eff)


def moved_gb(est: Estimate, framework: str) -> float:
    """GB per device one RL step copies each way for the states the role parks, as `framework`
    moves them: its bytes per parameter, once per phase that loads each state
    (`offload.parked_moves_gb` over the phases of the role's stages, `offload.phases_of`). A
    parked optimizer under a framework with no scheme of its own moves `parked_gb` once."""
    return parked_moves_gb(est.memory, est.par, framework, phases_of(est.role, est.stage_s))
