"""Progress bars for long work (execute steps, simulations, sweeps and what-if grids), on stderr.

One rule for every command: a bar is shown only when stderr is a terminal and the command is not
printing `--json` (whose stdout is one document and whose stderr a script may read line by
line). `PLACER_PROGRESS=0` turns bars off everywhere, `PLACER_PROGRESS=1` on even without a
terminal (logs of long runs, and the tests). The bar is transient: it is gone when the work ends,
so the output of a run reads the same with or without it.

    with progress("execute", total=steps, unit="step", json_out=args.json) as bar:
        ...; bar.advance(info="reward 0.41")
    bar.write(line)  # a stdout line printed above the bar (plain print when there is none)
    simulate_plan(..., on_iteration=count_callback(bar))  # (done, total): a total may change

`total=None` is work whose length is not known in advance (the policy comparison): a spinner
with the elapsed time, refreshed by rich's own thread while the work runs. Imports nothing of the
project (foundation layer), so the engines and workflows may take a `Bar` or its callbacks.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO


def enabled(json_out: bool = False, stream: TextIO | None = None) -> bool:
    """Whether a bar would be shown (see the module docstring for the rule)."""
    forced = os.environ.get("PLACER_PROGRESS", "")
    if forced == "0" or json_out:
        return False
    if forced == "1":
        return True
    s = stream if stream is not None else sys.stderr
    return bool(getattr(s, "isatty", lambda: False)())


class Bar:
    """One task's bar; a no-op (printing lines plainly) when bars are off."""

    def __init__(self, live: Any | None, task: Any | None) -> None:
        self._live = live  # rich.progress.Progress, or None when off
        self._task = task
        self.done = 0

    @property
    def shown(self) -> bool:
        return self._live is not None

    def advance(self, n: int = 1, info: str = "") -> None:
        self.done += n
        if self._live is not None:
            self._live.update(self._task, advance=n, info=info)

    def describe(self, info: str) -> None:
        """Text beside the bar (the current step's figures, the grid point being solved)."""
        if self._live is not None:
            self._live.update(self._task, info=info)

    def count(self, done: int, total: int) -> None:
        """Set the bar to `done` of `total` (a total may change: a longer re-run starts over)."""
        self.done = done
        if self._live is not None:
            self._live.update(self._task, completed=done, total=total)

    def write(self, line: str) -> None:
        """A stdout line; with a bar on a terminal it is printed above the bar."""
        print(line, flush=True)


@contextmanager
def progress(label: str, total: int | None = None, *, unit: str = "it",
             json_out: bool = False, stream: TextIO | None = None) -> Iterator[Bar]:
    """A transient bar on `stream` (stderr) for `total` units of work, or a spinner."""
    if not enabled(json_out, stream):
        yield Bar(None, None)
        return
    from rich.console import Console  # lazy: only a bar on a terminal pays for rich
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    out = stream if stream is not None else sys.stderr
    console = Console(file=out, force_terminal=os.environ.get("PLACER_PROGRESS") == "1" or None)
    columns: list[Any] = [SpinnerColumn(), TextColumn("[bold]{task.description}")]
    if total is not None:
        columns += [BarColumn(), MofNCompleteColumn(), TextColumn(unit)]
    columns += [TimeElapsedColumn()]
    if total is not None:
        columns += [TextColumn("eta"), TimeRemainingColumn()]
    columns += [TextColumn("{task.fields[info]}")]
    # stdout lines go above the bar only when stdout is that terminal; into a file they go as is
    live = Progress(*columns, console=console, transient=True,
                    redirect_stdout=sys.stdout.isatty(), redirect_stderr=False)
    task = live.add_task(label, total=total, info="")
    with live:
        yield Bar(live, task)


def grid_callback(bar: Bar) -> Callable[[int, int, str], None]:
    """A `(index, total, label)` callback (the what-if grid's and the sweep's) that moves `bar`
    to point `index` and shows its label."""
    def step(i: int, total: int, label: str) -> None:
        if i > bar.done:
            bar.advance(i - bar.done, info=label)
        else:
            bar.describe(label)
    return step


def count_callback(bar: Bar) -> Callable[[int, int], None]:
    """A `(done, total)` callback (the simulator's, once per iteration) that sets `bar`."""
    return bar.count
