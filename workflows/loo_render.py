"""The leave-one-out table of `python -m workflows.published --loo` (`workflows.loo`): per kind
of row, published beside the shipped defaults', the in-sample fit's and the leave-one-out
predictions, then the headline over the headline kinds (first-step rows apart, with the
evidence that their times hold one-time costs)."""
from __future__ import annotations

from placer.cost.efficiency import Efficiency
from workflows.loo import HEADLINE_KINDS, KINDS, OPERATOR_LEVEL, ROW_FACTORS, SETTINGS, LooReport


def _pct(x: float) -> str:
    return f"{x * 100:+.0f}%"


def render_loo(rep: LooReport) -> str:
    """The side-by-side table: published, shipped defaults, in-sample fit, leave-one-out."""
    scale = {"step": (1.0, "s"), "sync": (1.0, "s"), "decode": (1e3, "ms"), "serving": (1.0, "s"),
             "first_step": (1.0, "s")}
    lines = ["factors fitted on the rows (shipped -> fitted on all rows):"]
    base = Efficiency()
    lines += [f"  {f.name:16s} {getattr(base, f.name):.4g} -> {rep.fitted[f.name]:.4g}   "
              f"({f.why})" for f in ROW_FACTORS]
    if SETTINGS:
        lines.append("settings carried by their one row (not fitted): " + ", ".join(SETTINGS))
    lines.append("operator-level (not fitted on rows): " + ", ".join(OPERATOR_LEVEL))
    for kind in (k for k in KINDS if rep.kind(k)):
        mul, unit = scale[kind]
        if kind == "first_step":
            lines += ["", "first-step rows: the published times hold one-time costs, not a "
                      "steady-state step; outside the step rows' median and max, the headline "
                      "and the band"]
        lines += ["", f"{kind + ' rows (' + unit + ')':44s} {'published':>9s} {'shipped':>9s} "
                  f"{'in-sample':>9s} {'LOO':>9s}  {'shipped':>7s} {'in-smp':>6s} {'LOO':>6s}"]
        for r in rep.kind(kind):
            lines.append(f"{r.name:44s} {r.published_s * mul:9.2f} {r.shipped_s * mul:9.2f} "
                         f"{r.in_sample_s * mul:9.2f} {r.loo_s * mul:9.2f}  "
                         f"{_pct(r.shipped_s / r.published_s - 1):>7s} "
                         f"{_pct(r.in_sample_error):>6s} {_pct(r.loo_error):>6s}")
            lines += [f"  why: {r.why}"] if r.why else []
        s = rep.summary(kind)
        lines.append(f"median |error| in-sample {s['in_sample_median_abs_error'] * 100:.1f}%, "
                     f"leave-one-out {s['loo_median_abs_error'] * 100:.1f}% (max "
                     f"{s['loo_max_abs_error'] * 100:.1f}%) over {len(rep.kind(kind))} rows")
    s = rep.summary()
    n = sum(len(rep.kind(k)) for k in HEADLINE_KINDS)
    lines += ["", f"every row: median |error| in-sample {s['in_sample_median_abs_error'] * 100:.1f}%, "
              f"leave-one-out {s['loo_median_abs_error'] * 100:.1f}% (max "
              f"{s['loo_max_abs_error'] * 100:.1f}%) over {n} rows "
              f"({', '.join(HEADLINE_KINDS)}; first-step rows apart)"]
    return "\n".join(lines)
