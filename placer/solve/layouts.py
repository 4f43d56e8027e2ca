"""Parallel layouts to try for a role on a pool: the search space of `placer.solve.candidates`.

Device counts are every count inside one node, powers of two, and whole multiples of a node, up
to the pool's size (`device_counts`); on them (`placer.cost.sharding` says what each dimension
splits):
  training (GPU, can_train): TP in powers of two inside one NVLink domain, PP stages from
      `PP_CHOICES`, CP for sequences longer than a micro-batch, EP for a mixture of experts
      (ETP 1), DP the rest, ZeRO-3 sharding (and, where dp spans nodes, HSDP with one node's
      shard group: `hsdp_layouts`), activation recomputation on;
  generation / forward on GPUs: TP inside a node, PP stages across whole nodes (engines larger
      than a node), EP = TP for a mixture of experts, wide-EP engines on multi-node pools, DP
      replicas; a frozen model also FSDP-sharded where the framework runs it so;
  LPUs: replicas of `lpu_chips` chips (the weights must sit in SRAM);
  CPU pools: a number of nodes (environments, rule rewards, tiny models).
The job's FP8 options are set where the device has FP8 tensor cores (`fp8_flags`), and only the
layouts the job's framework runs are kept (`framework_layouts`). Nothing here is priced or
checked for memory: `candidates.role_candidates` does that.
"""
from __future__ import annotations

from dataclasses import replace

from placer.base.roles import TRAINING_ROLES, Role, base_role
from placer.cost.generation import lpu_chips
from placer.cost.layercomm import MICRO_TOKENS, NODE_DEVICES
from placer.cost.offload import STREAM_SCHEMES
from placer.cost.pricer import Pricer
from placer.cost.roofline import GB, weight_bytes
from placer.cost.sharding import Parallel
from placer.spec.arch import ModelArch
from placer.spec.catalog import Resolved
from placer.spec.hardware import DeviceKind, DeviceType, Pool
from placer.spec.job import pin_of


def device_counts(total: int, per_node: int, step: int = 1, limit: int | None = None) -> list[int]:
    """Counts that are multiples of `step`: every multiple inside one node (DP replicas need not
    be a power of two), powers of two, and whole-node multiples up to `total`."""
    top = min(total, limit or total)
    out = set(range(step, min(per_node, top) + 1, step))
    k = step
    while k <= top:
        out.add(k)
        k *= 2
    n = per_node
    while n <= top:
        if n % step == 0:
            out.add(n)
        n = n * 2 if n >= 8 * per_node else n + per_node
    if top % step == 0 and top >= step:
        out.add(top)
    return sorted(out)


def _pow2_upto(n: int) -> list[int]:
    out, k = [], 1
    while k <= n:
        out.append(k)
        k *= 2
    return out


# Pipeline stages tried. Not only powers of two: a stage count need not divide the layers
# (Megatron-Core places uneven first and last stages; the cost model prices the mean stage).
PP_CHOICES = (1, 2, 3, 4, 6, 8, 12, 16)
# Context parallelism is tried for jobs whose longest sequence exceeds one micro-batch of
# `MICRO_TOKENS` (the activations of one sequence no longer fit the usual per-device budget).
CP_CHOICES = (1, 2, 4)
EP_CHOICES = (1, 2, 4, 8)  # expert parallelism, inside one NVLink domain (all-to-all on NVLink)


def _pps(layers: int, cap: int, per_stage: int = 2) -> list[int]:
    """Stage counts of at most `cap` with at least `per_stage` decoder layers per stage. The
    search keeps two (a one-layer stage is rarely worth its pipeline bubble); a job that pins
    `pp` may ask for one layer per stage, which the executor runs (executors/pipeline.py)."""
    return [p for p in PP_CHOICES if p == 1 or (p <= cap and per_stage * p <= layers)]


def _eps(m: ModelArch, ranks: int, domain: int) -> list[int]:
    """EP degrees for `ranks` non-pipeline ranks: none, and the largest of `EP_CHOICES` that
    divides the experts and the ranks inside one NVLink domain (a smaller one moves the same
    all-to-all bytes per rank over fewer ranks and leaves bigger expert shards and ZeRO
    gathers, so it is not tried)."""
    if not m.moe:
        return [1]
    ok = [e for e in EP_CHOICES if m.experts % e == 0 and ranks % e == 0 and e <= domain]
    return sorted({1, max(ok)})


