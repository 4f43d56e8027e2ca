"""The sample ledger: proof that every planned sample was trained on exactly once.

Per step the loop records the sample ids it planned (from the prompts), every generation of a
sample (one per rollout round it took part in: a multi-turn or resumed sample has several; a re-run
after a lost rollout or environment actor adds one, marked as a re-run;
a straggler's samples raced on a second worker are listed as re-issued, and only the copy that
finished first is recorded as generated; an overprovisioned step's samples that were not among
the first n to finish are listed as dropped and must not be trained), and the ids that reached
the optimizer. With partial rollouts a sample may train in a later step than the one that planned
it: a step lists the samples it took over from the step before (`carried_in`) and those it passes
on (`carried_out`); it must train its planned and carried-in samples except the dropped and
carried-out ones, and each step's carried-in must be the previous step's carried-out (what the
last step carries out is in flight when the run ends, reported, not lost). A step is committed
when its training finished; a trainer restart that rolls back to an older checkpoint discards the
steps after it (their updates are gone with the lost weights) and they are run again.
`balanced()` holds when every committed step trained each planned, not dropped id exactly once
and nothing else, and steps 0..n-1 are all committed.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from placer.base.fileio import atomic_write_text


@dataclass
class StepEntry:
    planned: list[str]
    generated: Counter = field(default_factory=Counter)
    reruns: list[str] = field(default_factory=list)
    reissued: list[str] = field(default_factory=list)  # raced on a second worker (one copy kept)
    dropped: list[str] = field(default_factory=list)  # overprovisioned, not among the first n
    carried_in: list[str] = field(default_factory=list)  # partial: from the step before
    carried_out: list[str] = field(default_factory=list)  # partial: on to the next step
    trained: Counter = field(default_factory=Counter)
    committed: bool = False


@dataclass
class Ledger:
    steps: dict[int, StepEntry] = field(default_factory=dict)
    rolled_back: list[int] = field(default_factory=list)

    def plan(self, step: int, ids: list[str]) -> None:
        self.steps[step] = StepEntry(list(ids))

    def generated(self, step: int, ids: list[str], rerun: bool = False) -> None:
        e = self.steps[step]
        e.generated.update(ids)
        if rerun:
            e.reruns += list(ids)

    def reissued(self, step: int, ids: list[str]) -> None:
        """A straggler's samples were also generated elsewhere; only the winning copy is counted
        by `generated` (the loser's result is dropped unread)."""
        self.steps[step].reissued += list(ids)

    def dropped(self, step: int, ids: list[str]) -> None:
        """Planned samples an overprovisioned step does not train (not among the first n)."""
        self.steps[step].dropped += list(ids)

    def carried_in(self, step: int, ids: list[str]) -> None:
        self.steps[step].carried_in = list(ids)

    def carried_out(self, step: int, ids: list[str]) -> None:
        """What a partial step passes on (its last rollout round's carry replaces earlier ones)."""
        self.steps[step].carried_out = list(ids)

    def trained(self, step: int, ids: list[str]) -> None:
        self.steps[step].trained.update(ids)

    def commit(self, step: int) -> None:
        self.steps[step].committed = True

    def rollback(self, last_good: int) -> None:
        """Forget steps after `last_good` (their training was lost with the trainer's weights)."""
        for s in sorted(s for s in self.steps if s > last_good):
            self.rolled_back.append(s)
            del self.steps[s]

    def problems(self, n_steps: int, first: int = 0) -> list[str]:
        """What does not balance in steps `first` to `n_steps - 1` (a resumed run starts at
        `first`: the steps before it were checked by the run that made its checkpoint)."""
        out = []
        for s in range(first, n_steps):
            e = self.steps.get(s)
            if e is None or not e.committed:
                out.append(f"step {s}: not committed")
                continue
            gone = set(e.dropped) | set(e.carried_out)
            want = Counter(i for i in e.planned + e.carried_in if i not in gone)
            if e.trained != want:
                lost = sorted(set(want) - set(e.trained))
                twice = sorted(k for k, c in e.trained.items() if c > 1)
                extra = sorted(set(e.trained) - set(want))
                out.append(f"step {s}: lost {lost[:3]}, counted twice {twice[:3]}, "
                           f"unplanned {extra[:3]}")
            if not set(want) <= set(e.generated) | set(e.carried_in) or \
                    not set(e.generated) <= set(e.planned) | set(e.carried_in):
                out.append(f"step {s}: generated ids differ from planned ids")
            before = self.steps.get(s - 1)
            if s == first > 0:
                continue  # its carry came from the checkpoint, not from a step of this run
            if set(e.carried_in) != set(before.carried_out if before else []):
                out.append(f"step {s}: carried in {len(e.carried_in)} sample(s), the step before "
                           f"carried out {len(before.carried_out) if before else 0}")
        return out

    def balanced(self, n_steps: int) -> bool:
        return not self.problems(n_steps)

    def to_dict(self) -> dict[str, Any]:
        return {"steps": {str(s): {"planned": len(e.planned), "trained": sum(e.trained.values()),
                                   "distinct_trained": len(e.trained), "reruns": e.reruns,
                                   "reissued": e.reissued, "dropped": e.dropped,
                                   "carried_in": e.carried_in, "carried_out": e.carried_out,
                                   "committed": e.committed}
                          for s, e in sorted(self.steps.items())},
                "rolled_back": self.rolled_back}

    def write(self, path: str | Path) -> None:
        atomic_write_text(path, json.dumps(self.to_dict(), indent=1))
