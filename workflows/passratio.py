"""Forward-only passes against their own run's update: the `mfu_score` each published run implies.

A step row's stage times all scale with the tokens its run trained, which no run publishes (each
job file assumes a response distribution). The ratio of a forward-only pass (old_log_prob, ref)
to the same run's update does not, to first order: both are passes of the same module over the
same tokens (verl runs `compute_log_prob` / `compute_ref_log_prob` on the training module's own
forward, docs/cost-model.md "Scoring"). So, with `mfu_train` held at its default, the
`mfu_score` at which the priced pass / priced update equals the published one is a datum of the
forward-only ceiling that the length assumption hardly moves; the rows' median is the evidence
for `Efficiency.mfu_score`'s default (in-sample: it is read off the published rows).

The priced ratio falls as `mfu_score` rises (only the pass's compute moves), so each row's value
is found by bisection in log space on [`LO`, `HI`]; a value at a bound means the row's ratio is
out of the model's reach there (its update or its fixed costs are priced off).

    python -m workflows.passratio [--json]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import asdict, dataclass

from placer.cost.efficiency import Efficiency
from workflows.loo import AnyRow, Rows, stage_times
from workflows.published import published_rows

PASSES = ("old_log_prob", "ref")
LO, HI = 0.2, 3.0
STEPS = 24  # the bracket shrinks to (HI / LO) ** (2 ** -24) ~ 1 + 1.6e-7 of its log width


@dataclass(frozen=True)
class PassRatio:
    """One forward-only stage of one row: its published and priced ratio to the update."""

    row: str
    stage: str
    published: float  # published pass / published update
    priced: float  # the same at the default factors
    implied_mfu_score: float  # the mfu_score at which the priced ratio is the published one


def _ratio(rows: Rows, row: AnyRow, stage: str, eff: Efficiency) -> float:
    got = stage_times(rows, row, eff, [stage, "update"])
    return got[stage] / got["update"]


def implied(rows: Rows, row: AnyRow, stage: str, target: float,
            base: Efficiency | None = None) -> float:
    """The mfu_score at which `row`'s priced `stage` / update equals `target` (bisection)."""
    eff = base or Efficiency()
    lo, hi = math.log(LO), math.log(HI)
    for _ in range(STEPS):
        mid = (lo + hi) / 2
        if _ratio(rows, row, stage, eff.override({"mfu_score": math.exp(mid)})) > target:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)


def pass_ratios(rows: Rows | None = None, names: tuple[str, ...] = ()) -> list[PassRatio]:
    """Every steady-state step row that publishes a forward-only stage and its update (only
    those whose names start with one of `names`, where given) whose pass the trainer runs."""
    rows = rows or published_rows()
    out = []
    for r in rows.step:
        if r.first_step or "update" not in r.stages:
            continue
        if names and not any(r.name.startswith(n) for n in names):
            continue
        for k in PASSES:
            if k not in r.stages or k not in stage_times(rows, r, Efficiency(), [k]):
                continue
            target = r.stages[k] / r.stages["update"]
            out.append(PassRatio(r.name, k, target, _ratio(rows, r, k, Efficiency()),
                                 implied(rows, r, k, target)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workflows.passratio",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    args = ap.parse_args(argv)
    got = pass_ratios()
    median = statistics.median(p.implied_mfu_score for p in got)
    if args.json:
        print(json.dumps({"passes": [asdict(p) for p in got], "median": median}, indent=2))
        return 0
    print(f"{'row':44} {'stage':13} published  priced  implied mfu_score")
    for p in got:
        print(f"{p.row:44} {p.stage:13} {p.published:9.3f} {p.priced:7.3f} {p.implied_mfu_score:8.2f}")
    print(f"median implied mfu_score {median:.2f} over {len(got)} passes "
          f"(default {Efficiency().mfu_score}, mfu_train {Efficiency().mfu_train}; in-sample)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
