"""Progress bars (placer/progress.py): shown on a terminal, never under --json, never into a pipe;
`PLACER_PROGRESS` forces them off or on; the CLI's stdout is the same with or without them."""
from __future__ import annotations

import io
import json
import os
import subprocess

import pytest

from placer.progress import Bar, count_callback, enabled, grid_callback, progress


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _no_override(monkeypatch):
    monkeypatch.delenv("PLACER_PROGRESS", raising=False)


def test_the_rule(monkeypatch) -> None:
    assert enabled(stream=Tty())
    assert not enabled(stream=io.StringIO())  # a pipe or a file
    assert not enabled(json_out=True, stream=Tty())
    monkeypatch.setenv("PLACER_PROGRESS", "0")
    assert not enabled(stream=Tty())
    monkeypatch.setenv("PLACER_PROGRESS", "1")
    assert enabled(stream=io.StringIO())
    assert not enabled(json_out=True, stream=io.StringIO())  # --json wins


def test_a_bar_on_a_terminal_counts_and_clears(monkeypatch) -> None:
    tty = Tty()
    with progress("execute", total=3, unit="step", stream=tty) as bar:
        assert bar.shown
        for _ in range(3):
            bar.advance(info="reward 0.5")
        assert bar.done == 3
    text = tty.getvalue()
    assert "execute" in text


def test_off_writes_nothing_and_still_counts() -> None:
    out = io.StringIO()
    with progress("simulate", stream=out) as bar:
        assert not bar.shown
        bar.advance(2)
    assert bar.done == 2 and out.getvalue() == ""


def test_set_up_phases_show_before_the_bar() -> None:
    """`setup=True`: each phase is named in a row of its own while the bar stays hidden (a
    run's set-up is not "0/2 step"); `phase(None)` ends them and the bar counts."""
    tty = Tty()
    with progress("execute", total=2, unit="step", stream=tty, setup=True) as bar:
        bar.phase("starting Ray")
        bar.phase("starting actors, loading models")
        during = tty.getvalue()
        bar.phase(None)
        bar.advance()
        bar.advance()
    assert during.index("execute: starting Ray") < during.index("execute: starting actors")
    assert "0/2" not in during and "step" not in during.replace("execute:", "")
    assert "2/2" in tty.getvalue()


def test_phases_beside_a_visible_bar_and_off() -> None:
    tty = Tty()
    with progress("sweep", total=2, unit="points", stream=tty) as bar:
        bar.phase("planning point 1/2 (a)")
        assert "0/2" in tty.getvalue() and "sweep: planning point 1/2 (a)" in tty.getvalue()
        bar.phase(None)
    out = io.StringIO()
    with progress("sweep", total=2, stream=out, setup=True) as off:
        off.phase("planning")
        off.phase(None)
    assert out.getvalue() == ""


def test_grid_callback_moves_to_the_point() -> None:
    bar = Bar(None, None)
    step = grid_callback(bar)
    step(0, 4, "a")
    step(3, 4, "d")
    assert bar.done == 3


def test_count_callback_sets_done_and_a_new_total() -> None:
    tty = Tty()
    with progress("simulate", total=4, unit="iterations", stream=tty) as bar:
        tick = count_callback(bar)
        for i in range(1, 5):
            tick(i, 4)
        tick(1, 9)  # a longer re-run starts the count again
        assert bar.done == 1
        tick(9, 9)
    assert bar.done == 9 and "9/9" in tty.getvalue()


def _simulate(placer_cmd, plan, env_value: str | None, *extra: str):
    env = {k: v for k, v in os.environ.items() if k != "PLACER_PROGRESS"}
    if env_value is not None:
        env["PLACER_PROGRESS"] = env_value
    return subprocess.run(placer_cmd + ["simulate", str(plan), "--iterations", "1", *extra],
                          capture_output=True, text=True, env=env)


def test_cli_bar_only_when_asked_and_stdout_unchanged(tmp_path, placer_cmd) -> None:
    from simplans import small_plan

    from placer.solve.planfile import save_plan
    plan = tmp_path / "plan.json"
    save_plan(small_plan(), plan)
    piped = _simulate(placer_cmd, plan, None)  # stderr is a pipe here: no bar
    forced = _simulate(placer_cmd, plan, "1")
    assert piped.returncode == forced.returncode == 0, forced.stderr
    assert "simulate" not in piped.stderr
    assert "simulate" in forced.stderr  # the bar's label
    assert "1/1" in forced.stderr and "iterations" in forced.stderr  # counted per iteration
    assert forced.stdout == piped.stdout
    js = _simulate(placer_cmd, plan, "1", "--json")
    assert js.returncode == 0 and "simulate" not in js.stderr
    json.loads(js.stdout)
