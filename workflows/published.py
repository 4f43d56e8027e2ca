"""Published-runs fidelity: the cost model's step and stage times beside measured runs of real
RL frameworks (verl, EasyR1, Miles, NeMo-RL).

Each step-time row is a job file under `examples/published/` (its header states the published
numbers and every assumption: prompt lengths, the response distribution, layouts the model cannot
express) plus the layout the run used, written here as `Use` entries: pool, TP/PP/DP, ZeRO stage,
optimizer offload, engine settings (`cuda_graphs`: vLLM's enforce_eager), and which roles share
devices. Every role is priced by `placer.cost.estimate.estimate` with that layout and the roles
are combined by `placer.cost.timing.iteration_time`, exactly as `assemble` prices a plan. No
simulation runs: the predictions are the cost model's.

Published stages map onto the model's as: generation -> the rollout's `rollout` stage (verl's
`generate_sequences` where a row publishes it; it is the mean over ranks, and also holds the
colocated engine's wake-up, resharding and sleep, which the model prices as sync and switch);
old_log_prob -> the actor's `score` stage; ref -> the reference's `score` stage; update -> the
actor's `train` stage; weight sync -> the plan's sync time. Each row's job file names the
framework it ran under (`framework:`), and the row is priced with that framework's profile
(`placer.spec.framework`): verl's log-prob and update stages include its driver's dispatch
(`costmodel.dispatch_time`); Miles' (row r10, and its sync rows) have none and use Miles'
broadcast sender rate. The fully async rows publish the time
the trainer waits for generation, so only what they name is compared; their trainer takes the
old log-probs from the engine (`Row.trainer_log_probs`). A trainer steps its optimizer on the host
(`Use.offload`) where its script sets Megatron's `optimizer_cpu_offload`, and parks its weights or
optimizer between phases (`Use.park_params`, `Use.park_optimizer`) where it sets verl's or
EasyR1's `param_offload` / `optimizer_offload`, each priced as that framework copies it
(`placer.cost.offload`); a reference whose framework keeps its weights on the host (FSDP's CPU
offload: EasyR1's `ref.fsdp.enable_cpu_offload`) streams its shard in per forward micro-batch
(`Use.stream_params_bytes`, at the job file's token budget, `Job.micro_token_budget`).

The weight-sync rows (`SYNC_ROWS`) price one refresh with `timing.sync_time` on the published
hardware and mapping, with each framework's transport (verl's NCCL sync sends tensor by tensor
from rank 0, `SyncRow.bucket_gb` = 0; the others stream buckets from every pipeline stage at the
framework's sender rate; NeMo-RL's checkpoint engine pairs each engine rank with a trainer rank,
`SyncRow.transport`, `placer.cost.refit`). The decode rows (`DECODE_ROWS`) are vLLM's and SGLang's per-step
latency anchors. Several defaults were set on these rows (docs/cost-model.md marks them
in-sample). The serving rows (`workflows.serving.SERVING_ROWS`: multi-node engines' steps under
wide expert parallelism) set no default.

    python -m workflows.published [--json] [--calibration PROFILE]
    python -m workflows.published --loo [--json] [--write-band]

prints per row the published and predicted times and the relative error (predicted / published -
1), the median |error|, and the sync and decode rows. `--json` prints one document: {"rows":
[{name, published_s, predicted_s, error, stages: {...}}], "median_abs_error", "max_abs_error",
"sync": [{name, published_s, predicted_s, error}], "sync_median_abs_error", "decode": [...],
"serving": [...], "first_step": [...]}: "rows" are the steady-state step rows, "first_step" the
rows whose published times are their run's first step (`Row.first_step`, the evidence in each
row's "first_step" field), outside the medians and maxima. `--loo` fits the factors the rows
determine and prints each row in-sample beside leave-one-out (`workflows.loo`; with `--json` the
same document plus the LOO fields).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from placer.base.errors import SpecError
from placer.base.roles import Role
from placer.cost.calibration import load_calibration
from placer.cost.efficiency import Calibration
from placer.cost.generation import decode_step_time
from placer.cost.pricer import Pricer
from placer.cost.roleestimate import Estimate
from placer.cost.roofline import Memory
from placer.cost.sharding import Parallel
from placer.cost.timing import Placed
from placer.solve.layouts import fp8_flags
from placer.spec.catalog import resolve, shipped_devices, shipped_models
from placer.spec.load import job_from_dict, load_job
from workflows.loo import Pricing, Rows, loo_report
from workflows.loo_render import render_loo
from workflows.published_rows import DECODE_ROWS, ROWS, SYNC_ROWS, DecodeRow, Row, SyncRow, Use
from workflows.serving import SERVING_ROWS, ServingRow, predict_serving, render_serving

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "published"
STAGE_KEYS = ("rollout", "old_log_prob", "ref", "update", "sync")


@dataclass(frozen=True)
class Versus:
    """A published time beside the cost model's; error = predicted / published - 1."""

    published_s: float
    predicted_s: float

    @property
    def error(self) -> float:
        return self.predicted_s / self.published_s - 1

    def to_dict(self) -> dict[str, Any]:
        return {"published_s": self.published_s, "predicted_s": self.predicted_s,
                "error": self.error}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Versus:
        return cls(d["published_s"], d["predicted_s"])


