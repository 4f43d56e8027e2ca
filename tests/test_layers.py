"""Imports point one way, bottom up (DESIGN.md, "Layout"); this test is where the map lives.

Layers, lowest first. A module may import its own layer and the layers below it, never above;
siblings named on one line must not import each other.

  0 foundation  placer.errors, placer.roles, placer.fileio, placer.inputs, placer.progress (error
                types, the Role enum, atomic writes, guarded reading of input files, progress
                bars) and the trace schema with its readers and recorder: traces (package),
                traces.schema, traces.workload, traces.record. They import nothing else of the
                project, so every layer can raise the errors, read its inputs, show progress
                and read or write traces.
  1 library     the `placer` library: every placer.* module not named in another layer (specs,
                layout pins (placer.pins, under placer.spec: the job model holds them),
                catalogs, cost model, candidates, ILP, plan, pricing, moves, render, plots of
                plans, interop with verl/OpenRLHF/KubeRay), and traces.synthetic (traces made
                from the cost model).
  2 engines     simulator.* | executors.*  (siblings: neither imports the other)
  3 workflows   workflows.*  (what crosses planner, simulator and executor; its own figures)
  4 front ends  placer.cli, placer.__main__, placer.commands.*, placer.api and the package root
                placer (its __init__: the version and the Python API, loaded lazily from
                placer.api) | bench.*  (siblings)

Every import counts: module level, inside functions and under `if TYPE_CHECKING:`. A module of the
project that the map does not place is an error too, so a new package gets a layer on purpose.
Notebooks are front ends that call the library or the Python API (placer, placer.api), not the
command modules.
"""
from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("placer", "simulator", "executors", "traces", "workflows", "bench")
FOUNDATION = {"placer.errors", "placer.roles", "placer.fileio", "placer.inputs", "placer.progress",
              "traces", "traces.schema", "traces.workload", "traces.record"}
FRONT_ENDS = ("placer.cli", "placer.__main__", "placer.commands", "placer.api")
PYTHON_API = ("placer", "placer.api")  # what notebooks may import from the front-end layer


@dataclass(frozen=True)
class Layer:
    rank: int
    name: str  # siblings share a rank and differ in name


def layer_of(module: str) -> Layer | None:
    """The layer of a project module (None: not a module of the project's packages)."""
    top = module.split(".")[0]
    if top not in PACKAGES:
        return None
    if module in FOUNDATION:
        return Layer(0, "foundation")
    if module == "placer" or any(module == f or module.startswith(f + ".") for f in FRONT_ENDS):
        return Layer(4, "cli")
    if top in ("placer", "traces"):  # traces.synthetic: made from the cost model
        return Layer(1, "library")
    if top in ("simulator", "executors"):
        return Layer(2, top)
    if top == "workflows":
        return Layer(3, "workflows")
    return Layer(4, "bench")


def imported(module: str, source: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, module) of every import in `source`, relative ones resolved against `module`."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from pkg import mod` imports pkg.mod when mod is a module: count the deeper name
            out += [(node.lineno, f"{target}.{a.name}") for a in node.names
                    if a.name != "*" and layer_of(f"{target}.{a.name}") is not None
                    and _is_module(f"{target}.{a.name}")] or [(node.lineno, target)]
    return out


_MODULES: set[str] = set()  # every module of the tree, filled by `project_modules`


def _is_module(name: str) -> bool:
    return name in _MODULES


def _allowed(src: Layer, dst: Layer) -> bool:
    if dst.rank < src.rank:
        return True
    return dst.rank == src.rank and dst.name == src.name


def violations(modules: dict[str, tuple[str, bool]]) -> list[str]:
    """Every upward or sideways import in `modules` (name -> (source, is a package)), and every
    module the map does not place; one line each, naming module, line and target."""
    _MODULES.clear()
    _MODULES.update(modules)
    out = []
    for mod, (source, is_pkg) in sorted(modules.items()):
        src = layer_of(mod)
        if src is None:
            out.append(f"{mod}: not placed in any layer")
            continue
        for line, target in imported(mod, source, is_pkg):
            dst = layer_of(target)
            if dst is not None and not _allowed(src, dst):
                out.append(f"{mod}:{line} imports {target} ({src.name} {src.rank} -> "
                           f"{dst.name} {dst.rank})")
    return out