def _training_layouts(m: ModelArch, counts: list[int], tps: list[int], domain: int,
                      cps: tuple[int, ...], per_stage: int = 2) -> list[Parallel]:
    """TP x CP x PP x DP (x EP for a mixture of experts, ETP 1); optimizer offload is tried by
    `role_candidates` only where a layout does not fit without it."""
    out = []
    for n in counts:
        for tp in tps:
            for cp in cps:
                for pp in _pps(m.layers, 16, per_stage):
                    if n % (tp * cp * pp):
                        continue
                    dp = n // (tp * cp * pp)
                    for ep in _eps(m, tp * cp * dp, domain):
                        out.append(Parallel(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep))
    return out


# An engine spans nodes (PP stages) only when one node's devices, TP over all of them, would
# spend more than this share of their memory on weights: pipeline stages do not shorten a
# decode step (`generation._decode_terms`), they only make room for weights and KV.
MULTI_NODE_WEIGHT_SHARE = 0.5


def _inference_layouts(m: ModelArch, dev: DeviceType, counts: list[int], tps: list[int],
                       domain: int, nodes: int, engine: bool) -> list[Parallel]:
    """Replicas of TP inside a node, PP stages across whole nodes when a node is tight (an
    engine larger than a node: vLLM's and SGLang's multi-node serving), EP = TP for a mixture
    of experts (vLLM's --enable-expert-parallel), DP replicas of that; for a rollout `engine`
    on a multi-node pool also the wide-EP engines (`_wide_ep_layouts`)."""
    tight = weight_bytes(m) / domain > MULTI_NODE_WEIGHT_SHARE * dev.memory_gb * GB
    out = []
    for n in counts:
        for tp in tps:
            # a stage of fewer than a node's devices gains nothing from crossing nodes
            pps = _pps(m.layers, nodes) if tp == domain and tight else [1]
            for pp in pps:
                if n % (tp * pp):
                    continue
                eps = [1] + ([tp] if m.moe and tp > 1 and m.experts % tp == 0 else [])
                for ep in eps:
                    out.append(Parallel(tp=tp, pp=pp, dp=n // (tp * pp), ep=ep))
    return out + (_wide_ep_layouts(m, counts, domain) if engine and nodes > 1 else [])


def _wide_ep_degrees(m: ModelArch, domain: int, top: int) -> list[int]:
    """EP degrees of a multi-node MoE engine: one node's devices and whole powers of two of
    nodes, up to `top` devices, that split the routed experts evenly (at least one a rank)."""
    out, ep = [], domain
    while ep <= min(top, m.experts):
        if m.experts % ep == 0:
            out.append(ep)
        ep *= 2
    return out


def _wide_ep_layouts(m: ModelArch, counts: list[int], domain: int) -> list[Parallel]:
    """Engines of a MoE on a multi-node pool as vLLM and SGLang serve DeepSeek-style models:
    for each EP degree of `_wide_ep_degrees` (a node and more), one replica of ep ranks with
    the experts split over them and either data-parallel attention (`Parallel.attn_dp` = ep:
    SGLang --enable-dp-attention, vLLM --data-parallel-size with --enable-expert-parallel;
    attention and its KV per rank) or, across nodes, tensor-parallel attention (TP = EP over
    the NIC, vLLM's multi-node TP); DP replicas of that. A hybrid (linear-attention) model is
    left to the TP layouts: its recurrent state is sharded by TP head (`state_split`).
    At most 2 log2(nodes) + 1 layouts per device count."""
    if not m.moe or m.linear_attention is not None:
        return []
    out = []
    for n in counts:
        for ep in _wide_ep_degrees(m, domain, n):
            if n % ep:
                continue
            out.append(Parallel(tp=ep, dp=n // ep, ep=ep, attn_dp=ep))
            if ep > domain and m.heads % ep == 0:  # in a node TP = EP is a layout above
                out.append(Parallel(tp=ep, dp=n // ep, ep=ep))
    return out


def _sharded_frozen(pars: list[Parallel]) -> list[Parallel]:
    """A frozen model's forward (reference, reward model) FSDP-sharded over all its dp ranks,
    as verl's and NeMo-RL's reference workers hold it (`estimate.frozen_sharded`), beside the
    whole copies `pars` (only where the job's framework runs it: `FrameworkProfile.frozen_shards`;
    `placer execute`'s workers hold whole copies)."""
    return [replace(p, sharded_weights=True) for p in pars if p.dp > 1]


def streamed_frozen(res: Resolved, role: str, pars: list[Parallel]) -> list[Parallel]:
    """Streamed twins of a frozen model's FSDP-sharded layouts: the shard held in host memory
    and copied to the GPU on every forward micro-batch (`Parallel.stream_params_bytes`, at the
    framework's host bytes a parameter), only where the job's framework does it for `role`
    (`FrameworkProfile.stream_frozen`, at its `stream_scheme`'s bytes). Slower
    (`offload.stream_time`), with no weights on the GPU, so a colocated slot may fit where the
    resident shard does not; host memory is checked by `placer.solve.hostmem`."""
    profile = res.job.profile
    scheme = STREAM_SCHEMES.get(profile.stream_scheme)
    if base_role(role) not in profile.stream_frozen or scheme is None:
        return []
    return [replace(p, stream_params_bytes=scheme.bytes_per_param)
            for p in pars if p.sharded_weights and p.dp > 1]


def layouts(px: Pricer, role: str, pool: Pool, limit: int | None = None) -> list[Parallel]:
    """Parallel layouts to try for `role` on `pool` (not yet checked for memory)."""
    res = px.res
    dev = res.device_of(pool)
    total = pool.devices_per_node * pool.nodes
    m = res.model_of(role)
    if dev.kind is DeviceKind.cpu or m is None:
        return [Parallel(dp=n) for n in device_counts(total, pool.devices_per_node, 1, limit)]
    if dev.kind is DeviceKind.lpu:
        chips = lpu_chips(m, dev, px.calib.for_device(dev))
        return [Parallel(dp=n) for n in device_counts(total, pool.devices_per_node, chips, limit)
                if n >= chips]
    domain = min(pool.nvlink_domain or pool.devices_per_node, total)
    tps = [t for t in _pow2_upto(domain) if m.heads % t == 0]
    counts = device_counts(total, pool.devices_per_node, 1, limit)
    if role in TRAINING_ROLES:
        cps = CP_CHOICES if res.job.max_context > MICRO_TOKENS else (1,)
        pin = pin_of(res.job, role)
        pars = _training_layouts(m, counts, tps, domain, cps,
                                 per_stage=1 if pin is not None and pin.pp else 2)
        pars += hsdp_layouts(pars, pool, pin.shard if pin is not None else None)
    elif role == Role.ROLLOUT:
        pars = _inference_layouts(m, dev, counts, tps, domain, pool.nodes, True)
    else:
        pars = _inference_layouts(m, dev, counts, tps, domain, pool.nodes, False)
        pars += _sharded_frozen(pars) if res.job.profile.frozen_shards else []
        pars += streamed_frozen(res, role, pars)
    flags = fp8_flags(res, role, dev)
    return [replace(p, **flags) for p in pars] if any(flags.values()) else pars


def fp8_flags(res: Resolved, role: str, dev: DeviceType) -> dict[str, bool]:
    """The job's FP8 options (`spec.Precision`) that apply to `role` on `dev`: only on devices
    with FP8 tensor cores; rollout weights and KV cache for the rollout role, GEMMs for the
    training roles."""
    prec, fp8 = res.job.precision, dev.fp8_tflops is not None
    if role in TRAINING_ROLES:
        return {"fp8_train": fp8 and prec.training == "fp8"}
    if role == Role.ROLLOUT:
        return {"fp8_weights": fp8 and prec.rollout_weights == "fp8",
                "fp8_kv": fp8 and prec.kv_cache == "fp8"}
    return {}


def framework_layouts(res: Resolved, role: str, dev: DeviceType, pars: list[Parallel]
                      ) -> list[Parallel]:
    """The layouts the job's framework can run (`placer.spec.framework`): all of them for
    `native`, the planner's own executor."""
    profile = res.job.profile
    training, has_model = role in TRAINING_ROLES, res.model_of(role) is not None
    batch = res.job.batch
    return [p for p in pars if profile.layout_problem(
        role, training=training, has_model=has_model, on_gpu=dev.kind is DeviceKind.gpu, tp=p.tp,
        pp=p.pp, ep=p.ep, shard=p.shard, attn_dp=p.attn_dp, dp=p.dp,
        mini_batch_samples=batch.samples // batch.mini_batches, prompts=batch.prompts) is None]


def hsdp_layouts(pars: list[Parallel], pool: Pool, pinned: int | None = None) -> list[Parallel]:
    """HSDP variants (`Parallel.shard`) of the ZeRO-3 layouts whose devices span several nodes:
    the shard group cut to one node's devices (shard x tp x cp x pp of them), so the parameter
    gathers and gradient reduce-scatters stay on NVLink and only the shards' all-reduce crosses
    nodes (`layercomm.hsdp_all_reduce`), at the price of state sharded over fewer ranks. Only
    that size (and a job's pinned `shard`), to keep the ILP small; the estimate drops a variant
    that does not fit and `prune_dominated` keeps the faster of it and plain ZeRO-3."""
    node = min(pool.devices_per_node, NODE_DEVICES)
    out = []
    for par in pars:
        if par.zero < 3 or par.shard:
            continue
        sizes = {pinned} if pinned is not None else set()
        if par.devices > node and node % par.replica == 0:
            sizes.add(node // par.replica)
        out += [replace(par, shard=s) for s in sorted(sizes) if 0 < s < par.dp and par.dp % s == 0]
    return out