@dataclass(frozen=True)
class Comparison:
    """One named row (a weight-sync or decode anchor): published beside predicted; error =
    predicted / published - 1."""

    name: str
    published_s: float
    predicted_s: float

    @property
    def versus(self) -> Versus:
        return Versus(self.published_s, self.predicted_s)

    @property
    def error(self) -> float:
        return self.versus.error

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **self.versus.to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Comparison:
        return cls(d["name"], d["published_s"], d["predicted_s"])


@dataclass(frozen=True)
class Result(Comparison):
    """One step-time row: the step and each published stage beside the prediction, and
    whether the published layout fits the cost model's memory (`note`: why not)."""

    stages: dict[str, Versus] = field(default_factory=dict)
    fits: bool = True
    note: str = ""
    first_step: str = ""  # why the published times are a first step's (`Row.first_step`)

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "stages": {k: v.to_dict() for k, v in self.stages.items()},
                "fits": self.fits, "note": self.note,
                **({"first_step": self.first_step} if self.first_step else {})}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Result:
        return cls(d["name"], d["published_s"], d["predicted_s"],
                   {k: Versus.from_dict(v) for k, v in d["stages"].items()}, d["fits"], d["note"],
                   d.get("first_step", ""))


@dataclass(frozen=True)
class PublishedReport:
    """The whole comparison: the steady-state step rows, the weight-sync rows and the decode
    anchors, with the median and largest |error|; the first-step rows apart (their times hold
    one-time costs, `Row.first_step`). `to_dict()` is the `--json` document."""

    rows: list[Result]
    sync: list[Comparison]
    decode: list[Comparison]
    # multi-node engine anchors (`workflows.serving`): one engine step's seconds
    serving: list[Comparison] = field(default_factory=list)
    first_step: list[Result] = field(default_factory=list)

    @property
    def median_abs_error(self) -> float:
        return statistics.median(abs(r.error) for r in self.rows)

    @property
    def max_abs_error(self) -> float:
        return max(abs(r.error) for r in self.rows)

    @property
    def sync_median_abs_error(self) -> float:
        return statistics.median(abs(r.error) for r in self.sync)

    def to_dict(self) -> dict[str, Any]:
        return {"rows": [r.to_dict() for r in self.rows],
                "median_abs_error": self.median_abs_error,
                "max_abs_error": self.max_abs_error,
                "sync": [r.to_dict() for r in self.sync],
                "sync_median_abs_error": self.sync_median_abs_error,
                "decode": [r.to_dict() for r in self.decode],
                "serving": [r.to_dict() for r in self.serving],
                "first_step": [r.to_dict() for r in self.first_step]}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PublishedReport:
        """The report a `to_dict()` document describes (the errors are recomputed)."""
        return cls([Result.from_dict(r) for r in d["rows"]],
                   [Comparison.from_dict(r) for r in d["sync"]],
                   [Comparison.from_dict(r) for r in d["decode"]],
                   [Comparison.from_dict(r) for r in d.get("serving", [])],
                   [Result.from_dict(r) for r in d.get("first_step", [])])

    @classmethod
    def from_json(cls, text: str) -> PublishedReport:
        return cls.from_dict(json.loads(text))


