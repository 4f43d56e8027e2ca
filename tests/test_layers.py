"""Imports point one way, bottom up (docs/architecture.md); import-linter enforces it.

The contracts live in pyproject.toml (`[tool.importlinter]`) and `make lint` runs `lint-imports`.
These tests check the contracts themselves: they hold on the tree, they place every module of
the project, and they break on a planted upward import and a planted cycle (so a contract that
silently stopped matching anything would fail here, not pass).
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
PACKAGES = CONFIG["root_packages"]
LINT = [sys.executable, "-c", "from importlinter.cli import lint_imports_command; "
        "lint_imports_command()"]


def layer_modules() -> list[str]:
    """Every module the layers contract names (siblings split out)."""
    layers = next(c for c in CONFIG["contracts"] if c["type"] == "layers")["layers"]
    return [m.strip() for layer in layers for m in layer.replace("|", ":").split(":")]


def project_modules() -> list[str]:
    out = []
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(f.relative_to(ROOT).with_suffix("").parts)
            out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


def test_the_contracts_hold() -> None:
    out = subprocess.run([*LINT, "--no-cache"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout or "broken" not in out.stdout.lower()


def test_every_module_sits_in_a_layer() -> None:
    named = layer_modules()
    unplaced = [m for m in project_modules()
                if m != "placer" and not any(m == n or m.startswith(n + ".") for n in named)]
    assert not unplaced, f"modules in no layer of pyproject.toml's contracts: {unplaced}"


def test_the_placer_package_has_at_most_twelve_modules_at_its_top() -> None:
    top = sorted(p.name for p in (ROOT / "placer").iterdir()
                 if (p.suffix == ".py" and p.name != "__init__.py")
                 or (p.is_dir() and (p / "__init__.py").exists()))
    assert len(top) <= 12, top


def _planted(tmp: Path, files: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A copy of every module name of the project as an empty file, plus `files`, checked by
    the project's own contracts."""
    for mod in project_modules():
        path = tmp.joinpath(*mod.split("."))
        is_pkg = (ROOT.joinpath(*mod.split(".")) / "__init__.py").exists()
        target = path / "__init__.py" if is_pkg else path.with_suffix(".py")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()
    for mod, text in files.items():
        path = tmp.joinpath(*mod.split(".")).with_suffix(".py")
        path.write_text(text)
    (tmp / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    return subprocess.run([*LINT, "--no-cache"], capture_output=True, text=True, cwd=tmp,
                          env={"PYTHONPATH": str(tmp), "PATH": "/usr/bin:/bin"})


def test_a_planted_upward_import_breaks_the_layers(tmp_path: Path) -> None:
    out = _planted(tmp_path, {"placer.cost.split": "def f():\n    from placer.solve import planner\n"})
    assert out.returncode == 1, out.stdout
    assert "placer.cost.split -> placer.solve.planner" in out.stdout


def test_the_simulator_and_the_executor_stay_apart(tmp_path: Path) -> None:
    out = _planted(tmp_path, {"simulator.api": "from typing import TYPE_CHECKING\n"
                                               "if TYPE_CHECKING:\n    import executors.run\n"})
    assert out.returncode == 1, out.stdout
    assert "simulator.api -> executors.run" in out.stdout


def test_a_planted_cycle_inside_a_layer_breaks(tmp_path: Path) -> None:
    out = _planted(tmp_path, {"placer.cost.timing": "from placer.cost import estimate\n",
                              "placer.cost.estimate": "def f():\n    from placer.cost import timing\n"})
    assert out.returncode == 1, out.stdout
    assert "No cycles are allowed in placer.cost" in out.stdout


def test_importing_the_package_loads_no_engine() -> None:
    """`import placer` (which every `placer.x` import runs first) and the API's names stay lazy:
    no solver, simulator, executor or Ray until a call needs them."""
    code = ("import sys, placer; placer.__version__; placer.compare; "
            "heavy = [m for m in sys.modules if m.split('.')[0] in "
            "('simulator', 'executors', 'workflows', 'ray', 'torch', 'ortools')]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def _notebook_imports(nb: Path) -> list[str]:
    cells = json.loads(nb.read_text())["cells"]
    src = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    out = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return out


@pytest.mark.parametrize("nb", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_notebooks_call_the_library_not_the_commands(nb: Path) -> None:
    bad = [m for m in _notebook_imports(nb)
           if m.startswith(("placer.cli", "placer.commands"))]
    assert not bad, f"{nb.name} imports command modules: {bad}"
