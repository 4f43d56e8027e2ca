"""Versioned weight sync: the trainer's weights to every rollout worker that lacks them.

Version v is the number of optimizer steps so far. A refresh streams the weights from the
trainer's senders (each pipeline stage's first rank when bucketed, rank 0 otherwise) in buckets
of the plan's `sync_bucket_gb` to every rollout engine of every part (`executors.reshard`).
Under Ray (a runtime whose calls run at once) the senders and every TP rank of the target
engines form a weight-sync group (`executors.syncgroup`; gloo on CPU, NCCL on GPUs), one per
refresh path, kept while its members are: the driver sends each member one control call per
refresh (the manifests: names, shapes, offsets), the buckets go by broadcast rank to rank, and
Ray's object store carries no weight bytes (`GroupRefresh.control_bytes` counts what it does
carry). An engine the plan colocates with the trainer (one slot, priced at `sync_local_gbs`)
forms no group: the trainer rank beside it hands it each bucket as shared memory (CUDA IPC on a
GPU, a named segment on the CPU: `executors.ipc`, `GroupRefresh.handover`); the protocol is the
one the engines name, looked up in `executors.syncgroup.PROTOCOLS`. In one process
(`LocalRuntime`) a call per bucket and engine hands the bucket over as an argument. The bucket
size is each engine's own device's: the parts of a split rollout on different device types each
get a stream of their own. Each engine's `weight sync` trace event carries the bytes it
received, the calls per sender (`calls`), the senders, and its node (`dst` pool:node); its time
runs from the refresh's start to the engine's last bucket loaded, as
`placer.calibrate.fit_events` prices it (`costmodel.transfer_time`: the wire, `sync_latency_s`,
and per further call `costmodel.sync_call_cost`). The context's `known` records the version each
rollout worker holds, so a worker that has v is skipped; one still busy with an abandoned
straggler call is synced later (`known` None), and one that died while loading re-syncs before
its next work.
"""
from __future__ import annotations

import pickle
import time
from collections.abc import Callable, Sequence
from typing import Any

from executors.context import LoopContext, TrainingLost
from executors.placement import Member
from executors.reshard import StreamLayout
from executors.runplan import RunPlan
from executors.runtime import Calls, Handle, Outcome
from executors.syncgroup import BUCKETS, PROTOCOLS, GroupSpec, Protocol
from placer.base.roles import Role

Outcomes = list[tuple[str | None, dict[str, Any]]]  # per target: (error or None, its figures)
# buckets a hand-over sender has out unacknowledged (NeMo-RL's two ping-pong buffers)
WINDOW = 2


def bucket_bytes(run: RunPlan, pool: str | None = None) -> int:
    """The refresh's bucket size in bytes for engines on `pool` (default: the rollout's pool):
    the plan's `sync_bucket_gb` for that pool's device, as `placer.cost.timing.sync_time` prices
    each part of a split rollout with its own device's (0: a call per tensor)."""
    rollout = run.roles.get(Role.ROLLOUT)
    if rollout is None:
        return 0
    return run.pools[pool if pool is not None else rollout.pool].sync_bucket_bytes


def by_path(run: RunPlan, targets: list[Member]) -> dict[tuple[int, bool], list[Member]]:
    """The targets grouped by refresh path, in first-seen order: their bucket size (each
    engine's own pool's device: the parts of a split rollout may differ) and whether the plan
    colocates them with the trainer (a mixed rollout's parts take their weights apart: the
    colocated one by its colocated path, the other over the group). `run`'s rollout role is
    the targets' (a multi-agent run passes each agent's view, `executors.agentrun`)."""
    rollout = run.roles.get(Role.ROLLOUT)
    out: dict[tuple[int, bool], list[Member]] = {}
    for m in targets:
        colocated = rollout is not None and rollout.group_of(m.rank).colocated
        out.setdefault((bucket_bytes(run, m.bundle.pool), colocated), []).append(m)
    return out


