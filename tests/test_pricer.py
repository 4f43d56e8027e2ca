"""The pricing context: one problem's prices live in its own `Pricer`, never in module state.

Two problems priced through two pricers, interleaved call by call, get exactly the numbers each
gets alone; a problem priced again after another gets its first numbers; and no library module
holds a mutable table at module level that a memo could hide in.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from placer.cost.efficiency import Calibration, Efficiency
from placer.cost.pricer import Pricer
from placer.cost.roleestimate import Estimate
from placer.cost.timing import Placed
from placer.solve.layouts import layouts
from placer.spec.catalog import Resolved, resolve
from placer.spec.load import load_job

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def _pairs(px: Pricer, role: str, limit: int = 6) -> list[tuple[str, object]]:
    """A few (pool, layout) pairs the role's cost table prices."""
    out = []
    for pool in px.res.cluster.pools:
        out += [(pool.name, par) for par in layouts(px, role, pool)[:limit]]
    return out


def _price(px: Pricer, role: str, pool: str, par: object) -> tuple[float, ...]:
    est: Estimate = px.estimate(role, px.res.cluster.pool(pool), par)  # type: ignore[arg-type]
    return (*sorted(est.stage_s.items()), est.memory.total, est.feasible, est.concurrency)


def _with_lengths(res: Resolved, median: float) -> Resolved:
    """The same job and objects with another response distribution: the engines' step terms
    (model, device, layout, factors) are equal, the replays on them are not."""
    lengths = res.job.lengths.model_copy(update={"response": res.job.lengths.response.model_copy(
        update={"median": median})})
    return resolve(res.job.model_copy(update={"lengths": lengths}))


@pytest.mark.parametrize("example", ["hetero-split.yaml", "agentic-code.yaml"])
def test_two_problems_interleaved_price_as_each_alone(example: str) -> None:
    a = resolve(load_job(EXAMPLES / example))
    b = _with_lengths(a, a.job.lengths.response.median * 1.7)  # type: ignore[operator]
    calib = Calibration()
    work = {"a": [("rollout", *p) for p in _pairs(Pricer(a, calib), "rollout")],
            "b": [("rollout", *p) for p in _pairs(Pricer(b, calib), "rollout")]}
    alone = {k: [_price(Pricer(res, calib), *w) for w in work[k]] for k, res in (("a", a),
                                                                               ("b", b))}
    pa, pb = Pricer(a, calib), Pricer(b, calib)
    mixed: dict[str, list[tuple[float, ...]]] = {"a": [], "b": []}
    for wa, wb in zip(work["a"], work["b"]):
        mixed["a"].append(_price(pa, *wa))
        mixed["b"].append(_price(pb, *wb))
    assert mixed == alone
    assert alone["a"] != alone["b"]  # the two problems really differ


def test_a_problem_priced_after_another_gets_its_first_numbers() -> None:
    """One pricer shared by two jobs of the same models (`with_res`) keeps one table of step
    terms, and the replays on it are kept by their inputs: pricing B between two pricings of A
    leaves A's numbers exactly as they were, and B's as B alone gets them."""
    a = resolve(load_job(EXAMPLES / "agentic-code.yaml"))
    b = _with_lengths(a, a.job.lengths.response.median * 0.6)  # type: ignore[operator]
    pa = Pricer(a, Calibration())
    pb = pa.with_res(b)
    work = [("rollout", *p) for p in _pairs(pa, "rollout")]
    first = [_price(pa, *w) for w in work]
    of_b = [_price(pb, *w) for w in work]
    assert [_price(pa, *w) for w in work] == first
    assert of_b == [_price(Pricer(b, Calibration()), *w) for w in work]
    assert of_b != first


