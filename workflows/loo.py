"""Leave-one-out fidelity of the published runs: which efficiency factors the published rows
determine, a deterministic fit of those factors on the rows, and every row predicted by a fit
that never saw it.

docs/cost-model.md marks several defaults as set on the rows of `workflows.published`
(in-sample), so the plain comparison is no independent check. Here the factors those rows set
are written down as data (`ROW_FACTORS`: factor -> the row kinds and published stages that
determine it, with bounds) and fitted by coordinate descent (`SWEEPS` sweeps over the factors,
each a golden-section search of `GOLDEN_STEPS` steps on a log scale between its bounds); the
objective of a factor is the mean |log(predicted / published)| over the data that determine it.

- in-sample: every row predicted with the factors fitted on all rows;
- leave-one-out (LOO): every row predicted with the factors fitted on all rows but it.

Factors fall apart into groups that share no data (`GROUPS`: the trainers' passes, the weight
sync, the decode step); a held-out row refits only the groups whose data hold it, and the others
keep the all-rows fit, which is what refitting them would give.

Not fitted here:
- operator-level factors (`OPERATOR_LEVEL`: the prefill GEMM ceiling, the TP all-reduce's
  alpha-beta, the decode bandwidth curve): they are fitted on operator profiles, not on RL steps;
- settings (`SETTINGS`): a factor only one row supports is a property of that framework or part,
  carried by its row or its framework's profile (e.g. Miles' sender rate, `placer.spec.framework`),
  not evidence for a default.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from placer.base.roles import Role
from placer.cost.band import Residual, ResidualTable, Tags, mode_of, model_class
from placer.cost.efficiency import Calibration, Efficiency
from placer.cost.factor_ranges import FactorRanges
from placer.cost.pricer import Pricer
from placer.cost.roleestimate import Estimate
from placer.cost.roofline import Memory
from placer.cost.timing import Placed
from placer.spec.catalog import Resolved

# A row of workflows.published (its Row, SyncRow or DecodeRow: this module is handed them, so
# that module can offer --loo without an import cycle).
AnyRow = Any


@dataclass(frozen=True)
class Pricing:
    """How each kind of row is priced: workflows.published's predict_row, predict_sync,
    predict_decode and its serving anchors' (each returns a result with `predicted_s`)."""

    step: Callable[[AnyRow, Calibration], Any]
    sync: Callable[[AnyRow, Calibration], Any]
    decode: Callable[[AnyRow, Calibration], Any]
    serving: Callable[[AnyRow, Calibration], Any]


# Every kind of row, in the report's order. No factor is fitted on the serving anchors
# (multi-node engine steps), so their in-sample and leave-one-out predictions are out-of-sample.
# "first_step": step rows whose published times are their run's first step, one-time costs
# included (`Row.first_step`, the evidence): another quantity than the model's steady-state
# step, so outside the headline (`HEADLINE_KINDS`) and the band; their stages after the first
# calls (`Row.first_call_stages`) are data as any step row's are.
KINDS: tuple[str, ...] = ("step", "sync", "decode", "serving", "first_step")
HEADLINE_KINDS: tuple[str, ...] = KINDS[:4]


SWEEPS = 3
GOLDEN_STEPS = 20  # the bracket shrinks by 0.618^20 ~ 6.6e-5 of its log width
_PHI = (math.sqrt(5) - 1) / 2


@dataclass(frozen=True)
class RowFactor:
    """A factor the published rows determine: the kinds of row whose data fit it ("step":
    the `stages` a step row publishes; "sync": the weight-sync rows; "decode": the decode
    anchors), its group (factors of one group share data) and its search bounds."""

    name: str
    group: str
    kinds: tuple[str, ...]
    stages: tuple[str, ...]
    lo: float
    hi: float
    why: str


