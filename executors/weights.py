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
and per further call `costmodel.sync_call_cost`).

Round trips. The driver waits on Ray as few times as the refresh's dependencies allow, the
calls of each wait issued together (`GroupRefresh.round_trips` counts the waits; the `sync`
stage event carries them as `round_trips`): the trainer's version and senders and every
member's process (`executors.syncsurvey`), then over a held group the senders' sends, the
other trainer ranks' gathers and the engines' receipts at once, the receipts handed the
manifests kept from the group's previous refresh and each sender cutting its streams in the
same call as it sends them (checked against the kept manifests by digest); only a group's
first refresh waits for the manifests first (and, when formed, for its store and joins). A
hand-over likewise issues its senders' preparation with the buckets' calls once a stream's
manifest is kept (`executors.handoverdrive`). On the senders' side the next bucket is built
(gathered from the shards) while the current one is on the wire, and the receivers post the
next bucket's receipt before loading the current one (`executors.syncgroup`).

The context's `known` records the version each
rollout worker holds, so a worker that has v is skipped; one still busy with an abandoned
straggler call is synced later (`known` None), and one that died while loading re-syncs before
its next work.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from executors.context import LoopContext, TrainingLost
from executors.handoverdrive import HandOverDriver, Outcomes, pickled
from executors.placement import Member
from executors.reshard import Manifest, manifest_digest
from executors.runplan import RunPlan
from executors.runtime import Calls, Handle
from executors.syncgroup import BUCKETS, PROTOCOLS, GroupSpec, Protocol
from executors.syncsurvey import Members, Survey, ask_revived, ask_survey, missing
from placer.base.roles import Role


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