def test_the_pricer_keeps_one_step_table_per_layout_by_value() -> None:
    res = resolve(load_job(EXAMPLES / "grpo-qwen7b-h100.yaml"))
    px = Pricer(res, Calibration())
    m, dev = res.arch_of("rollout"), res.device_of(res.cluster.pools[0])
    par = layouts(px, "rollout", res.cluster.pools[0])[0]
    st = px.step_terms(m, dev, par, px.eff(dev))
    # an equal copy of the factors (another object) finds the same terms
    copy = Efficiency(**{f: getattr(px.eff(dev), f) for f in Efficiency.__dataclass_fields__})
    assert copy is not px.eff(dev)
    assert px.step_terms(m, dev, par, copy) is st
    assert px.with_samples(3).step_terms(m, dev, par, px.eff(dev)) is st
    assert Pricer(res, Calibration()).step_terms(m, dev, par, px.eff(dev)) is not st


def test_iteration_and_sync_time_come_from_the_same_pricer() -> None:
    res = resolve(load_job(EXAMPLES / "tiny-cpu.yaml"))
    px = Pricer(res, Calibration())
    pool = res.cluster.pools[0]
    actor = Placed("s", px.estimate("actor", pool, layouts(px, "actor", pool)[0]))
    rollout = Placed("s", px.estimate("rollout", pool, layouts(px, "rollout", pool)[0]))
    bd = px.iteration_time([actor, rollout])
    assert bd.sync_s == px.sync_time(actor, rollout)
    assert bd.iteration_s >= bd.sync_s + actor.est.time_s + rollout.est.time_s - 1e-12


# ------------------------------------------------------------------- no module-level state
LIBRARY = ("placer", "simulator", "traces", "workflows", "executors")
MUTABLE_CALLS = {"dict", "list", "set", "OrderedDict", "defaultdict", "deque", "Counter"}
MUTATORS = {"append", "add", "clear", "extend", "insert", "pop", "popitem", "remove",
            "setdefault", "update", "move_to_end", "appendleft", "discard"}


def _tables(tree: ast.Module) -> list[str]:
    """Module-level names bound to a mutable container (what a memo table is made of)."""
    out = []
    for node in tree.body:
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        v = node.value
        if isinstance(v, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)) \
                or (isinstance(v, ast.Call) and isinstance(v.func, ast.Name)
                    and v.func.id in MUTABLE_CALLS):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out += [t.id for t in targets if isinstance(t, ast.Name)
                    and not (t.id.startswith("__") and t.id.endswith("__"))]
    return out


def _mutated_in_functions(tree: ast.Module, names: set[str]) -> set[str]:
    """Which of the module-level `names` a function body writes into (`NAME[k] = v`,
    `NAME.update(...)`, `global NAME`): the mark of state kept between calls."""
    hit = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Global):
                hit |= set(node.names) & names
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) \
                    else [node.target]
                hit |= {t.value.id for t in targets if isinstance(t, ast.Subscript)
                        and isinstance(t.value, ast.Name) and t.value.id in names}
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and isinstance(node.func.value, ast.Name) and node.func.value.id in names
                  and node.func.attr in MUTATORS):
                hit.add(node.func.value.id)
    return hit


def test_no_library_function_keeps_state_in_a_module() -> None:
    """A module-level container is a constant table (a registry, a lookup of facts): written
    at import, never by a function. The six memo tables this replaced (`_SHARED`, `_CACHE`,
    `_SPANS`, `_TERMS`, `_COUNTS`, `_VERDICTS`) were each filled by a function."""
    found = {}
    for pkg in LIBRARY:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            tree = ast.parse(f.read_text())
            names = set(_tables(tree))
            bad = _mutated_in_functions(tree, names) | {n for n in names if n.startswith("_")}
            if bad:
                found[str(f.relative_to(ROOT))] = sorted(bad)
    assert not found, f"module-level state (keep it in a Pricer or the object that owns a " \
                      f"run): {found}"


def test_the_state_guard_catches_a_memo() -> None:
    memo = ast.parse("_CACHE = {}\nHOSTS = {'a': 1}\ndef f(k):\n    if k not in _CACHE:\n"
                     "        _CACHE[k] = k * 2\n    return _CACHE[k]\n"
                     "def g():\n    HOSTS.update(b=2)\n")
    assert _mutated_in_functions(memo, set(_tables(memo))) == {"_CACHE", "HOSTS"}
    const = ast.parse("HOSTS = {'a': 1}\ndef f(k):\n    return HOSTS[k]\n")
    assert _mutated_in_functions(const, set(_tables(const))) == set()
