"""Named phases of long work, timed, and told to whoever shows them: a leaf module.

A long call (an execute's set-up, a sweep's points, a comparison's simulations) names the
phase it is in; a front end shows it (`placer.progress` on a terminal), a test records it.
The engines sit below the front ends and may not import them, so this protocol lives here, at
the bottom, and the front end passes its listener down:

    clock = PhaseClock(listener)        # listener: any callable of (phase or None)
    clock.begin("starting Ray")         # the previous phase (if any) ends here
    ...
    clock.end()                         # no phase now: the listener gets None
    clock.spans                         # [("starting Ray", 3.1), ...]: seconds each, in order
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol


class PhaseListener(Protocol):
    """Told the name of each phase as it begins; None when the phases are over."""

    def __call__(self, phase: str | None, /) -> None: ...


@dataclass
class PhaseClock:
    """Times consecutive phases (monotonic clock) and tells `listener` as each begins."""

    listener: PhaseListener | None = None
    spans: list[tuple[str, float]] = field(default_factory=list)  # (phase, seconds), in order
    _now: tuple[str, float] | None = None  # the phase under way and when it began

    @property
    def current(self) -> str | None:
        return None if self._now is None else self._now[0]

    def begin(self, phase: str) -> None:
        """`phase` begins; the one under way (if any) ends now."""
        self._close()
        self._now = (phase, time.monotonic())
        if self.listener is not None:
            self.listener(phase)

    def end(self) -> None:
        """The phase under way ends and none follows (the listener gets None)."""
        was = self._now
        self._close()
        if was is not None and self.listener is not None:
            self.listener(None)

    def total_s(self) -> float:
        return sum(s for _, s in self.spans)

    def _close(self) -> None:
        if self._now is not None:
            name, t0 = self._now
            self.spans.append((name, time.monotonic() - t0))
            self._now = None
