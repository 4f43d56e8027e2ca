"""Long-tail policies on an iteration's samples (the job's `tail_policy`, `placer.spec.TailPolicy`).

The engines (`simulator.engine`) run whatever rows they are given; the policies shape those rows
and choose which finished samples the step trains on:

overprovision  `samples_for` draws ceil(n (1 + f)) samples; the rollout stage ends as soon as n of
               them finished (an `engine.Quota` interrupts the engines); the first n to finish,
               ties broken by sample index, are scored and trained (`first_done`).
partial        every row is cut once it generated `token_budget` response tokens this step
               (`cut`): the part up to the budget runs now; the rest becomes a *carried* row that
               runs first in the next step, its whole context so far prefilled again (the KV is
               not kept across steps) and its remaining tool calls after it. A step runs the
               carried rows plus fresh samples up to n rows and trains the rows that finished.
reissue        handled by the CPU pool (`simulator.environment.CorePool`).

Rows are what the engine reads: a prompt (tokens prefilled at admission), response tokens per
turn, and one tool latency between consecutive turns, so rows may differ in their turn count.
"""
from __future__ import annotations

from dataclasses import dataclass

from simulator.workload import Samples

Row = tuple[int, list[int], list[float]]  # (prompt tokens, response per turn, tool latencies)


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


def with_carry(fresh: Samples, carry: list[Row], n: int) -> tuple[list[Row], list[Row]]:
    """(this step's rows: carried first, then fresh samples up to n; the carry still waiting)."""
    now = carry[:n]
    return now + rows_of(fresh)[:n - len(now)], carry[n:]