ROW_FACTORS: tuple[RowFactor, ...] = (
    RowFactor("mfu_train", "trainer", ("step",), ("update",), 0.2, 1.0,
              "the update stages (verl FSDP2 / Megatron on H20; Miles' r10 update is a first "
              "call, not fitted)"),
    RowFactor("mfu_score", "trainer", ("step",), ("old_log_prob", "ref"), 0.2, 1.0,
              "the log-prob and reference forward passes"),
    RowFactor("dispatch_gbs", "trainer", ("step",), ("old_log_prob", "ref", "update"), 0.05, 5.0,
              "the fixed part of every pass the driver dispatches"),
    RowFactor("sync_load_entry_s", "sync", ("sync",), (), 1e-8, 1e-4,
              "verl's unbucketed NCCL rows (the engine's loader walk once per tensor)"),
    RowFactor("sync_sender_gbs", "sync", ("sync",), (), 1.0, 100.0,
              "the bucketed sync rows without a sender rate of their own (verl's "
              "checkpoint-engine rows, H100 and GH200, NeMo-RL's NCCL pairs; Miles' rows "
              "carry theirs; nccl-reshard streams run at the NIC)"),
    RowFactor("sync_local_gbs", "sync", ("sync", "step"), ("sync",), 3.0, 300.0,
              "colocated refreshes: row r10's sync stage (Miles, SGLang; the one colocated "
              "datum, so a setting of that framework, not a default)"),
    RowFactor("sync_export_gbs", "sync", ("sync",), (), 20.0, 2000.0,
              "the paired refits (NeMo-RL's DeepSeek-V3 NIXL and NCCL rows) and the misc "
              "share of the nccl-reshard rows"),
    RowFactor("reshard_misc_tensor_s", "sync", ("sync",), (), 1e-5, 1e-2,
              "the nccl-reshard rows (NeMo-RL: Qwen3-4B, 30B-A3B in five layouts, DeepSeek-V3): "
              "each misc tensor's export and load"),
    RowFactor("reshard_grouped_call_s", "sync", ("sync",), (), 1e-4, 1e-1,
              "the MoE nccl-reshard rows (30B-A3B in five layouts, DeepSeek-V3): each "
              "grouped-expert xferdtensor call on an engine stream"),
    RowFactor("step_overhead_s", "decode", ("decode",), (), 1e-4, 1e-2,
              "the decode anchors' host time per engine step"),
    RowFactor("engine_ar_base_s", "decode", ("decode",), (), 1e-6, 1e-4,
              "the TP decode anchors' per-call all-reduce (the engines' custom all-reduce)"),
)
GROUPS: tuple[str, ...] = ("trainer", "sync", "decode")
# Fitted on operator profiles (workflows.operators), never on RL steps.
OPERATOR_LEVEL: tuple[str, ...] = ("mfu_prefill", "decode_bw_eff", "decode_tp_bw_loss",
                                   "decode_bw_half_batch", "tp_call_s", "coll_base_s",
                                   "link_eff")
# Factor -> the one row that supports it: a setting of that framework or part, carried by the
# row, not fitted (its row's error is in-sample by construction).
# None now: the fused-MoE read, which one B200 anchor used to set, is priced from the kernel's
# tiling (`placer.cost.kernels.expert_read_eff`) with no factor.
SETTINGS: dict[str, str] = {}


@dataclass(frozen=True)
class Rows:
    """The data a fit may use: step-time rows (each with its resolved job; steady-state and
    first-step alike), sync rows, decode rows, serving anchors, and how each kind is priced."""

    step: tuple[AnyRow, ...]
    sync: tuple[AnyRow, ...]
    decode: tuple[AnyRow, ...]
    serving: tuple[AnyRow, ...]
    resolved: dict[str, Resolved] = field(compare=False, repr=False)
    pricing: Pricing = field(compare=False, repr=False)

    def replaced(self, step: Iterable[AnyRow], sync: Iterable[AnyRow],
                 decode: Iterable[AnyRow], serving: Iterable[AnyRow]) -> Rows:
        return Rows(tuple(step), tuple(sync), tuple(decode), tuple(serving), self.resolved,
                    self.pricing)

    def without(self, name: str) -> Rows:
        """The same data but the row called `name` (whatever its kind)."""
        return self.replaced(*((r for r in rows if r.name != name)
                               for rows in (self.step, self.sync, self.decode, self.serving)))

    def of_kind(self, kind: str) -> tuple[AnyRow, ...]:
        if kind in ("step", "first_step"):
            return tuple(r for r in self.step if bool(r.first_step) == (kind == "first_step"))
        rows: tuple[AnyRow, ...] = {"sync": self.sync, "decode": self.decode,
                                    "serving": self.serving}[kind]
        return rows

    def names(self, kind: str) -> tuple[str, ...]:
        return tuple(r.name for r in self.of_kind(kind))

    def predict(self, kind: str, row: AnyRow, eff: Efficiency) -> float:
        price = {"step": self.pricing.step, "sync": self.pricing.sync,
                 "decode": self.pricing.decode, "serving": self.pricing.serving,
                 "first_step": self.pricing.step}[kind]
        return float(price(row, _calib(eff)).predicted_s)


