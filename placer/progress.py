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
    execute(..., on_phase=bar.phase)  # a row naming the phase under way, with its own clock

A phase (`placer.base.phases`) is what long work is waiting for: starting Ray, loading models,
planning or simulating point i/n. It gets a row of its own under the bar, with a spinner and
the time spent in it; `setup=True` keeps the bar itself hidden until the phases end
(`bar.phase(None)`), so that a run's set-up does not read as "0/N steps".

`total=None` is work whose length is not known in advance (the policy comparison): a spinner
with the elapsed time, refreshed by rich's own thread while the work runs. A front end: the
engines below it never import it; they take its callbacks (`Bar.phase` is a
`placer.base.phases.PhaseListener`).
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

    def __init__(self, live: Any | None, task: Any | None, label: str = "",
                 hidden: bool = False) -> None:
        self._live = live  # rich.progress.Progress, or None when off
        self._task = task
        self._label = label
        self._hidden = hidden  # the bar waits for the set-up phases to end
        self._phase: Any | None = None  # the phase row's task
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

    def phase(self, name: str | None) -> None:
        """Show `name` as the phase under way, in its own row with its own elapsed time (a
        `placer.base.phases.PhaseListener`); None removes the row and shows the bar."""
        if self._live is None:
            return
        if self._phase is not None:
            self._live.remove_task(self._phase)
            self._phase = None
        if name is not None:
            self._phase = self._live.add_task(f"{self._label}: {name}", total=None, info="",
                                              phase=True)
        elif self._hidden:  # the set-up is over: the bar (and its clock) begins
            self._hidden = False
            self._live.reset(self._task, visible=True)
        self._live.refresh()  # a phase changes seldom: show it now, not at the next tick

    def write(self, line: str) -> None:
        """A stdout line; with a bar on a terminal it is printed above the bar."""
        print(line, flush=True)


@contextmanager
def progress(label: str, total: int | None = None, *, unit: str = "it",
             json_out: bool = False, stream: TextIO | None = None,
             setup: bool = False) -> Iterator[Bar]:
    """A transient bar on `stream` (stderr) for `total` units of work, or a spinner; with
    `setup`, the bar is hidden until `bar.phase(None)` ends the set-up phases."""
    if not enabled(json_out, stream):
        yield Bar(None, None)
        return
    from rich.console import Console  # lazy: only a bar on a terminal pays for rich
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        SpinnerColumn,
        Task,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.text import Text

    class CountsOnly(ProgressColumn):
        """A column of the bar's row, blank in a phase's row (which counts nothing)."""

        def __init__(self, inner: ProgressColumn) -> None:
            super().__init__()
            self.inner = inner

        def render(self, task: Task) -> Any:
            return Text("") if task.fields.get("phase") else self.inner.render(task)

    out = stream if stream is not None else sys.stderr
    console = Console(file=out, force_terminal=os.environ.get("PLACER_PROGRESS") == "1" or None)
    columns: list[Any] = [SpinnerColumn(), TextColumn("[bold]{task.description}")]
    if total is not None:
        columns += [CountsOnly(c) for c in (BarColumn(), MofNCompleteColumn(), TextColumn(unit))]
    columns += [TimeElapsedColumn()]
    if total is not None:
        columns += [CountsOnly(TextColumn("eta")), CountsOnly(TimeRemainingColumn())]
    columns += [TextColumn("{task.fields[info]}")]
    # stdout lines go above the bar only when stdout is that terminal; into a file they go as is
    live = Progress(*columns, console=console, transient=True,
                    redirect_stdout=sys.stdout.isatty(), redirect_stderr=False)
    task = live.add_task(label, total=total, info="", visible=not setup)
    with live:
        yield Bar(live, task, label, hidden=setup)


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
