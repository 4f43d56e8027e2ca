"""Long-tail policies on an iteration's samples (the job's `tail_policy`, `placer.spec.job.TailPolicy`).

The engines (`simulator.engine`) run whatever rows they are given; the policies shape those rows
and choose which finished samples the step trains on:

overprovision  `samples_for` draws ceil(n (1 + f)) samples; the rollout stage ends as soon as n of
               them finished (an `engine.Quota` interrupts the engines); the first n to finish,
               ties broken by sample index, are scored and trained (`first_done`).
partial        every row is cut once it generated `token_budget` response tokens this step
               (`cut`): the part up to the budget runs now; the rest becomes a *carried* row that
               runs first in the next step, its whole context so far prefilled again (the KV is
               not kept across steps) and its remaining tool calls after it. A step runs the
               carried rows plus fresh samples up to n rows (`Partial`): with GRPO in whole
               groups of `samples_per_prompt`, and a finished row trains only once no row of its
               group is cut - until then it is *held* - because GRPO's advantage needs the whole
               group's rewards (as the executor does, `executors.tails`; PPO trains each row when
               it finishes). A step with no complete group trains nothing (the executor runs
               another round instead: a difference only when a budget cuts nearly every row).
reissue        handled by the CPU pool (`simulator.environment.CorePool`).

Rows are what the engine reads: a prompt (tokens prefilled at admission), response tokens per
turn, and one tool latency between consecutive turns, so rows may differ in their turn count.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from simulator.workload import Samples

Row = tuple[int, list[int], list[float]]  # (prompt tokens, response per turn, tool latencies)
UNITS_PER_STEP = 1_000_000  # unit ids: step x this + group index, unique over a run


def rows_of(smp: Samples) -> list[Row]:
    return list(zip(smp.prompt, smp.response, smp.tool_s))


def from_rows(rows: list[Row], tool_output: int) -> Samples:
    return Samples([r[0] for r in rows], [list(r[1]) for r in rows], [list(r[2]) for r in rows],
                   tool_output)


def subset(smp: Samples, ids: list[int]) -> Samples:
    return Samples([smp.prompt[i] for i in ids], [smp.response[i] for i in ids],
                   [smp.tool_s[i] for i in ids], smp.tool_output)


def first_done(done_at: dict[int, float], n: int) -> list[int]:
    """The first n samples to finish (ties by index): what an over-provisioned step keeps."""
    return sorted(done_at, key=lambda sid: (done_at[sid], sid))[:n]


@dataclass
class Cut:
    run: Samples  # the rows this step runs, each at most `budget` response tokens
    finished: list[int]  # indices of rows that complete their sample this step
    carry: list[Row]  # the rest of the cut rows, for the next step
    carried_tokens: int  # response tokens left for the next step


def cut_row(row: Row, budget: int, tool_output: int) -> tuple[Row, Row | None]:
    """(the part of `row` this step generates, the rest or None). A turn is cut after
    max(budget left, 1) tokens, so a carried row always resumes mid-turn (never on a tool call)
    and has at least one token to generate."""
    prompt, resp, tools = row
    left, ctx = budget, prompt
    for t, r in enumerate(resp):
        g = r if r <= left else max(left, 1)
        if g < r:
            now = (prompt, resp[:t] + [g], tools[:t])
            rest = (ctx + g, [r - g] + resp[t + 1:], tools[t:])
            return now, rest
        left -= r
        ctx += r + (tool_output if t < len(resp) - 1 else 0)
    return row, None


def cut(rows: list[Row], budget: int, tool_output: int) -> Cut:
    run, finished, carry = [], [], []
    for k, row in enumerate(rows):
        now, rest = cut_row(row, budget, tool_output)
        run.append(now)
        if rest is None:
            finished.append(k)
        else:
            carry.append(rest)
    return Cut(from_rows(run, tool_output), finished, carry,
               sum(sum(r[1]) for r in carry))


@dataclass
class Partial:
    """A run's partial-rollout state: the rest of each cut row and finished rows waiting for a
    cut sibling, each with its *unit* (its GRPO group, or the row itself when `group_size` is 1).
    Per run, never shared."""

    group_size: int
    carry: list[tuple[Row, int]] = field(default_factory=list)
    held: list[tuple[Row, int]] = field(default_factory=list)
    units: dict[int, list[int]] = field(default_factory=dict)  # iteration -> unit of each row

    def rows_for(self, i: int, fresh: Samples, n: int) -> Samples:
        """Iteration i's rows: carried rows first, then fresh ones up to n in whole units."""
        now, self.carry = self.carry[:n], self.carry[n:]
        g = self.group_size
        k = (n - len(now)) // g * g
        self.units[i] = [u for _, u in now] + [i * UNITS_PER_STEP + j // g for j in range(k)]
        return from_rows([r for r, _ in now] + rows_of(fresh)[:k], fresh.tool_output)

    def settle(self, i: int, c: Cut) -> list[Row]:
        """The rows iteration i trains (finished, of units with no cut row); the cut rows'
        rests and the finished rows of incomplete units wait for later steps."""
        units = self.units.pop(i)
        finished = set(c.finished)
        waiting = {u for k, u in enumerate(units) if k not in finished}
        run = rows_of(c.run)
        done = [(run[k], units[k]) for k in c.finished] + self.held
        self.held = [(r, u) for r, u in done if u in waiting]
        self.carry += list(zip(c.carry, [u for k, u in enumerate(units) if k not in finished]))
        return [r for r, u in done if u not in waiting]