def project_modules(root: Path = ROOT) -> dict[str, tuple[str, bool]]:
    mods = {}
    for pkg in PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_pkg else parts)
            mods[name] = (f.read_text(), is_pkg)
    return mods


def notebook_sources(root: Path = ROOT) -> dict[str, str]:
    out = {}
    for nb in sorted((root / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        out[nb.name] = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    return out


# --------------------------------------------------------------------------- the project itself
def test_the_project_imports_only_downwards() -> None:
    bad = violations(project_modules())
    assert not bad, "imports against the layer map (tests/test_layers.py):\n" + "\n".join(bad)


def test_the_map_places_the_modules_it_names() -> None:
    mods = project_modules()
    for name in FOUNDATION:
        assert name in mods, f"{name} is in the foundation layer but does not exist"
    assert layer_of("traces.synthetic") == Layer(1, "library")
    assert layer_of("placer.commands.plan") == layer_of("placer.cli") == Layer(4, "cli")
    assert layer_of("placer") == layer_of("placer.api") == Layer(4, "cli")
    assert layer_of("placer.interop.verl") == Layer(1, "library")
    assert layer_of("placer.pins") == Layer(1, "library")
    assert layer_of("placer.progress") == Layer(0, "foundation")


def test_importing_the_package_loads_no_engine() -> None:
    """`import placer` (which every `placer.x` import runs first) and the API's names stay lazy:
    no solver, simulator, executor or Ray until a call needs them."""
    import subprocess
    import sys
    code = ("import sys, placer; placer.__version__; placer.compare; "
            "heavy = [m for m in sys.modules if m.split('.')[0] in "
            "('simulator', 'executors', 'workflows', 'ray', 'torch', 'ortools')]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("name", sorted(notebook_sources()))
def test_notebooks_call_the_library_not_the_commands(name: str) -> None:
    _MODULES.clear()
    _MODULES.update(project_modules())
    targets = [t for _, t in imported("notebook", notebook_sources()[name])]
    bad = [t for t in targets if layer_of(t) == Layer(4, "cli") and t not in PYTHON_API]
    assert not bad, f"{name} imports command modules: {bad}"


# ------------------------------------------------------------------------ the test, tested
def _tree(**sources: str) -> dict[str, tuple[str, bool]]:
    return {name.replace("__", "."): (src, False) for name, src in sources.items()}


def test_a_planted_upward_import_fails() -> None:
    mods = _tree(placer__errors="", placer__planfile="from placer.errors import SpecError\n",
                 simulator__api="from placer.planfile import Plan\n",
                 traces__schema="from placer.planfile import Plan\n")  # foundation -> library
    assert violations(mods) == [
        "traces.schema:1 imports placer.planfile (foundation 0 -> library 1)"]


def test_a_function_level_and_relative_import_count() -> None:
    mods = _tree(placer__planfile="def f():\n    from workflows.fidelity import Report\n",
                 workflows__fidelity="", placer__spec="",
                 placer__cost="from .spec import Job\n", placer__commands__plan="",
                 placer__render="from . import commands\nfrom .commands import plan\n")
    mods["placer.commands"] = ("", True)
    assert violations(mods) == [
        "placer.planfile:2 imports workflows.fidelity (library 1 -> workflows 3)",
        "placer.render:1 imports placer.commands (library 1 -> cli 4)",
        "placer.render:2 imports placer.commands.plan (library 1 -> cli 4)"]


def test_siblings_do_not_import_each_other() -> None:
    mods = _tree(simulator__api="import executors.run\n", executors__run="",
                 bench__b="from placer.cli import main\n", placer__cli="",
                 workflows__demo="import bench.b\n")
    assert violations(mods) == [
        "bench.b:1 imports placer.cli (bench 4 -> cli 4)",
        "simulator.api:1 imports executors.run (simulator 2 -> executors 2)",
        "workflows.demo:1 imports bench.b (workflows 3 -> bench 4)"]


def test_type_checking_imports_count_and_outside_names_do_not() -> None:
    mods = _tree(executors__roles="from typing import TYPE_CHECKING\nimport numpy\n"
                                  "if TYPE_CHECKING:\n    from workflows import demo\n",
                 workflows__demo="")
    assert violations(mods) == [
        "executors.roles:4 imports workflows.demo (executors 2 -> workflows 3)"]
