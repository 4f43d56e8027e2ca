"""The example jobs shipped with the project, found from the package, not the working directory.

    placer.examples_dir()                    # the folder of example jobs, clusters and fleets
    placer.example("ppo-llama8b-hetero.yaml")  # one of them (a Path), or a SpecError naming it

So a notebook or a script runs from any folder (a copy of `notebooks/` included). The examples
live in the project's `examples/` folder beside the packages: a source checkout and the editable
install `make demo` makes (`pip install -e .`) both find them there. An installation without that
folder (a wheel) points `PLACER_EXAMPLES` at a copy of it. A leaf module: imports only
`placer.base.errors`.
"""
from __future__ import annotations

import os
from pathlib import Path

from placer.base.errors import SpecError

ENV = "PLACER_EXAMPLES"  # overrides where the examples are looked for
# placer/base/examples.py -> the project root, where examples/ sits beside placer/
CHECKOUT_EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def examples_dir() -> Path:
    """The examples folder: `$PLACER_EXAMPLES` when set, else the project's `examples/`."""
    override = os.environ.get(ENV)
    where = Path(override).expanduser() if override else CHECKOUT_EXAMPLES
    if not where.is_dir():
        source = f"${ENV}" if override else "the project's checkout"
        raise SpecError(f"examples: {where}: no such folder (from {source}; set {ENV} to the "
                        f"project's examples/ folder)")
    return where


def example(name: str) -> Path:
    """The example file (or folder) `name` under `examples_dir()`, e.g. "tiny-cpu.yaml" or
    "published/r01-dapo7b-32xh20-colocate.yaml"."""
    root = examples_dir()
    path = (root / name).resolve()
    if root.resolve() not in path.parents:
        raise SpecError(f"example: {name!r}: not a path inside {root}")
    if not path.exists():
        shipped = ", ".join(sorted(p.name for p in root.glob("*.yaml")))
        raise SpecError(f"example: {name!r}: no such example in {root} (examples: {shipped})")
    return path