class GroupRefresh(HandOverDriver):
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
        self.round_trips = 0  # the driver's waits on calls it issued together, so far
        self.reclaimed = 0  # hand-over buckets a sender released unacknowledged
        # each group's senders' manifests at its last refresh, by (group, bucket size): a
        # later refresh hands them to the receivers and cuts and sends in one call each
        self.manifests: dict[tuple[str, int], list[list[Manifest]]] = {}
        # the hand-over's: the senders' manifests by stream, the senders by placement
        self.handover_manifests: dict[tuple[Any, ...], dict[int, Manifest]] = {}
        self.handover_senders: dict[tuple[bool, str], list[list[list[int]]]] = {}

    def drop(self) -> None:
        """Forget every group: the next refresh forms them anew."""
        self.groups.clear()
        self.manifests.clear()
        self.handover_manifests.clear()

    def one(self, m: Member, method: str, *args: object) -> Any:
        self.round_trips += 1
        out = self.rt.results([self.rt.call(m, method, *args)])[0]
        if not out.ok:
            raise TrainingLost(out.error)
        self.control_bytes += pickled(args) + pickled(out.value)
        return out.value

    def each(self, calls: Sequence[tuple[Member, str, tuple[object, ...]]]) -> list[Any]:
        """`one` for several calls issued at once (one round trip): their values, in order;
        TrainingLost on the first that failed."""
        outs = self.outcomes(calls)
        bad = next((o.error for o in outs if not o.ok), None)
        if bad is not None:
            raise TrainingLost(bad)
        return [o.value for o in outs]

    def outcomes(self, calls: Sequence[tuple[Member, str, tuple[object, ...]]]) -> list[Any]:
        self.round_trips += 1
        outs = self.rt.results([self.rt.call(m, meth, *a) for m, meth, a in calls])
        self.control_bytes += sum(pickled(a) for _, _, a in calls)
        self.control_bytes += sum(pickled(o.value) for o in outs if o.ok)
        return outs

    def members(self, ms: Sequence[Member]) -> Members:
        """Every member's `sync_member` answer, the calls issued at once (one round trip)."""
        return dict(zip(((m.role, m.rank) for m in ms),
                        (tuple(v) for v in self.each([(m, "sync_member", ()) for m in ms]))))

    def group(self, path: int, senders: list[Member], targets: list[Member], scope: str = "",
              infos: Members | None = None) -> GroupSpec:
        """The path's group of these senders and targets, formed anew when they changed (a
        member's process too: a restarted one is in no group); each target joins with the
        ranks it says it holds (a torch engine: its TP ranks). `scope`: whose path it is.
        `infos`: the members' `sync_member` answers, when the caller asked them already."""
        if infos is None:
            infos = self.members(senders + targets)
        vals = [infos[(m.role, m.rank)] for m in senders + targets]
        key: tuple[Any, ...] = (len(senders), *((m.rank, v[2])
                                                for m, v in zip(senders + targets, vals)))
        scope = scope or self.scope
        held = self.groups.get((scope, path))
        if held is not None and held[0] == key:
            return held[1]
        old = self.groups.pop((scope, path), None)
        if old is not None:  # its streams' manifests go with it
            self.manifests = {k: v for k, v in self.manifests.items() if k[0] != old[1].name}
        backend = "nccl" if all(v[0] == "cuda" for v in vals) else "gloo"
        tps = [int(v[1]) for v in vals[len(senders):]]
        protocol = _protocol(vals[len(senders):])
        addr, port = self.one(senders[0], "sync_host")
        self.formed += 1
        spec = GroupSpec(f"wsync{'-' + scope if scope else ''}{self.formed}", path, addr, port,
                         len(senders), tuple(tps), backend, self.send_shards,
                         protocol=protocol.name, scope=scope)
        outs = self.outcomes([(s, "sync_join", (spec, i)) for i, s in enumerate(senders)]
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
        kept = self.manifests.get((spec.name, size))
        sends: list[tuple[Member, str, tuple[object, ...]]]
        if kept is None or len(kept) != len(senders):  # the group's first refresh at this size:
            # every sender cuts its streams at once and says their manifests (one round trip)
            prepared = self.each([(s, "sync_prepare", (spec.name, size, i))
                                  for i, s in enumerate(senders)])
            sends = [(s, "sync_send", (spec.name,)) for s in senders]
        else:  # the receivers get the kept manifests, each sender cuts and sends in one call
            prepared = kept
            sends = [(s, "sync_send", (spec.name, size, i, manifest_digest(ms)))
                     for i, (s, ms) in enumerate(zip(senders, kept))]
        # calls per sender: its buckets, or under SGLang's protocol one broadcast per tensor
        counts = [max(spec.mechanism.calls(m) for m in ms) for ms in prepared]
        manifests = [m for ms in prepared for m in ms]
        sending = {s.rank for s in senders}
        helpers = [a for a in actors if a.rank not in sending]
        # the sends, the other trainer ranks' gathers and the receipts at once: one round trip
        calls = (sends + [(a, "sync_gather", (size,)) for a in helpers]
                 + [(m, "sync_receive", (spec.name, manifests, version)) for m in targets])
        outs = self.outcomes(calls)
        sent, got = outs[:len(senders) + len(helpers)], outs[len(senders) + len(helpers):]
        failed = next((o.error for o in sent if not o.ok), None)
        if failed is not None or not all(o.ok for o in got):
            self.drop()  # a member may have lost its place in the group: form it anew
        else:
            self.manifests[(spec.name, size)] = [list(ms) for ms in prepared]
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
            gathers: bool | None = None, infos: Members | None = None) -> Outcomes:
        """One refresh of the path's `targets` in buckets of `size` bytes by the protocol they
        name (`PROTOCOLS`): over the path's group from `senders`, or handed over as shared
        memory (`handover`). `path` keys the group within `scope` (`path_key`: the bucket
        size, and whether the engines share the actor's slot). `gathers`: whether the other
        trainer ranks take part in the senders' gathers (no kept copy), None: not known here
        (over the group they do; a hand-over asks the trainer). `infos`: the senders' and
        targets' `sync_member` answers, when the caller asked them already."""
        if infos is None:
            infos = self.members(senders + targets)
        mine = [infos[(m.role, m.rank)] for m in targets]
        protocol = _protocol(mine)
        if protocol.forms_group:
            spec = self.group(path, senders, targets, scope, infos)
            return self.refresh(spec, senders, targets, version, size,
                                actors if gathers is not False else ())
        return self.handover(actors, targets, mine, version, size, protocol,
                             None if gathers is None else gathers and len(actors) > 1)


