"""Weight sync under Ray: the driver's sync stage per step and its sequential round trips.

A refresh is a chain of driver calls to the trainer's senders and the rollout engines (the
version and senders, the members' processes, the streams' manifests, the broadcasts); each
call the driver waits on before it can issue the next is one round trip through Ray, whatever
the bytes. This runs `placer execute`'s Ray runtime on the plan `placer plan` makes of a job
(examples/tiny-cpu.yaml: the trainer on one pool, the rollout on another, so every refresh goes
over the weight-sync group) and reads, per step after step 0:

  sync s       the driver's `sync` stage (the trace's stage event: the refresh's wall time);
  round trips  the driver's waits (`results` on the runtime) inside `WeightSync.sync` that
               wait on a call issued since the previous such wait: calls issued together and
               waited on one after the other are one round trip, a wait on calls already
               waited for none. Counted by wrapping the runtime's methods here, so the count
               is the same whatever version of the executor runs.

`--rollout-pool lpu` pins the rollout to that pool (`pin: {rollout: {pool: lpu}}`): with the
trainer on the gpu pool, the refresh goes over the weight-sync group (gloo) instead of the
colocated hand-over tiny-cpu.yaml's plan makes.

Measured (this machine: 2 cores shared with other jobs, load average 11-30; 6 steps, the sync
stage's median after step 0; each pair back to back, main at ba1b3fe first, then this code):
  round trips per refresh, every run alike: tiny-cpu.yaml (hand-over to 2 colocated engines)
    8 -> 6 at the first refresh, 4 after (wake, survey, buckets, release); --rollout-pool lpu
    (2 trainer ranks to 4 engines over gloo) 8 -> 5 at the first (survey, store, joins,
    manifests, send), 6 -> 2 after (survey, send). The driver blocked ~3-4 ms per round trip
    before (median 4.1 ms hand-over, 3.2 ms group), so ~13-16 ms saved per refresh.
  sync stage, s (before -> after): hand-over 0.037 -> 0.020 and 0.056 -> 0.051; group
    0.050 -> 0.017, 0.022 -> 0.023 and 0.026 -> 0.021. At this model size (~0.2 MB) the
    stage's wall time is mostly this machine's load: only the round-trip counts are stable.

Usage: python -m bench.bench_weightsync [--steps N] [--job PATH] [--rollout-pool POOL] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from placer.cost.calibration import load_calibration
from placer.cost.pricer import Pricer
from placer.solve.planner import plan_job
from placer.spec.catalog import resolve
from placer.spec.load import load_job

ROOT = Path(__file__).resolve().parents[1]


class _Counter:
    """Blocking waits of the driver inside each refresh (`WeightSync.sync`), per call of it."""

    def __init__(self) -> None:
        self.inside = False
        self.per_sync: list[int] = []
        self.wait_s: list[float] = []  # the driver's time blocked in those waits, per refresh
        self.issued = 0  # calls issued so far
        self.waited = 0  # calls issued before the last counted wait
        self.seq: dict[int, int] = {}  # id(handle) -> its call's number


def _instrument(counter: _Counter, start_timeout_s: float) -> None:
    """Wrap the Ray runtime's `results` and `WeightSync.sync` (this process only); give the
    actors `start_timeout_s` to start (a loaded machine starts them slowly)."""
    from executors.runtime import RayRuntime
    from executors.weights import WeightSync
    results, sync, init = RayRuntime.results, WeightSync.sync, RayRuntime.__init__
    call = RayRuntime.call

    def numbered(self: Any, m: Any, method: str, *args: object) -> Any:
        h = call(self, m, method, *args)
        counter.issued += 1
        counter.seq[id(h)] = counter.issued
        return h

    def starting(self: Any, *args: Any, **kw: Any) -> None:
        kw.setdefault("start_timeout_s", start_timeout_s)
        init(self, *args, **kw)

    def counted(self: Any, handles: Any) -> Any:
        newest = max((counter.seq.get(id(h), 0) for h in handles), default=0)
        if not (counter.inside and newest > counter.waited):
            return results(self, handles)
        counter.per_sync[-1] += 1
        counter.waited = counter.issued
        t0 = time.perf_counter()
        try:
            return results(self, handles)
        finally:
            counter.wait_s[-1] += time.perf_counter() - t0

    def traced(self: Any, step: int, force: Any = None) -> int:
        outer = counter.inside
        if not outer:
            counter.per_sync.append(0)
            counter.wait_s.append(0.0)
            counter.inside = True
        try:
            return int(sync(self, step, force))
        finally:
            counter.inside = outer
    RayRuntime.__init__ = starting  # type: ignore[method-assign]
    RayRuntime.call = numbered  # type: ignore[method-assign]
    RayRuntime.results = counted  # type: ignore[method-assign]
    WeightSync.sync = traced  # type: ignore[method-assign]


def measure(steps: int, job: Path, start_timeout_s: float = 600.0,
            rollout_pool: str | None = None) -> dict[str, Any]:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from executors.run import execute  # lazy: Ray and torch load after the environment is set
    with tempfile.TemporaryDirectory() as d:
        if rollout_pool is not None and "\npin:" in job.read_text():
            raise SystemExit(f"--rollout-pool: {job} pins roles already; add the pin there")
        if rollout_pool is not None:  # the job with its rollout pinned to that pool
            pinned = Path(d) / job.name
            pinned.write_text(job.read_text() + f"\npin: {{rollout: {{pool: {rollout_pool}}}}}\n")
            job = pinned
        plan = plan_job(Pricer(resolve(load_job(job), str(job)), load_calibration(None)))
    counter = _Counter()
    _instrument(counter, start_timeout_s)
    with tempfile.TemporaryDirectory() as d:
        r = execute(plan, steps, Path(d) / "ray")
        import ray  # lazy: as `execute`
        ray.shutdown()
    stages = {int(e.args["step"]): e.dur_s for e in r.trace.events
              if e.cat == "stage" and e.name == "sync" and e.pid == "driver"}
    syncs = [e for e in r.trace.events if e.name == "weight sync"]
    later = [s for s in sorted(stages) if s > 0]
    return {"steps": steps, "sync_s": [round(stages[s], 4) for s in sorted(stages)],
            "median_sync_s": statistics.median([stages[s] for s in later]) if later else 0.0,
            "round_trips": counter.per_sync,
            # the driver's time blocked per round trip, median over the refreshes after the first
            "s_per_round_trip": statistics.median(
                [w / n for w, n in zip(counter.wait_s[1:], counter.per_sync[1:]) if n] or [0.0]),
            "weight_sync_events": len(syncs),
            "layout": {name: f"{x.pool} dp{x.dp} tp{x.tp} pp{x.pp}"
                       for name, x in plan.roles.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--job", default=str(ROOT / "examples" / "tiny-cpu.yaml"))
    ap.add_argument("--rollout-pool", default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    res = measure(max(a.steps, 2), Path(a.job), rollout_pool=a.rollout_pool)
    if a.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"weight sync, {res['steps']} steps of {Path(a.job).name}; plan: "
          + ", ".join(f"{k} {v}" for k, v in res["layout"].items()))
    print(f"  sync stage per step (s): {res['sync_s']}; median after step 0 "
          f"{res['median_sync_s']:.3f}")
    print(f"  driver round trips per refresh: {res['round_trips']}; blocked per round trip "
          f"(median after the first refresh) {res['s_per_round_trip']:.4f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
