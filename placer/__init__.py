"""placer: plan, simulate and execute RL post-training placements across GPU, CPU and LPU pools.

The Python API (`placer.plan`, `placer.simulate`, `placer.execute`, `placer.compare`,
`placer.export`, `placer.import_run`, `placer.validate`, `placer.load_job`, `placer.load_plan`)
lives in `placer.api` and is loaded on first use, so `import placer` (and every `placer.x`
import, which runs this file first) loads neither the solver, the simulator nor Ray.
`placer.example(NAME)` and `placer.examples_dir()` find the shipped example jobs from the
package, whatever the working directory (`placer.base.examples`). Figures: `placer.plots`.
"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

API = ("compare", "execute", "export", "import_run", "load_job", "load_plan", "plan", "simulate",
       "validate")
EXAMPLES = ("example", "examples_dir")


def __getattr__(name: str) -> Any:
    if name in API:
        from placer import api
        return getattr(api, name)
    if name in EXAMPLES:
        from placer.base import examples
        return getattr(examples, name)
    raise AttributeError(f"module 'placer' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *API, *EXAMPLES])