def _place(px: Pricer, role: str, use: Use) -> Estimate:
    """The role priced with the row's layout and the job's FP8 options (`precision:`) where
    they apply, as the planner sets them on its own layouts (`fp8_flags`)."""
    pool = px.res.cluster.pool(use.pool)
    flags = fp8_flags(px.res, role, px.res.device_of(use.pool))
    return px.estimate(role, pool, replace(use.parallel(), **flags))


def predict_row(row: Row, calib: Calibration, folder: Path = EXAMPLES) -> Result:
    """Price the row's job with its published layout (see the module docstring)."""
    px = Pricer(resolve(load_job(folder / row.file), row.file), calib)
    slot = {r: "+".join(g) for g in row.groups for r in g}
    ests = {r: _place(px, r, use) for r, use in row.layout.items()}
    if not row.trainer_log_probs:  # old log-probs come from the engine (see `Row`)
        actor = ests[Role.ACTOR]
        ests[Role.ACTOR] = replace(actor, stage_s={k: v for k, v in actor.stage_s.items()
                                                 if k != "score"})
    bd = px.iteration_time([Placed(slot[r], e) for r, e in ests.items()])
    predicted = {
        "rollout": ests[Role.ROLLOUT].stage_s.get("rollout", 0.0),
        "old_log_prob": ests[Role.ACTOR].stage_s.get("score", 0.0),
        "ref": ests[Role.REFERENCE].stage_s.get("score", 0.0) if Role.REFERENCE in ests else 0.0,
        "update": ests[Role.ACTOR].stage_s.get("train", 0.0),
        "sync": bd.sync_s,
    }
    stages = {k: Versus(row.stages[k], predicted[k]) for k in STAGE_KEYS if k in row.stages}
    bad = [f"{e.role}: {e.reason}" for e in ests.values() if not e.feasible]
    return Result(row.name, row.published_s, bd.iteration_s, stages, not bad, "; ".join(bad),
                  row.first_step)


def predict_sync(row: SyncRow, calib: Calibration) -> Comparison:
    """One actor -> rollout weight refresh on the row's hardware."""
    job = job_from_dict({
        "name": "sync", "algorithm": "grpo", "models": {"policy": row.model},
        "batch": {"prompts": 1, "samples_per_prompt": 2}, "lengths": {"prompt": {"kind": "fixed", "value": 1},
                                             "response": {"kind": "fixed", "value": 1}},
        "cluster": {"pools": [{"name": "g", "device": row.device,
                               "devices_per_node": row.devices_per_node, "nodes": row.nodes}]},
        "weight_sync": {"transport": row.transport, "shard_experts": row.shard_experts},
        "framework": row.framework,
        **({"catalog": {"devices": [row.device_type]}} if row.device_type else {})}, row.name)
    res = resolve(job, row.name)
    a = Placed("a+r" if row.colocated else "a",
               Estimate(Role.ACTOR, "g", row.actor.parallel(), Memory(), {}))
    r = Placed("a+r" if row.colocated else "r",
               Estimate(Role.ROLLOUT, "g", row.rollout.parallel(), Memory(), {}))
    bucket = {"sync_bucket_gb": row.bucket_gb}
    calib = Calibration(calib.default.override(bucket),
                        {k: e.override(bucket) for k, e in calib.per_device.items()})
    return Comparison(row.name, row.published_s, Pricer(res, calib).sync_time(a, r))


def predict_decode(row: DecodeRow, calib: Calibration) -> Comparison:
    """One decode step of the anchor's batch (the engine's per-step time)."""
    devs, models = shipped_devices(), shipped_models()
    dev, m = devs[row.device], row.arch or models[row.model]
    eff = calib.for_device(dev)
    t = decode_step_time(m, dev, Parallel(tp=row.tp), row.batch, row.batch * row.context, eff)
    return Comparison(row.name, row.published_s, t)


def fidelity(calib: Calibration | None = None, folder: Path = EXAMPLES) -> PublishedReport:
    """The whole comparison (its `to_dict()`: the `--json` document)."""
    calib = calib or Calibration()
    return PublishedReport([predict_row(r, calib, folder) for r in ROWS if not r.first_step],
                           [predict_sync(r, calib) for r in SYNC_ROWS],
                           [predict_decode(r, calib) for r in DECODE_ROWS],
                           [_serving(r, calib) for r in SERVING_ROWS],
                           [predict_row(r, calib, folder) for r in ROWS if r.first_step])


