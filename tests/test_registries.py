"""Mechanisms that cross planner, simulator and executor are registries: one class per variant.

Tail policies (`placer.spec.tailpolicy.POLICIES`) and pipeline modes
(`placer.spec.pipeline.MODES`): the job format's names and the registry agree, each variant
answers the questions the three parts ask, and no library code outside the registry compares a
variant's name. Rollout backends and export targets: test_backends_targets.py.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

import pytest

from placer.base.errors import SpecError
from placer.spec.distributions import Distribution
from placer.spec.pipeline import MODES, Async, Pipeline, PipelineKind, PipelineMode
from placer.spec.sections import Environment, Lengths
from placer.spec.tailpolicy import POLICIES, Draws, TailKind, TailPolicy

ROOT = Path(__file__).resolve().parent.parent


def test_the_job_format_names_exactly_the_registered_variants() -> None:
    assert set(get_args(TailKind)) == set(POLICIES)
    assert set(get_args(PipelineKind)) == set(MODES)
    for kind, cls in POLICIES.items():
        assert cls.kind == kind
        policy = TailPolicy.model_validate({"kind": kind, **({cls.param: 1} if cls.param else {})})
        assert type(policy.mechanism) is cls


def test_overprovision_counts_whole_samples_whatever_the_float_product() -> None:
    """10 x 1.1 is 11.000000000000002 in floats: 11 samples, as the executor generates them
    (the cost model's own ceil used to say 12)."""
    over = TailPolicy(kind="overprovision", fraction=0.1).mechanism
    assert over.generated(10) == 11
    assert over.generated(16) == 18  # 17.6 -> 18
    assert over.keeps_first
    assert TailPolicy().mechanism.generated(10) == 10
    assert not TailPolicy().mechanism.keeps_first


def test_partial_cuts_and_carries_and_the_others_do_not() -> None:
    part = TailPolicy(kind="partial", token_budget=300).mechanism
    assert part.token_budget == 300 and part.carries_over
    assert part.carry_steps(900) == 2  # done within ceil(900 / 300) = 3 steps: 2 beyond its own
    assert part.carry_steps(300) == 0
    for kind, param in (("none", None), ("overprovision", 0.2), ("reissue", 2.0)):
        mech = TailPolicy.model_validate(
            {"kind": kind, **({POLICIES[kind].param: param} if param else {})}).mechanism
        assert mech.token_budget is None and not mech.carries_over and mech.carry_steps(900) == 0


def _env(turns: int, latency_s: float) -> Environment:
    return Environment(kind="tool" if turns > 1 else "none", turns=turns,
                       tool_latency_s=Distribution(kind="fixed", value=latency_s))


LENGTHS = Lengths(prompt=Distribution(kind="fixed", value=100),
                  response=Distribution(kind="fixed", value=250.4))


@pytest.mark.parametrize(("policy", "env", "problem"), [
    (TailPolicy(kind="partial", token_budget=400), _env(2, 1.0), "token_budget"),  # 2 x 251
    (TailPolicy(kind="reissue", deadline_s=5.0), _env(1, 1.0), "reissue needs tool calls"),
    (TailPolicy(kind="reissue", deadline_s=0.5), _env(3, 1.0), "deadline_s"),
])
def test_settings_that_cut_the_typical_sample_are_refused(policy: TailPolicy, env: Environment,
                                                          problem: str) -> None:
    with pytest.raises(SpecError, match=problem):
        policy.mechanism.check(LENGTHS, env, "job")


def test_settings_above_the_mean_pass_the_check() -> None:
    TailPolicy(kind="partial", token_budget=502).mechanism.check(LENGTHS, _env(2, 1.0), "job")
    TailPolicy(kind="reissue", deadline_s=1.0).mechanism.check(LENGTHS, _env(3, 1.0), "job")


def test_defaults_for_a_comparison_come_from_the_draws() -> None:
    draws = Draws(response_totals=[float(x) for x in range(1, 101)],
                  tool_latencies_s=[float(x) / 10 for x in range(1, 101)],
                  response_floor=40, mean_tool_s=5.05, has_tools=True)
    options = {k: c.option(draws) for k, c in POLICIES.items()}
    assert options["none"] == TailPolicy()
    assert options["partial"] == TailPolicy(kind="partial", token_budget=90)  # 90th percentile
    reissue = options["reissue"]
    assert reissue is not None and reissue.deadline_s == pytest.approx(9.505)  # 95th
    no_tools = Draws(**{**draws.__dict__, "has_tools": False})
    assert POLICIES["reissue"].option(no_tools) is None


def test_pipeline_modes_combine_stage_times_as_the_planner_prices_them() -> None:
    sync, asyn = Pipeline().mechanism, Pipeline(mode="async", max_staleness=2).mechanism
    assert type(sync) is PipelineMode and type(asyn) is Async
    assert (sync.overlaps_steps, sync.staleness) == (False, 0)
    assert (asyn.overlaps_steps, asyn.staleness) == (True, 2)
    assert sync.iteration_s(chain_s=9.0, busiest_s=5.0) == 9.0
    assert asyn.iteration_s(chain_s=9.0, busiest_s=5.0) == 5.0  # the busiest slot binds
    assert asyn.iteration_s(chain_s=30.0, busiest_s=5.0) == 10.0  # the chain over s + 1 binds
    with pytest.raises(ValueError, match="max_staleness >= 1"):
        Pipeline(mode="async", max_staleness=0)


# --------------------------------------------------------- names compared only in registries
REGISTRIES = {"placer/spec/tailpolicy.py", "placer/spec/pipeline.py"}
# "none" is left out: the environment's kind has a "none" of its own, which code compares freely
NAMES = (set(get_args(TailKind)) | set(get_args(PipelineKind))) - {"none"}
LIBRARY = ("placer", "simulator", "executors", "traces", "workflows")


def _name_comparisons(tree: ast.AST) -> list[tuple[int, str]]:
    """`x.kind == "partial"`, `mode != "async"`, `"sync" in ...`: a variant's name compared."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        parts = [node.left, *node.comparators]
        consts = [p.value for p in parts if isinstance(p, ast.Constant) and p.value in NAMES]
        named = [p for p in parts if isinstance(p, ast.Attribute) and p.attr in ("kind", "mode")
                 or isinstance(p, ast.Name) and p.id in ("kind", "mode", "policy")]
        if consts and named:
            out.append((node.lineno, consts[0]))
    return out


def test_no_library_code_compares_a_variants_name_outside_its_registry() -> None:
    found = []
    for pkg in LIBRARY:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            rel = str(f.relative_to(ROOT))
            if rel in REGISTRIES:
                continue
            found += [f"{rel}:{line} compares {name!r}"
                      for line, name in _name_comparisons(ast.parse(f.read_text()))]
    assert not found, "ask the variant's mechanism instead:\n" + "\n".join(found)


def test_the_name_scan_catches_a_comparison() -> None:
    tree = ast.parse("if job.tail_policy.kind == 'partial':\n    pass\nok = plan.mode != 'async'\n"
                     "fine = env.kind == 'none'\n")
    assert _name_comparisons(tree) == [(1, "partial"), (3, "async")]