def path_key(size: int, colocated: bool) -> int:
    """A refresh path's key (`GroupSpec.path`): its engines' bucket size, or for colocated
    engines -1 - size (no bucket size is negative), so that the two parts of a mixed rollout
    on devices of one bucket size never share a group."""
    return -1 - size if colocated else size


def _pickled(obj: object) -> int:
    return len(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


class GroupRefresh:
    """The driver's side of refreshes over the weight-sync group: forms a group per refresh
    path (its senders and target engines; re-formed when they change, or after a failure or a
    restart: `drop`), then per refresh prepares the senders' streams, and starts every sender's
    broadcasts and every engine's receipt at once. `control_bytes`: the pickled size of every
    control message and result so far (what Ray's object store carries for weight sync).
    Groups are held by (scope, path): a multi-agent run refreshes each agent's engines from its
    own trainer under its own scope (the agent), so that two agents' paths never share one."""

    def __init__(self, rt: Calls, send_shards: bool = False, scope: str = "") -> None:
        """`scope`: the default scope of this driver's groups (a fleet's job whose engines
        other jobs share, `executors.fleetrun`); it names the groups too, unique per scope."""
        self.rt, self.send_shards, self.scope = rt, send_shards, scope
        self.groups: dict[tuple[str, int], tuple[tuple[Any, ...], GroupSpec]] = {}
        self.formed = 0
        self.control_bytes = 0
        self.reclaimed = 0  # hand-over buckets a sender released unacknowledged

    def drop(self) -> None:
        """Forget every group: the next refresh forms them anew."""
        self.groups.clear()

    def one(self, m: Member, method: str, *args: object) -> Any:
        out = self.rt.results([self.rt.call(m, method, *args)])[0]
        if not out.ok:
            raise TrainingLost(out.error)
        self.control_bytes += _pickled(args) + _pickled(out.value)
        return out.value

    def each(self, calls: Sequence[tuple[Member, str, tuple[object, ...]]]) -> list[Any]:
        """`one` for several calls issued at once (one round trip): their values, in order;
        TrainingLost on the first that failed."""
        outs = self._all(calls)
        bad = next((o.error for o in outs if not o.ok), None)
        if bad is not None:
            raise TrainingLost(bad)
        return [o.value for o in outs]

    def _all(self, calls: Sequence[tuple[Member, str, tuple[object, ...]]]) -> list[Any]:
        outs = self.rt.results([self.rt.call(m, meth, *a) for m, meth, a in calls])
        self.control_bytes += sum(_pickled(a) for _, _, a in calls)
        self.control_bytes += sum(_pickled(o.value) for o in outs if o.ok)
        return outs

    def group(self, path: int, senders: list[Member], targets: list[Member], scope: str = ""
              ) -> GroupSpec:
        """The path's group of these senders and targets, formed anew when they changed (a
        member's process too: a restarted one is in no group); each target joins with the
        ranks it says it holds (a torch engine: its TP ranks). `scope`: whose path it is."""
        outs = self._all([(m, "sync_member", ()) for m in senders + targets])
        bad = next((o.error for o in outs if not o.ok), None)
        if bad is not None:
            raise TrainingLost(bad)
        key: tuple[Any, ...] = (len(senders), *((m.rank, o.value[2])
                                                for m, o in zip(senders + targets, outs)))
        scope = scope or self.scope
        held = self.groups.get((scope, path))
        if held is not None and held[0] == key:
            return held[1]
        self.groups.pop((scope, path), None)
        backend = "nccl" if all(o.value[0] == "cuda" for o in outs) else "gloo"
        tps = [int(o.value[1]) for o in outs[len(senders):]]
        protocol = _protocol([o.value for o in outs[len(senders):]])
        addr, port = self.one(senders[0], "sync_host")
        self.formed += 1
        spec = GroupSpec(f"wsync{'-' + scope if scope else ''}{self.formed}", path, addr, port,
                         len(senders), tuple(tps), backend, self.send_shards,
                         protocol=protocol.name, scope=scope)
        outs = self._all([(s, "sync_join", (spec, i)) for i, s in enumerate(senders)]
                         + [(m, "sync_join", (spec, j)) for j, m in enumerate(targets)])
        bad = next((o.error for o in outs if not o.ok), None)
        if bad is not None:
            raise TrainingLost(f"weight sync: forming group {spec.name}: {bad}")
        self.groups[(scope, path)] = (key, spec)
        return spec

    def refresh(self, spec: GroupSpec, senders: list[Member], targets: list[Member],
                version: int, size: int, actors: Sequence[Member] = ()) -> Outcomes:
        """One refresh of `version` in buckets of `size` bytes over the group `spec`; the
        trainer ranks in `actors` that send nothing take part in the senders' gathers
        (`sync_gather`: a sharded trainer gathers each tensor as its bucket is sent)."""
        before = self.control_bytes
        prepared = [self.one(s, "sync_prepare", spec.name, size, i)
                    for i, s in enumerate(senders)]
        # calls per sender: its buckets, or under SGLang's protocol one broadcast per tensor
        counts = [max(spec.mechanism.calls(m) for m in ms) for ms in prepared]
        manifests = [m for ms in prepared for m in ms]
        sending = {s.rank for s in senders}
        helpers = [a for a in actors if a.rank not in sending]
        calls = ([(s, "sync_send", (spec.name,)) for s in senders]
                 + [(a, "sync_gather", (size,)) for a in helpers]
                 + [(m, "sync_receive", (spec.name, manifests, version)) for m in targets])
        outs = self._all(calls)
        sent, got = outs[:len(senders) + len(helpers)], outs[len(senders) + len(helpers):]
        failed = next((o.error for o in sent if not o.ok), None)
        if failed is not None or not all(o.ok for o in got):
            self.drop()  # a member may have lost its place in the group: form it anew
        src = ",".join(f"{s.role}{s.rank}" for s in senders)
        control = self.control_bytes - before
        out: Outcomes = []
        for o in got:
            err = o.error if not o.ok else failed
            v = o.value if o.ok else {"t0": 0.0, "dur": 0.0, "bytes": 0}
            out.append((err, {"end": v["t0"] + v["dur"], "bytes": v["bytes"],
                              "calls": max(counts), "senders": len(senders), "src": src,
                              "backend": spec.backend, "control_bytes": control}))
        return out

    def run(self, path: int, actors: list[Member], senders: list[Member],
            targets: list[Member], version: int, size: int, scope: str = "",
            gathers: bool = True) -> Outcomes:
        """One refresh of the path's `targets` in buckets of `size` bytes by the protocol they
        name (`PROTOCOLS`): over the path's group from `senders`, or handed over as shared
        memory (`handover`). `path` keys the group within `scope` (`path_key`: the bucket
        size, and whether the engines share the actor's slot)."""
        infos = self._infos(targets)
        protocol = _protocol(infos)
        if protocol.forms_group:
            spec = self.group(path, senders, targets, scope)
            return self.refresh(spec, senders, targets, version, size,
                                actors if gathers else ())
        return self.handover(actors, targets, infos, version, size, protocol)

    def _infos(self, ms: list[Member]) -> list[tuple[Any, ...]]:
        outs = self._all([(m, "sync_member", ()) for m in ms])
        bad = next((o.error for o in outs if not o.ok), None)
        if bad is not None:
            raise TrainingLost(bad)
        return [tuple(o.value) for o in outs]

    def handover(self, actors: list[Member], targets: list[Member], infos: list[tuple[Any, ...]],
                 version: int, size: int, protocol: Protocol) -> Outcomes:
        """A refresh handed over as shared memory to colocated engines (`executors.ipc`): each
        engine TP rank's sender (the trainer rank on that rank's device, `devices_of`;
        `HandOverSender.handover_senders`) exports every bucket once per engine TP rank it
        serves, the engine maps and loads it and acknowledges (`protocol.receive`; the whole
        tensors each bucket completes when `protocol.tensors`), and a sender builds bucket k
        only after bucket k - `WINDOW`'s acknowledgements (passed as arguments: the runtime
        orders the calls, no round trip through here). Only handles, bucket heads and
        acknowledgements travel (`control_bytes`); what no engine acknowledged its sender
        reclaims."""
        before = self.control_bytes
        by_rank = {a.rank: a for a in actors}
        beside = [[[a.rank for a in actors if device_of(a, actors) == d]
                   for d in devices_of(m, targets, int(i[1]))] for m, i in zip(targets, infos)]
        lead = by_rank[min(by_rank)]
        # the trainer's answers in one round trip: who hands over, and whether every rank
        # takes part in each bucket's gathers
        streaming, gathers = self.each([(lead, "handover_senders", (size > 0, beside)),
                                        (lead, "handover_gathers", ())])
        plan = [[[by_rank[r] for r in per_tp] for per_tp in streams] for streams in streaming]
        device = "cuda" if all(i[0] == "cuda" for i in infos) else "cpu"
        self.formed += 1
        refresh = f"handover{self.formed}-v{version}"
        senders = list({s.rank: s for streams in plan for st in streams for s in st}.values())
        if gathers:  # every rank joins each gather
            senders += [a for a in actors if a.rank not in {s.rank for s in senders}]
        index = {s.rank: i for streams in reversed(plan) for i, st in enumerate(streams)
                 for s in st}
        prepared = self.each([(s, "handover_prepare", (refresh, size, index.get(s.rank, 0),
                                                       device, protocol.tensors, s.rank))
                              for s in senders])  # the senders at once: one round trip
        layouts = {s.rank: m.layout() for s, m in zip(senders, prepared)}
        acks, got = self._hand_over(refresh, version, plan, senders, targets, layouts,
                                    protocol.receive)
        # the rest acknowledged here, every sender at once; what nobody took is reclaimed
        mine = {s.rank: [o.value for (r, _), hs in acks.items() if r == s.rank
                         for o in self.rt.results(hs) if o.ok] for s in senders}
        self.reclaimed += sum(int(n) for n in self.each(
            [(s, "handover_release", (refresh, *mine[s.rank])) for s in senders]))
        backend = "cuda-ipc" if device == "cuda" else "shm"
        out: Outcomes = []
        for streams, os_ in zip(plan, got):
            bad = next((o.error for o in os_ if not o.ok), None)
            if bad is None and not (os_ and os_[-1].value["done"]):
                bad = "the refresh ended before every stream was handed over"
            vals = [o.value for o in os_ if o.ok]
            src = list({s.rank: s for st in streams for s in st}.values())
            out.append((bad, {"end": max((v["t0"] + v["dur"] for v in vals), default=0.0),
                              "bytes": sum(v["bytes"] for v in vals),
                              "calls": max(layouts[st[0].rank].count for st in streams),
                              "senders": len(streams),
                              "src": ",".join(f"{s.role}{s.rank}" for s in src),
                              "backend": backend, "control_bytes": self.control_bytes - before}))
        return out

    def _hand_over(self, refresh: str, version: int, plan: list[list[list[Member]]],
                   senders: list[Member], targets: list[Member], layouts: dict[int, StreamLayout],
                   receive: str) -> tuple[dict[tuple[int, int], list[Handle]], list[list[Outcome]]]:
        """Issue every bucket's exports and receipts at once, the k-th buckets of the senders
        together: per bucket each sender exports a handle for every engine TP rank it serves
        (`plan[j][i][t]`: engine j's stream i's sender to TP rank t), then each engine's
        receipt (`receive`) takes its senders' exports as arguments and, per TP rank, which
        export and handle is its (`ipc.Picks`). The receipts by (sender rank, bucket), and
        each engine's outcomes."""
        served: dict[int, list[tuple[int, int, int]]] = {s.rank: [] for s in senders}
        for j, streams in enumerate(plan):
            for i, st in enumerate(streams):
                for t, s in enumerate(st):
                    served[s.rank].append((j, i, t))
        acks: dict[tuple[int, int], list[Handle]] = {}
        got: list[list[Handle]] = [[] for _ in targets]
        exports: list[Handle] = []
        for k in range(max((lay.count for lay in layouts.values()), default=0)):
            now: dict[int, Handle] = {}
            for s in senders:
                if k < layouts[s.rank].count:
                    now[s.rank] = self.rt.call(s, "handover_export", refresh, k,
                                               len(served[s.rank]),
                                               *acks.get((s.rank, k - WINDOW), []))
                    exports.append(now[s.rank])
            for j, streams in enumerate(plan):
                for i, st in enumerate(streams):
                    if k >= layouts[st[0].rank].count:
                        continue
                    head = layouts[st[0].rank].head(k)
                    ranks = list(dict.fromkeys(s.rank for s in st))
                    picks = [(ranks.index(s.rank), served[s.rank].index((j, i, t)))
                             for t, s in enumerate(st)]
                    a = self.rt.call(targets[j], receive, head, version, len(streams), refresh,
                                     picks, *[now[r] for r in ranks])
                    self.control_bytes += _pickled((refresh, k, head, version, picks))
                    for r in ranks:
                        acks.setdefault((r, k), []).append(a)
                    got[j].append(a)
        outs = [self.rt.results(hs) for hs in got]
        # what travels: the handles, the acknowledgements, each call's bucket head
        self.control_bytes += sum(_pickled(o.value) for o in self.rt.results(exports) if o.ok)
        self.control_bytes += sum(_pickled(o.value) for os_ in outs for o in os_ if o.ok)
        return acks, outs


def refresh_paths(group: GroupRefresh, run: RunPlan, actors: list[Member],
                  targets: list[Member], version: int, scope: str = "", gathers: bool = True
                  ) -> list[tuple[Member, str | None, dict[str, Any]]]:
    """One refresh of `version` from the trainer ranks `actors` to `targets` over the
    weight-sync machinery, one stream per refresh path (`by_path`: a split rollout's parts each
    get their device's buckets, a mixed rollout's colocated part its own): the senders the
    trainer names (`sync_senders`), then `GroupRefresh.run` under `scope`. Per target, in path
    order: (it, error or None, its figures). `gathers` False: the senders stream a kept copy,
    so the other trainer ranks take no part."""
    by_rank = {m.rank: m for m in actors}
    out: list[tuple[Member, str | None, dict[str, Any]]] = []
    for (size, colocated), ms in by_path(run, targets).items():
        senders = [by_rank[r] for r in group.one(by_rank[min(by_rank)], "sync_senders", size > 0)]
        outs = group.run(path_key(size, colocated), list(by_rank.values()), senders, ms,
                         version, size, scope, gathers)
        out.extend((m, err, got) for m, (err, got) in zip(ms, outs))
    return out


def device_of(m: Member, role: list[Member]) -> tuple[int, Any]:
    """The (bundle, device) a member's first device is: a bundle's devices go to the role's
    members in it in rank order, an equal share each (a trainer rank one, an engine replica
    its TP group)."""
    same = sorted(x.rank for x in role if x.bundle.index == m.bundle.index)
    devices = list(m.bundle.devices)
    per = max(len(devices) // max(len(same), 1), 1)
    at = same.index(m.rank) * per if m.rank in same else 0
    return m.bundle.index, devices[min(at, len(devices) - 1)] if devices else None


def devices_of(m: Member, role: list[Member], tp: int) -> list[tuple[int, Any]]:
    """The (bundle, device) of each of engine `m`'s `tp` TP ranks: its share of its bundle's
    devices (`device_of`: the first), one per TP rank (the last again when the share is
    short: an emulated bundle)."""
    bundle, first = device_of(m, role)
    devices = list(m.bundle.devices)
    at = devices.index(first) if first in devices else 0
    return [(bundle, devices[min(at + t, len(devices) - 1)] if devices else None)
            for t in range(tp)]


def _protocol(infos: list[tuple[Any, ...]]) -> Protocol:
    """The protocol the engines name (`sync_member`'s fourth field; the buckets' without one):
    one per refresh path."""
    names = {i[3] if len(i) > 3 else BUCKETS for i in infos}
    if len(names) > 1:
        raise TrainingLost(f"weight sync: one refresh path's engines speak {sorted(names)}")
    name = next(iter(names), BUCKETS)
    if name not in PROTOCOLS:
        raise TrainingLost(f"weight sync: an engine speaks {name!r}, not one of "
                           f"{sorted(PROTOCOLS)}")
    return PROTOCOLS[name]


class WeightSync:
    def __init__(self, ctx: LoopContext, send_shards: bool = False) -> None:
        """`send_shards`: the senders cut each engine TP rank's slice (`executors.syncgroup`);
        the broadcast transport `placer execute` runs reshards on the receiving side."""
        self.ctx = ctx
        self.refreshes = 0
        self.group = GroupRefresh(ctx.rt, send_shards)

    def _trainer_call(self, m: Member, method: str, *args: object) -> Any:
        out = self.ctx.rt.results([self.ctx.rt.call(m, method, *args)])[0]
        if not out.ok:
            raise TrainingLost(out.error)
        return out.value

    def _colocated(self) -> list[Member]:
        """The rollout engines that share their slot with the trainer."""
        r = self.ctx.run.roles.get(Role.ROLLOUT)
        return [m for m in self.ctx.by_role[Role.ROLLOUT]
                if r is not None and r.group_of(m.rank).colocated]

    def sleep(self, step: int) -> None:
        """A colocated engine frees its device memory for the training phase (vLLM's `sleep`,
        SGLang's `release_memory_occupation`); a lost engine re-syncs before its next work."""
        self._engines("sleep_engine", step)

    def _engines(self, method: str, step: int) -> None:
        """Every colocated engine's `method` at once, one `transfer` event per engine on its
        track (`sleep rollout` / `wake rollout`; `swapped`: whether it changed state), as the
        multi-agent loop traces them (`executors.agentrun.AgentLoop.swap`). An engine that
        fails is marked stale (`error` in its event): it re-syncs before its next work."""
        ms = self._colocated()
        if not ms:
            return
        t = time.time()
        outs = self.ctx.rt.results([self.ctx.rt.call(m, method) for m in ms])
        dur = time.time() - t
        what = "sleep" if method == "sleep_engine" else "wake"
        for m, o in zip(ms, outs):
            if not o.ok:
                self.ctx.known[m.rank] = None
            failed = {} if o.ok else {"error": o.error}
            self.ctx.event(f"{what} {m.role}", "transfer", t, dur, m, step,
                           swapped=bool(o.value) if o.ok else False, **failed)

    def sync(self, step: int, force: Member | None = None) -> int:
        """Send the trainer's version to the free rollout workers without it (and to `force`);
        returns the version. Colocated engines wake first (`sleep`)."""
        ctx = self.ctx
        self._engines("wake_engine", step)
        t = time.time()
        actors = ctx.by_role[Role.ACTOR]
        info = self._trainer_call(actors[0], "weights_info")
        version = int(info[0])
        # the senders stream a copy kept since the step's end (no rank gathers now), or gather
        # from the shards as they stream (`executors.trainer.Trainer._keep`)
        source = "kept copy" if len(info) > 2 and info[2] else "gathered"
        rollouts = ctx.by_role[Role.ROLLOUT]
        free = ctx.busy.free(ctx.rt, rollouts)
        for m in rollouts:
            if all(m is not f for f in free):  # still busy with an abandoned call: sync later
                ctx.known[m.rank] = None
        targets = [m for m in free if m is force or ctx.known.get(m.rank) != version]
        ctx.synced = version
        if not targets:
            return int(version)
        if ctx.rt.concurrent:  # over the weight-sync groups, one stream per path
            self.refreshes += 1
            done = refresh_paths(self.group, ctx.run, ctx.by_role[Role.ACTOR], targets,
                                 int(version), gathers=source == "gathered")
        else:  # one call per bucket and engine, one stream per path
            done = [(m, err, got) for (size, _), ms in by_path(ctx.run, targets).items()
                    for m, (err, got) in zip(ms, self._stream(ms, int(version), size))]
        failed = []
        for m, err, got in done:
            if err is not None:  # a rollout worker died while loading: it re-syncs first
                ctx.known[m.rank] = None
                failed.append(err)
                continue
            ctx.known[m.rank] = version
            ctx.event("weight sync", "transfer", t, max(got["end"] - t, 0.0), m, step,
                      policy_version=version, bytes=got["bytes"], calls=got["calls"],
                      senders=got["senders"], src=got["src"], dst=m.trace_pid,
                      backend=got["backend"], control_bytes=got.get("control_bytes"),
                      sync_source=source)
        if failed and not any(ctx.known.get(m.rank) == version for m in rollouts):
            # No rollout worker holds version v: the trainer's copy was lost with its process or
            # its node (a process can answer for a moment after its node is gone). Rolling
            # out with older weights would break the mode's staleness bound: recover instead.
            ctx.check_cluster()
            raise TrainingLost(f"weight sync of version {version} reached no rollout worker: "
                               f"{failed[0]}")
        ctx.event("sync", "stage", t, time.time() - t, None, step, policy_version=version,
                  sync_source=source)
        ctx.synced = version
        return int(version)

    def _stream(self, targets: list[Member], version: int, size: int) -> Outcomes:
        """One refresh (`executors.reshard`): every sender's buckets of `size` bytes, in order,
        to every target; per target (error or None, {end, bytes, calls, senders, src}). The
        trainer holds one open stream per sender: a second refresh opens after the first's
        bucket calls, which its actor runs first (an actor runs its calls in order)."""
        ctx, rt = self.ctx, self.ctx.rt
        actors = {m.rank: m for m in ctx.by_role[Role.ACTOR]}
        ranks = self._trainer_call(actors[min(actors)], "sync_senders", size > 0)
        senders = [actors[r] for r in ranks]
        opened = [self._trainer_call(s, "sync_open", size, i) for i, s in enumerate(senders)]
        counts = [int(o[2]) for o in opened]
        self.refreshes += 1
        refresh = f"v{version}.{self.refreshes}"
        handles: list[list[Handle]] = [[] for _ in targets]
        for k in range(max(counts)):  # the streams interleaved: they run in parallel
            for i, s in enumerate(senders):
                if k < counts[i]:
                    ref = rt.call(s, "sync_bucket", k)
                    for hs, m in zip(handles, targets):
                        hs.append(rt.call(m, "receive_bucket", ref, version, len(senders), refresh))
                    rt.forget(ref)
        src = ",".join(f"{s.role}{s.rank}" for s in senders)
        out: Outcomes = []
        for hs in handles:
            res = rt.results(hs)
            bad = next((o.error for o in res if not o.ok), None)
            if bad is None and not res[-1].value["done"]:
                bad = "the refresh ended before every stream was received"
            vals = [o.value for o in res if o.ok]
            out.append((bad, {"end": max((v["t0"] + v["dur"] for v in vals), default=0.0),
                              "bytes": sum(v["bytes"] for v in vals), "calls": max(counts),
                              "senders": len(senders), "src": src, "backend": "in-process"}))
        return out

    def resync(self, step: int) -> Callable[[Member], None]:
        """What a rollout call's re-run needs first: its restarted worker holds no weights."""
        def fix(m: Member) -> None:
            self.ctx.known[m.rank] = None
            self.group.drop()  # a restarted process is in no group
            self.sync(step, force=m)
        return fix