def refresh_paths(group: GroupRefresh, run: RunPlan, actors: list[Member],
                  targets: list[Member], version: int, scope: str = "",
                  gathers: bool | None = None, survey: Survey | None = None
                  ) -> list[tuple[Member, str | None, dict[str, Any]]]:
    """One refresh of `version` from the trainer ranks `actors` to `targets` over the
    weight-sync machinery, one stream per refresh path (`by_path`: a split rollout's parts each
    get their device's buckets, a mixed rollout's colocated part its own): the senders the
    trainer names (`sync_senders`), then `GroupRefresh.run` under `scope`. Per target, in path
    order: (it, error or None, its figures). `gathers` False: the senders stream a kept copy,
    so the other trainer ranks take no part (None: not known, `GroupRefresh.run`). `survey`:
    the senders and members, when the caller asked them already (else asked here,
    `ask_survey`: one round trip)."""
    by_rank = {m.rank: m for m in actors}
    paths = by_path(run, targets)
    if survey is None:
        survey = ask_survey(group, actors, targets, {size > 0 for size, _ in paths})
    lost = missing(survey, targets)
    if lost is not None:
        raise TrainingLost(lost)
    out: list[tuple[Member, str | None, dict[str, Any]]] = []
    for (size, colocated), ms in paths.items():
        senders = [by_rank[r] for r in survey.senders[size > 0]]
        outs = group.run(path_key(size, colocated), list(by_rank.values()), senders, ms,
                         version, size, scope, gathers, survey.members)
        out.extend((m, err, got) for m, (err, got) in zip(ms, outs))
    return out


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
        trips = self.group.round_trips
        actors = ctx.by_role[Role.ACTOR]
        rollouts = ctx.by_role[Role.ROLLOUT]
        survey = None
        # the colocated engines wake first, apart (their own `wake` events): the refresh and
        # its trace's time start once they are awake
        self._engines("wake_engine", step)
        t = time.time()
        free = ctx.busy.free(ctx.rt, rollouts)
        if ctx.rt.concurrent:  # the version, the senders and every member's process at once
            flags = {size > 0 for size, _ in by_path(ctx.run, free)}
            survey = ask_revived(self.group, actors, free, flags, self._revive(step), info=True)
            info: Any = survey.info
        else:
            info = self._trainer_call(actors[0], "weights_info")
        version = int(info[0])
        # the senders stream a copy kept since the step's end (no rank gathers now), or gather
        # from the shards as they stream (`executors.trainersync.TrainerSender._keep`)
        source = "kept copy" if len(info) > 2 and info[2] else "gathered"
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
                                 int(version), gathers=source == "gathered", survey=survey)
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
        # the driver's waits for the refresh (`GroupRefresh.round_trips`; None in one process)
        ctx.event("sync", "stage", t, time.time() - t, None, step, policy_version=version,
                  sync_source=source,
                  round_trips=self.group.round_trips - trips if ctx.rt.concurrent else None)
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

    def _revive(self, step: int) -> Callable[[Member, str], None]:
        """An engine that did not answer the refresh's survey: wait for Ray to bring it back
        (raising `TrainingLost` when it cannot), then it holds no weights and is in no group."""
        def revive(m: Member, error: str) -> None:
            t = time.time()
            try:
                self.ctx.rt.wait_alive(m)
            except Exception as e:  # its node may be gone: check, then give up
                self.ctx.check_cluster()
                raise TrainingLost(f"{m.role}{m.rank} did not come back: {error}") from e
            self.ctx.known[m.rank] = None
            self.group.drop()
            self.ctx.event(f"restart {m.role}{m.rank}", "restart", t, time.time() - t, m, step,
                           error=error, policy_version=None)
        return revive

    def resync(self, step: int) -> Callable[[Member], None]:
        """What a rollout call's re-run needs first: its restarted worker holds no weights."""
        def fix(m: Member) -> None:
            self.ctx.known[m.rank] = None
            self.group.drop()  # a restarted process is in no group
            self.sync(step, force=m)
        return fix