def _calib(eff: Efficiency) -> Calibration:
    return Calibration(eff)


def stage_times(rows: Rows, row: AnyRow, eff: Efficiency,
                keys: Iterable[str]) -> dict[str, float]:
    """The trainer stages and the sync stage of a step row, priced without its rollout (which
    no row-fitted factor moves): what `predict_row` gives for them."""
    px = Pricer(rows.resolved[row.name], _calib(eff))
    keys = set(keys) & set(row.stages)
    out: dict[str, float] = {}
    actor = px.estimate(Role.ACTOR, px.res.cluster.pool(row.layout[Role.ACTOR].pool),
                        row.layout[Role.ACTOR].parallel())
    if "update" in keys:
        out["update"] = actor.stage_s.get("train", 0.0)
    if "old_log_prob" in keys and row.trainer_log_probs:
        out["old_log_prob"] = actor.stage_s.get("score", 0.0)
    if "ref" in keys and Role.REFERENCE in row.layout:
        use = row.layout[Role.REFERENCE]
        ref = px.estimate(Role.REFERENCE, px.res.cluster.pool(use.pool), use.parallel())
        out["ref"] = ref.stage_s.get("score", 0.0)
    if "sync" in keys:
        slot = {r: "+".join(g) for g in row.groups for r in g}
        use = row.layout[Role.ROLLOUT]
        stub = Estimate(Role.ROLLOUT, use.pool, use.parallel(), Memory(), {})
        out["sync"] = px.sync_time(Placed(slot[Role.ACTOR], actor),
                                   Placed(slot[Role.ROLLOUT], stub))
    return out


def _log_errors(rows: Rows, f: RowFactor, eff: Efficiency) -> list[float]:
    """|log(predicted / published)| of every datum that determines `f`."""
    errs: list[float] = []
    if "step" in f.kinds:
        for r in rows.step:
            got = stage_times(rows, r, eff, _fit_stages(r, f.stages))
            errs += [abs(math.log(v / r.stages[k])) for k, v in got.items() if v > 0]
    if "sync" in f.kinds:
        errs += [abs(math.log(rows.predict("sync", s, eff) / s.published_s)) for s in rows.sync]
    if "decode" in f.kinds:
        errs += [abs(math.log(rows.predict("decode", d, eff) / d.published_s))
                 for d in rows.decode]
    return errs


def _fit_stages(row: AnyRow, stages: Iterable[str]) -> list[str]:
    """The stages of `stages` a step row's data fit: all but its first calls (`Row`)."""
    return [k for k in stages if k not in row.first_call_stages]


def objective(rows: Rows, f: RowFactor, eff: Efficiency) -> float:
    """Mean |log(predicted / published)| over the data that determine `f` (0 when none)."""
    errs = _log_errors(rows, f, eff)
    return statistics.fmean(errs) if errs else 0.0


def golden_min(fn: Callable[[float], float], lo: float, hi: float,
               steps: int = GOLDEN_STEPS) -> float:
    """The minimiser of `fn` on [lo, hi] by golden-section search on log(x), `steps` steps
    (deterministic: a fixed number of evaluations, ties keep the lower bracket)."""
    a, b = math.log(lo), math.log(hi)
    c, d = b - _PHI * (b - a), a + _PHI * (b - a)
    fc, fd = fn(math.exp(c)), fn(math.exp(d))
    for _ in range(steps):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - _PHI * (b - a)
            fc = fn(math.exp(c))
        else:
            a, c, fc = c, d, fd
            d = a + _PHI * (b - a)
            fd = fn(math.exp(d))
    return math.exp((a + b) / 2)


def fit_group(rows: Rows, group: str, start: Efficiency, sweeps: int = SWEEPS) -> Efficiency:
    """The group's factors fitted on `rows` by coordinate descent from `start`. A factor with
    no datum left in `rows`, or none whose prediction it moves, keeps its start value (a flat
    objective would otherwise settle at the search's lower bound)."""
    eff = start
    factors = [f for f in ROW_FACTORS if f.group == group]
    for _ in range(sweeps):
        for f in factors:
            if not _log_errors(rows, f, eff) or not _moves(rows, f, eff):
                continue
            eff = eff.override({f.name: _best(rows, f, eff)})
    return eff


def _moves(rows: Rows, f: RowFactor, eff: Efficiency) -> bool:
    """Whether any datum of `f` in `rows` is priced differently at its two search bounds."""
    return (_log_errors(rows, f, eff.override({f.name: f.lo}))
            != _log_errors(rows, f, eff.override({f.name: f.hi})))


