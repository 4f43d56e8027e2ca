"""The driver's side of a refresh handed over as shared memory (`executors.ipc`): the plan of
which trainer rank hands each colocated engine TP rank its buckets, the senders' manifests, the
bucket exports and receipts issued at once (the runtime orders them), and the release.

Mixed into `executors.weights.GroupRefresh`, which supplies the runtime (`rt`), its batched calls
(`each`), and the counters (`control_bytes`, `formed`, `reclaimed`) and what it keeps between
refreshes (`handover_senders`: the plan of senders per placement; `handover_manifests`: each
stream's manifest, so that a later refresh issues the senders' preparation with the buckets'
calls rather than waiting for it: one round trip fewer).
"""
from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

from executors.placement import Member, device_of, devices_of
from executors.reshard import Manifest, StreamLayout, manifest_digest
from executors.runtime import Calls, Handle, Outcome
from executors.syncgroup import Protocol

Outcomes = list[tuple[str | None, dict[str, Any]]]  # per target: (error or None, its figures)
# buckets a hand-over sender has out unacknowledged (NeMo-RL's two ping-pong buffers)
WINDOW = 2


def pickled(obj: object) -> int:
    """An object's pickled size: what Ray's object store carries for it."""
    return len(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


class HandOverDriver:
    """The hand-over's refresh, as `GroupRefresh` runs it (module docstring)."""

    rt: Calls
    control_bytes: int
    round_trips: int
    formed: int
    reclaimed: int
    handover_manifests: dict[tuple[Any, ...], dict[int, Manifest]]
    handover_senders: dict[tuple[bool, str], list[list[list[int]]]]

    def each(self, calls: Sequence[tuple[Member, str, tuple[object, ...]]]) -> list[Any]:
        raise NotImplementedError  # `GroupRefresh.each`

    def _handover_plan(self, actors: list[Member], targets: list[Member],
                       infos: list[tuple[Any, ...]], size: int, gathers: bool | None
                       ) -> tuple[list[list[list[int]]], bool]:
        """(per engine, per stream and TP rank, the trainer rank that hands it over; whether
        every rank takes part in each bucket's gathers). The first is a function of where
        the ranks sit and the trainer's layout, so it is asked once per placement and kept;
        the second is asked along with it unless the caller knows it (`gathers`)."""
        by_rank = {a.rank: a for a in actors}
        beside = [[[a.rank for a in actors if device_of(a, actors) == d]
                   for d in devices_of(m, targets, int(i[1]))] for m, i in zip(targets, infos)]
        lead = by_rank[min(by_rank)]
        # whose trainer (a multi-agent run's agents share this driver), where its ranks sit
        key = (size > 0, repr((beside, sorted((a.role, a.slot, a.rank) for a in actors))))
        calls: list[tuple[Member, str, tuple[object, ...]]] = []
        if key not in self.handover_senders:
            calls.append((lead, "handover_senders", (size > 0, beside)))
        if gathers is None:
            calls.append((lead, "handover_gathers", ()))
        vals = self.each(calls) if calls else []
        if key not in self.handover_senders:
            self.handover_senders[key] = vals.pop(0)
        return self.handover_senders[key], bool(vals[0]) if gathers is None else gathers

    def handover(self, actors: list[Member], targets: list[Member], infos: list[tuple[Any, ...]],
                 version: int, size: int, protocol: Protocol, gathers: bool | None = None
                 ) -> Outcomes:
        """A refresh handed over as shared memory to colocated engines (`executors.ipc`): each
        engine TP rank's sender (the trainer rank on that rank's device, `devices_of`;
        `HandOverSender.handover_senders`) exports every bucket once per engine TP rank it
        serves, the engine maps and loads it and acknowledges (`protocol.receive`; the whole
        tensors each bucket completes when `protocol.tensors`), and a sender builds bucket k
        only after bucket k - `WINDOW`'s acknowledgements (passed as arguments: the runtime
        orders the calls, no round trip through here). Only handles, bucket heads and
        acknowledgements travel (`control_bytes`); what no engine acknowledged its sender
        reclaims. Round trips: the plan of senders (once per placement, `_handover_plan`), the
        senders' manifests (at the first refresh of a stream: later ones issue the
        preparation with the buckets' calls, checked against the kept manifest), the buckets,
        the release."""
        before = self.control_bytes
        by_rank = {a.rank: a for a in actors}
        streaming, gathers = self._handover_plan(actors, targets, infos, size, gathers)
        plan = [[[by_rank[r] for r in per_tp] for per_tp in streams] for streams in streaming]
        device = "cuda" if all(i[0] == "cuda" for i in infos) else "cpu"
        self.formed += 1
        refresh = f"handover{self.formed}-v{version}"
        senders = list({s.rank: s for streams in plan for st in streams for s in st}.values())
        if gathers:  # every rank joins each gather
            senders += [a for a in actors if a.rank not in {s.rank for s in senders}]
        index = {s.rank: i for streams in reversed(plan) for i, st in enumerate(streams)
                 for s in st}
        key = (size, device, protocol.name, tuple((s.role, s.slot, s.rank, index.get(s.rank, 0),
                                                   s.bundle.index) for s in senders))
        kept = self.handover_manifests.get(key)
        preps: list[Handle] = []
        if kept is None:  # the senders at once: one round trip, their manifests kept
            kept = dict(zip((s.rank for s in senders), self.each(
                [(s, "handover_prepare", (refresh, size, index.get(s.rank, 0), device,
                                          protocol.tensors, s.rank)) for s in senders])))
        else:  # issued with the buckets' calls (an actor runs its calls in order), checked
            # against the kept manifests by digest there: no round trip of their own
            preps = [self.rt.call(s, "handover_prepare", refresh, size, index.get(s.rank, 0),
                                  device, protocol.tensors, s.rank,
                                  manifest_digest([kept[s.rank]])) for s in senders]
        layouts = {r: m.layout() for r, m in kept.items()}
        acks, got = self._hand_over(refresh, version, plan, senders, targets, layouts,
                                    protocol.receive)
        prep_bad = next((o.error for o in self.rt.results(preps) if not o.ok), None)
        if prep_bad is None and all(o.ok for os_ in got for o in os_):
            self.handover_manifests[key] = kept
        else:  # cut anew at the next refresh
            self.handover_manifests.pop(key, None)
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
                    self.control_bytes += pickled((refresh, k, head, version, picks))
                    for r in ranks:
                        acks.setdefault((r, k), []).append(a)
                    got[j].append(a)
        self.round_trips += 1  # the buckets' calls, issued together, waited on here
        outs = [self.rt.results(hs) for hs in got]
        # what travels: the handles, the acknowledgements, each call's bucket head
        self.control_bytes += sum(pickled(o.value) for o in self.rt.results(exports) if o.ok)
        self.control_bytes += sum(pickled(o.value) for os_ in outs for o in os_ if o.ok)
        return acks, outs
