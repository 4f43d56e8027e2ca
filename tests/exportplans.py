"""The plans every `placer export` test runs on: every example's, and a rollout split over
two slots in sync and async mode (tests/test_export.py, tests/test_export_kuberay.py)."""
from __future__ import annotations

from simplans import example_names, example_plan, small_plan

from placer.solve.planfile import Plan

SPLIT = {"actor": ("h100", 4, "train"), "reference": ("h100", 4, "train"),
         "rollout": ("h100", 4, "gen"), "reward": ("cpu", 1, "verify"),
         "environment": ("cpu", 1, "env")}


def plans() -> list[tuple[str, Plan]]:
    out = [(n, example_plan(n)) for n in example_names()]
    out.append(("split-async", small_plan(SPLIT, pipeline={"mode": "async", "max_staleness": 2})))
    out.append(("split-sync", small_plan(SPLIT)))
    return out


PLANS = dict(plans())