def _best(rows: Rows, f: RowFactor, eff: Efficiency) -> float:
    def at(x: float) -> float:
        return objective(rows, f, eff.override({f.name: x}))
    return golden_min(at, f.lo, f.hi)


def group_data(rows: Rows, group: str) -> frozenset[str]:
    """The names of the rows whose data determine a factor of `group`."""
    names: set[str] = set()
    for f in ROW_FACTORS:
        if f.group != group:
            continue
        for kind in f.kinds:
            names |= ({r.name for r in rows.step if _publishes(r, f.stages)} if kind == "step"
                      else set(rows.names(kind)))
    return frozenset(names)


def _publishes(row: AnyRow, stages: tuple[str, ...]) -> bool:
    return bool(set(_fit_stages(row, stages)) & set(row.stages))


class Fitter:
    """Fits of the row factors on `rows` and on every leave-one-out subset, memoised per
    (group, rows used) so that a held-out row refits only the groups it is data of."""

    def __init__(self, rows: Rows, start: Efficiency | None = None) -> None:
        self.rows = rows
        self.start = start or Efficiency()
        self._fits: dict[tuple[str, frozenset[str]], Efficiency] = {}

    def _group(self, group: str, rows: Rows) -> Efficiency:
        key = (group, group_data(rows, group))
        if key not in self._fits:
            self._fits[key] = fit_group(rows, group, self.start)
        return self._fits[key]

    def fit(self, held_out: str | None = None) -> Efficiency:
        """Every row factor fitted on all rows but `held_out` (None: on all rows)."""
        rows = self.rows if held_out is None else self.rows.without(held_out)
        values = {f.name: getattr(self._group(f.group, rows), f.name) for f in ROW_FACTORS}
        return self.start.override(values)


@dataclass(frozen=True)
class LooRow:
    """One row: published, the shipped defaults' prediction, in-sample and LOO predictions."""

    name: str
    kind: str  # one of KINDS
    published_s: float
    shipped_s: float
    in_sample_s: float
    loo_s: float
    why: str = ""  # a first-step row's evidence (`Row.first_step`)

    @property
    def in_sample_error(self) -> float:
        return self.in_sample_s / self.published_s - 1

    @property
    def loo_error(self) -> float:
        return self.loo_s / self.published_s - 1

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "published_s": self.published_s,
                "shipped_s": self.shipped_s, "shipped_error": self.shipped_s / self.published_s - 1,
                "in_sample_s": self.in_sample_s, "in_sample_error": self.in_sample_error,
                "loo_s": self.loo_s, "loo_error": self.loo_error}


def loo_rows(fitter: Fitter) -> list[LooRow]:
    """Every row of every kind: shipped, in-sample and leave-one-out predictions."""
    rows, shipped, full = fitter.rows, fitter.start, fitter.fit()
    out: list[LooRow] = []
    for kind in KINDS:
        for r in rows.of_kind(kind):
            out.append(LooRow(r.name, kind, r.published_s, rows.predict(kind, r, shipped),
                              rows.predict(kind, r, full),
                              rows.predict(kind, r, fitter.fit(r.name)),
                              getattr(r, "first_step", "")))
    return out


def held_out_prediction(rows: Rows, name: str) -> float:
    """The LOO prediction of the row called `name` alone (a fit that never sees it)."""
    eff = Fitter(rows).fit(name)
    for kind in KINDS:
        for r in rows.of_kind(kind):
            if r.name == name:
                return rows.predict(kind, r, eff)
    raise KeyError(name)


def with_published(rows: Rows, name: str, scale: float) -> Rows:
    """`rows` with the row called `name`'s published times (step and stages) times `scale`."""
    def step(r: AnyRow) -> AnyRow:
        return r if r.name != name else replace(
            r, published_s=r.published_s * scale,
            stages={k: v * scale for k, v in r.stages.items()})

    def other(r: AnyRow) -> AnyRow:
        return r if r.name != name else replace(r, published_s=r.published_s * scale)
    def serving(r: AnyRow) -> AnyRow:  # published as a rate: a longer step is a lower rate
        return r if r.name != name else replace(
            r, published_tok_s_node=r.published_tok_s_node / scale)
    return rows.replaced(map(step, rows.step), map(other, rows.sync), map(other, rows.decode),
                         map(serving, rows.serving))