def _serving(row: ServingRow, calib: Calibration) -> Comparison:
    """A serving anchor's engine step (`workflows.serving`), published beside predicted."""
    p = predict_serving(row, calib)
    return Comparison(row.name, p.published_s, p.predicted_s)


def published_rows(step: list[Row] = ROWS, folder: Path = EXAMPLES) -> Rows:
    """Every row of every kind, as the leave-one-out fit takes them (`workflows.loo`)."""
    res = {r.name: resolve(load_job(folder / r.file), r.file) for r in step}
    return Rows(tuple(step), tuple(SYNC_ROWS), tuple(DECODE_ROWS), tuple(SERVING_ROWS), res,
                Pricing(lambda r, c: predict_row(r, c, folder), predict_sync, predict_decode,
                        _serving))


def _pct(x: float) -> str:
    return f"{x * 100:+.0f}%" if math.isfinite(x) else "n/a"


def _render_step(r: Result) -> str:
    st = ", ".join(f"{k} {v.published_s:.0f}/{v.predicted_s:.0f} {_pct(v.error)}"
                   for k, v in r.stages.items())
    flag = "" if r.fits else f"  [does not fit: {r.note}]"
    return (f"{r.name:44s} {r.published_s:9.1f} {r.predicted_s:9.1f} "
            f"{_pct(r.error):>6s}   {st}{flag}")


def render(doc: PublishedReport) -> str:
    lines = [f"{'row':44s} {'published':>9s} {'predicted':>9s} {'error':>6s}   stages "
             "(published/predicted s, error)"]
    lines += [_render_step(r) for r in doc.rows]
    lines.append(f"median |error| {doc.median_abs_error * 100:.1f}% over {len(doc.rows)} "
                 f"rows, max {doc.max_abs_error * 100:.1f}%")
    if doc.first_step:
        lines += ["", "first-step rows (one-time costs included; not in the median above):"]
        lines += [f"{_render_step(r)}\n  why: {r.first_step}" for r in doc.first_step]
    lines.append("")
    lines.append(f"{'weight sync':44s} {'published':>9s} {'predicted':>9s} {'error':>6s}")
    for s in doc.sync:
        lines.append(f"{s.name:44s} {s.published_s:9.2f} {s.predicted_s:9.2f} "
                     f"{_pct(s.error):>6s}")
    lines.append(f"median |error| {doc.sync_median_abs_error * 100:.1f}% over "
                 f"{len(doc.sync)} sync rows")
    lines.append("")
    lines.append(f"{'decode step (ms)':44s} {'published':>9s} {'predicted':>9s} {'error':>6s}")
    for d in doc.decode:
        lines.append(f"{d.name:44s} {d.published_s * 1e3:9.2f} "
                     f"{d.predicted_s * 1e3:9.2f} {_pct(d.error):>6s}")
    if doc.serving:
        lines += ["", *render_serving([(s.name, s.published_s, s.predicted_s)
                                       for s in doc.serving])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workflows.published",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    ap.add_argument("--calibration", default=None, help="calibration profile (YAML or JSON)")
    ap.add_argument("--loo", action="store_true",
                    help="fit the factors the rows determine and predict every row in-sample "
                         "and leave-one-out (workflows.loo)")
    ap.add_argument("--write-band", action="store_true",
                    help="with --loo: write the leave-one-out residuals the planner's error "
                         "band is taken from (placer/cost/data/band.json) and each row "
                         "factor's range over the leave-one-out fits "
                         "(placer/cost/data/factor_ranges.json)")
    args = ap.parse_args(argv)
    if args.write_band and not args.loo:
        print("error: --write-band: needs --loo", file=sys.stderr)
        return 2
    if args.loo and args.calibration:
        print("error: --calibration: --loo fits from the shipped factors", file=sys.stderr)
        return 2
    try:
        doc = fidelity(load_calibration(args.calibration))
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not args.loo:
        print(doc.to_json() if args.json else render(doc))
        return 0
    rep = loo_report(published_rows())
    if args.write_band:
        rep.table.write()
        rep.ranges.write()
    print(json.dumps(rep.extend(doc.to_dict()), indent=2) if args.json else render_loo(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
