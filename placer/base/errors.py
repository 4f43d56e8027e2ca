"""The project's error types and exit codes: a leaf module that imports nothing of the project.

Every layer (specs, traces, the planner, the simulator, the executor, the CLI) raises these, and
the CLI turns them into exit codes, so they live below all of them.
"""
from __future__ import annotations

EXIT_BAD_INPUT = 2
EXIT_INFEASIBLE = 3
EXIT_TIMED_OUT = 4


class SpecError(ValueError):
    """A bad job, cluster, plan, trace or flag. `str()` is one line naming the field and the value."""


class Infeasible(Exception):
    """A job that fits nowhere; `str()` is the diagnosis (what cannot fit, the smallest change)."""


class TimedOut(Exception):
    """A search that ran out of time before it found any solution: no proof that none exists.
    `str()` says which limit ran out and how to give it more time."""