# ------------------------------------------------------------------ residuals, report
WRITE_BAND = "python -m workflows.published --loo --write-band"


def row_tags(rows: Rows, row: AnyRow) -> Tags:
    """A step row's tags: its actor's device type, its policy's model class, its mode."""
    res = rows.resolved[row.name]
    slot = {r: g for g in row.groups for r in g}
    return Tags(res.device_of(row.layout[Role.ACTOR].pool).name,
                model_class(res.model_of(Role.ACTOR)),
                mode_of(res.job.pipeline.mechanism.overlaps_steps, "+".join(slot[Role.ACTOR]),
                        "+".join(slot[Role.ROLLOUT])))


def residual_table(rows: Rows, loo: Sequence[LooRow]) -> ResidualTable:
    """The steady-state step rows' leave-one-out errors with their tags: what a plan's band is
    taken from (a first-step row's error measures another quantity)."""
    by_name = {r.name: r for r in loo if r.kind == "step"}
    return ResidualTable(tuple(Residual(r.name, by_name[r.name].loo_error, row_tags(rows, r))
                               for r in rows.of_kind("step")), WRITE_BAND)


@dataclass(frozen=True)
class LooReport:
    """Every row's in-sample and leave-one-out predictions, the factors fitted on all rows and
    the residual table they give."""

    rows: list[LooRow]
    fitted: dict[str, float]
    table: ResidualTable
    ranges: FactorRanges

    def kind(self, kind: str) -> list[LooRow]:
        return [r for r in self.rows if r.kind == kind]

    def summary(self, kind: str | None = None) -> dict[str, float]:
        """Median and max |error| of one kind's rows, in-sample and LOO (None: every row of the
        headline kinds, first-step rows not among them)."""
        rs = [r for r in self.rows if r.kind in HEADLINE_KINDS] if kind is None else self.kind(kind)
        return {"loo_median_abs_error": statistics.median(abs(r.loo_error) for r in rs),
                "loo_max_abs_error": max(abs(r.loo_error) for r in rs),
                "in_sample_median_abs_error": statistics.median(
                    abs(r.in_sample_error) for r in rs),
                "in_sample_max_abs_error": max(abs(r.in_sample_error) for r in rs)}

    def extend(self, doc: dict[str, Any]) -> dict[str, Any]:
        """The published-runs document with the LOO fields added (nothing else changes)."""
        out = dict(doc)
        by_name = {r.name: r for r in self.rows}
        for key in ("rows", "sync", "decode", "serving", "first_step"):
            out[key] = [{**d, **_loo_fields(by_name[d["name"]])} for d in doc.get(key, [])]
        out.update(self.summary())  # the headline: every row of the headline kinds
        out["rows_loo"] = sum(len(self.kind(k)) for k in HEADLINE_KINDS)
        for kind in KINDS:
            if self.kind(kind):
                out[f"{kind}_loo"] = self.summary(kind)
        out["loo"] = {"fitted": self.fitted,
                      "factors": {f.name: {"group": f.group, "kinds": list(f.kinds),
                                           "stages": list(f.stages), "bounds": [f.lo, f.hi],
                                           "determined_by": f.why} for f in ROW_FACTORS},
                      "operator_level": list(OPERATOR_LEVEL), "settings": dict(SETTINGS),
                      "sweeps": SWEEPS, "golden_steps": GOLDEN_STEPS}
        return out


def _loo_fields(r: LooRow) -> dict[str, float]:
    return {"in_sample_s": r.in_sample_s, "in_sample_error": r.in_sample_error,
            "loo_s": r.loo_s, "loo_error": r.loo_error}


def loo_report(rows: Rows) -> LooReport:
    """Fit, predict in-sample and leave-one-out, and tabulate the residuals."""
    fitter = Fitter(rows)
    loo = loo_rows(fitter)
    full = fitter.fit()
    return LooReport(loo, {f.name: getattr(full, f.name) for f in ROW_FACTORS},
                     residual_table(rows, loo), factor_ranges(fitter))


def factor_ranges(fitter: Fitter) -> FactorRanges:
    """Each row factor's least and greatest value over the leave-one-out fits (memoised in
    `fitter`: the fits `loo_rows` made)."""
    fits = [fitter.fit(n) for kind in KINDS for n in fitter.rows.names(kind)]
    return FactorRanges({f.name: (min(getattr(e, f.name) for e in fits),
                                  max(getattr(e, f.name) for e in fits)) for f in ROW_FACTORS},
                        WRITE_BAND)
