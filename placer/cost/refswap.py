"""A reference swapped into the policy's own model for its pass: what NeMo-RL's KL pass moves.

NeMo-RL has no reference model on the GPU. Its policy workers keep the reference's weights as a
state dict in host memory and, for the reference log-prob pass of every RL step, swap them into
the policy's model and back (NVIDIA-NeMo/RL v0.6.0 @5fb588932bf835506a8a5bac01de4f8c7ab0a065,
nemo_rl/models/policy/workers/megatron_policy_worker.py `use_reference_model`, 585-649, and
dtensor_policy_worker_v2.py `use_reference_model`, 782-825; the state dict is built once by
nemo_rl/models/megatron/setup.py `setup_reference_model_state`, 1088-1105: every tensor
`.to(device="cpu", non_blocking=True, copy=True)`). One pass copies, per device:

  out    the policy's own state dict to the host (`item.detach().to("cpu", non_blocking=True,
         copy=True)` of every tensor: the device's shard of the BF16 weights)
  in     the reference's state dict into the policy's parameters (`param_or_buf.copy_(...)`)
  back   the saved policy state dict into the parameters again, after the pass

(the same at @7ea279abfbeb698b092856d0dab61e7cf39bc909, the version of the `nemo-rl` profile:
megatron_policy_worker.py 1971-2037, setup.py 2154-2175), three copies of the device's weights
over the host link, one after another (`SWAP_COPIES`),
every step, whether or not the slot would fit a resident reference. The reference then holds no
weights of its own on the GPU (it runs in the policy's parameter storage, which the actor's
memory counts) and nothing to move when its slot switches: its swap is its switch.

Megatron's path adds one collective (megatron_policy_worker.py 593-595): with the distributed
optimizer and `overlap_param_gather` (NeMo-RL's defaults, examples/configs/grpo_math_1B.yaml
191, 212; `should_disable_forward_pre_hook`, setup.py 1151-1156) it calls
`disable_forward_pre_hook()`, whose `param_sync=True` runs `start_param_sync(force_sync=True)`
(NVIDIA/Megatron-LM @d30c3ae5469fe3f6a64d4fd2e63b6e7f7844ea81, the submodule of that tag,
megatron/core/distributed/distributed_data_parallel.py 371-386, param_and_grad_buffer.py
297-317): a synchronous all-gather of the BF16 parameters over the distributed optimizer's
groups, the dense part over dp x cp ranks and the experts over their expert-dp ranks, exposed
(no compute to hide it). The train pass's all-gathers are priced with its gradient sync
(`layercomm.grad_sync_time`); this one is extra, once per reference pass. NeMo-RL's Megatron
reference holds whole weights over its dp ranks (`Parallel.sharded_weights` off); its DTensor
reference is FSDP-sharded and has no distributed optimizer to sync.

Who does it: `FrameworkProfile.swap_frozen` (the roles a framework swaps this way). Host memory
it holds (`swap_host_gb`): the reference's state dict and the pinned copy of the policy's
(PyTorch's caching host allocator keeps the second between steps), two copies of the weights.
"""
from __future__ import annotations

from placer.cost.collectives import all_gather
from placer.cost.efficiency import Efficiency
from placer.cost.layercomm import shard_link
from placer.cost.sharding import Parallel, grad_bytes
from placer.spec.arch import ModelArch
from placer.spec.hardware import DeviceType

# weights-sized host copies of one swapped pass: the policy's state out, the reference's in,
# the policy's back (module docstring)
SWAP_COPIES = 3
# weights-sized copies a swapping framework keeps in host memory: the reference's state dict
# and the policy's saved one
SWAP_HOST_COPIES = 2


def param_sync_time(m: ModelArch, dev: DeviceType, par: Parallel, eff: Efficiency) -> float:
    """Seconds of Megatron's forced synchronous parameter all-gather before a swapped pass: the
    device's BF16 dense parameters over `zero_group` ranks and its experts over
    `expert_zero_group`, on the ZeRO group's link (`layercomm.shard_link`, as the gradient sync
    prices the train pass's). 0 for an FSDP-sharded reference (NeMo-RL's DTensor path)."""
    if par.sharded_weights:
        return 0.0
    link = shard_link(dev, par, eff)
    dense, experts = grad_bytes(m, par)
    out = all_gather(dense, par.zero_group, link)
    if experts > 0:
        out += all_gather(experts, par.expert_zero_group, link)
    return out


def swap_time(m: ModelArch, dev: DeviceType, par: Parallel, weights_gb: float,
              eff: Efficiency) -> float:
    """Seconds one swapped pass adds for a device holding `weights_gb` GB of BF16 weights:
    `SWAP_COPIES` copies of them over the host link at `offload_gbs`, one after another, and
    the forced parameter all-gather (`param_sync_time`)."""
    return SWAP_COPIES * weights_gb / eff.offload_gbs + param_sync_time(m, dev, par, eff)


def swap_host_gb(weights_gb: float) -> float:
    """GB per device of host memory a swapped reference holds for the job: `SWAP_HOST_COPIES`
    copies of the device's BF16 weights."""
    return SWAP_HOST_COPIES * weights_gb
