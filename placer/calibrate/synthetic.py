"""Synthetic traces, labelled as such: a long-tailed workload (JSONL) and cost-model event traces.

1. `longtail_rows` / `python -m placer.calibrate.synthetic`: a workload trace for long-reasoning, multi-turn
   RL, one sample a line: `prompt_tokens`, `response_tokens` (one per turn), `tool_latency_s` (one
   per tool call between turns). Responses are lognormal, capped at the generation limit; the shape
   sigma is solved so that the longest 10% of responses hold 50% of the generated tokens, which is
   how "the last 10% of requests to finish can take up to 50% of rollout time" (Seer, Moonshot AI
   and Tsinghua, arXiv:2511.14617; REFERENCES.md "Long tails") reads for a throughput-bound engine,
   where rollout time follows tokens generated and the longest responses finish last. Provenance,
   the parameters that are assumptions, and the file's measured statistics are in
   traces/workloads/README.md.

2. `cost_model_trace`: an event trace of a plan whose durations are the cost model's own times at
   known efficiency factors, times seeded multiplicative noise; `placer calibrate` must recover
   those factors from it (tests/test_fit.py). Its metadata says `source: synthetic`.
"""
from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypedDict

import numpy as np

from placer.base.roles import Role
from placer.cost.efficiency import Calibration
from placer.cost.estimate import reducing
from placer.cost.generation import decode_run_time, prefill_time
from placer.cost.model import score_time, sync_call_cost, train_time, transfer_time
from placer.cost.roofline import weight_bytes
from placer.cost.timing import sync_calls
from placer.cost.vocabcomm import head_of
from placer.solve.planfile import Plan
from placer.spec.distributions import Distribution
from placer.spec.sampling import draw, draw_lengths, rng
from traces.schema import Trace
from traces.workload import write_rows

Z90 = 1.2815515655446004  # standard normal 90% quantile
DEFAULT_OUT = Path("traces") / "workloads" / "longtail-synthetic.jsonl"  # from the repository root


# ------------------------------------------------------------------------ long-tailed workload
def _Phi(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2))) if math.isfinite(x) else float(x > 0)


def _partial_mean(median: float, sigma: float, lo: float, hi: float) -> float:
    """E[X; lo < X < hi] for ln X ~ N(ln median, sigma^2)."""
    mu = math.log(median)
    a = (math.log(lo) - mu) / sigma if lo > 0 else -math.inf
    b = (math.log(hi) - mu) / sigma if math.isfinite(hi) else math.inf
    return math.exp(mu + sigma ** 2 / 2) * (_Phi(b - sigma) - _Phi(a - sigma))


def top_decile_share(median: float, sigma: float, cap: float) -> float:
    """Share of all tokens held by the longest 10% of responses, X = min(lognormal, cap)."""
    q90 = min(median * math.exp(Z90 * sigma), cap)
    p_cap = 1 - _Phi((math.log(cap) - math.log(median)) / sigma)
    total = _partial_mean(median, sigma, 0.0, cap) + cap * p_cap
    if q90 >= cap:  # the top decile sits at the cap
        return 0.1 * cap / total
    return (_partial_mean(median, sigma, q90, cap) + cap * p_cap) / total


def solve_sigma(median: float, cap: float, share: float = 0.5) -> float:
    """Smallest lognormal shape whose longest 10% of (capped) responses hold `share` of the tokens.

    Uncapped, the share rises with sigma (sigma = z_0.9 = 1.2816 gives exactly 50%); a cap makes it
    fall again once the tail piles up at the cap, so the first crossing is bracketed on a grid.
    """
    grid = [k / 100 for k in range(1, 501)]
    hi = next((s for s in grid if top_decile_share(median, s, cap) >= share), None)
    if hi is None:
        raise ValueError(f"no sigma gives a top-10% token share of {share} with median {median:g} "
                         f"and cap {cap:g}")
    lo = hi - 0.01
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if top_decile_share(median, mid, cap) < share else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class LongTail:
    """Parameters of the shipped workload; see traces/workloads/README.md for each one's source."""

    samples: int = 4096
    turns: int = 2
    seed: int = 0
    response_median: float = 2048.0  # assumption (scale); the tail statement fixes only the shape
    response_cap: float = 65536.0  # Seer: Moonlight's maximum generation length
    tail_share: float = 0.5  # Seer: the last 10% of requests take up to 50% of rollout time
    prompt_median: float = 256.0  # assumption
    prompt_sigma: float = 0.5  # assumption
    prompt_cap: float = 4096.0  # assumption
    tool_median_s: float = 2.0  # assumption, as examples/agentic-code.yaml
    tool_sigma: float = 1.0  # assumption, as examples/agentic-code.yaml
    tool_cap_s: float = 120.0  # assumption: a sandbox wall-clock timeout

    def distributions(self) -> dict[str, Distribution]:
        sigma = solve_sigma(self.response_median, self.response_cap, self.tail_share)
        return {
            "prompt": Distribution(kind="lognormal", median=self.prompt_median,
                                   sigma=self.prompt_sigma, cap=self.prompt_cap),
            "response": Distribution(kind="lognormal", median=self.response_median, sigma=sigma,
                                     cap=self.response_cap),
            "tool": Distribution(kind="lognormal", median=self.tool_median_s,
                                 sigma=self.tool_sigma, cap=self.tool_cap_s),
        }


class WorkloadRow(TypedDict):
    """One sample of a workload trace (a JSONL line; traces/workloads/README.md)."""

    sample_id: int
    prompt_tokens: int
    response_tokens: list[int]  # one per turn
    tool_latency_s: list[float]  # one per tool call between turns


def longtail_rows(p: LongTail) -> list[WorkloadRow]:
    """Draw the workload with the project's own seeded sampler (placer.spec.sampling)."""
    d = p.distributions()
    prompts = draw_lengths(d["prompt"], rng(p.seed, 0), p.samples)
    resp = draw_lengths(d["response"], rng(p.seed, 1), p.samples * p.turns).reshape(p.samples, -1)
    tools = draw(d["tool"], rng(p.seed, 2), p.samples * (p.turns - 1)).reshape(p.samples, -1)
    return [{"sample_id": i, "prompt_tokens": int(prompts[i]),
             "response_tokens": [int(v) for v in resp[i]],
             "tool_latency_s": [round(float(v), 3) for v in tools[i]]}
            for i in range(p.samples)]


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Mean, quantiles and the top-decile token share of the per-turn response lengths of
    workload rows (`longtail_rows`, or a workload file's rows: `traces.workload.read_rows`)."""
    r = np.sort(np.concatenate([np.asarray(x["response_tokens"], float) for x in rows]))
    t = np.concatenate([np.asarray(x["tool_latency_s"], float) for x in rows] or [np.zeros(0)])
    top = r[int(math.floor(0.9 * len(r))):]
    out = {"responses": len(r), "response_mean": float(r.mean()),
           "response_p50": float(np.quantile(r, 0.5)), "response_p90": float(np.quantile(r, 0.9)),
           "response_p99": float(np.quantile(r, 0.99)), "response_max": float(r.max()),
           "top10_token_share": float(top.sum() / r.sum()),
           "prompt_mean": float(np.mean([x["prompt_tokens"] for x in rows]))}
    if len(t):
        out |= {"tool_mean_s": float(t.mean()), "tool_p50_s": float(np.quantile(t, 0.5)),
                "tool_p99_s": float(np.quantile(t, 0.99))}
    return out


# ---------------------------------------------------------------------- cost-model event trace
def _devices(plan: Plan, role: str) -> list[str]:
    r = plan.roles[role]
    return [f"{r.pool}:{i // 8}:{i % 8}" for i in range(r.devices)]


EventArg = float | list[int]  # what this trace's events carry in `args`: counts, sizes, sample ids


class _Add(Protocol):
    def __call__(self, cat: str, role: str, secs: float, devs: list[str], **args: EventArg
                 ) -> None: ...


def cost_model_trace(plan: Plan, truth: Calibration, seed: int = 0, noise: float = 0.02,
                     per_kind: int = 24) -> Trace:
    """Events whose durations are the cost model's times under `truth`, x exp(noise * N(0, 1)).

    Shapes vary from event to event (batch, context, steps, tokens, bytes) so that every factor
    and overhead is identifiable; the args follow the conventions placer/calibrate/fit.py documents.
    """
    res = plan.resolved()
    g = rng(seed, 101)
    trace = Trace(metadata={"source": "synthetic", "job": res.job.name, "seed": seed,
                            "emulated": False, "noise": noise})
    t = 0.0

    def add(cat: str, role: str, secs: float, devs: list[str], **args: EventArg) -> None:
        nonlocal t
        dur = secs * math.exp(noise * g.standard_normal())
        trace.add(cat, cat, t, dur, devs[0].rsplit(":", 1)[0], role, role=role, devices=devs,
                  **args)
        t += dur

    for role, r in plan.roles.items():
        m = res.model_of(role)
        if m is None:
            continue
        dev = res.device_of(r.pool)
        eff = truth.for_device(dev)
        devs = _devices(plan, role)
        for k in range(per_kind):
            seqs = int(g.integers(2, 200))
            tokens = 1024 * seqs
            if role in (Role.ACTOR, Role.CRITIC):
                add("train", role, train_time(m, dev, reducing(res, r.par), tokens, 1024, 1, eff,
                                             head_of(role)), devs,
                    tokens=tokens, sample_ids=list(range(seqs)), step=k)
            if role != Role.ROLLOUT:
                add("forward", role, score_time(m, dev, r.par, tokens, 1024, eff, head_of(role)), devs,
                    tokens=tokens, sample_ids=list(range(seqs)), step=k)
                continue
            # small batches decode memory-bound, large ones compute-bound while their contexts are short
            # (short contexts), so both sides and runs that cross from one to the other occur
            batch = int(g.integers(1, 65) if k % 2 else g.integers(256, 1025))
            ctx0 = int(g.integers(64, 4096) if k % 2 else g.integers(8, 64))
            steps = int(g.integers(16, 512))
            replica = devs[:r.tp * r.pp]
            add("prefill", role, prefill_time(m, dev, r.par, batch * ctx0, ctx0, eff), replica,
                tokens=batch * ctx0, batch=batch, context=0, step=k)
            add("decode", role, decode_run_time(m, dev, r.par, batch, ctx0, steps, eff), replica,
                tokens=batch * steps, batch=batch, context=batch * ctx0, step=k)
    _transfers(plan, truth, g, add, per_kind)
    env = res.job.environment
    if env.kind != "none":
        for v in draw(env.tool_latency_s, g, per_kind * 4):
            add("tool", Role.ENVIRONMENT, float(v), [f"{plan.roles[Role.ENVIRONMENT].pool}:0:0"])
    return trace


def _transfers(plan: Plan, truth: Calibration, g: np.random.Generator, add: _Add, n: int) -> None:
    if Role.ROLLOUT not in plan.roles or Role.ACTOR not in plan.roles:
        return
    res = plan.resolved()
    dev = res.device_of(plan.roles[Role.ROLLOUT].pool)
    eff = truth.for_device(dev)
    m, a_pp = res.arch_of(Role.ROLLOUT), plan.roles[Role.ACTOR].pp
    w = weight_bytes(m)
    gbs = min((s.gbs for s in plan.sync_routes), default=dev.nic_gbs)
    for _ in range(n):
        nbytes = float(w * g.uniform(0.05, 1.5))
        secs = transfer_time(nbytes, gbs, dev, eff, sync_calls(m, a_pp, eff, nbytes),
                             sync_call_cost(m, eff))
        add("transfer", Role.ROLLOUT, secs, _devices(plan, Role.ROLLOUT), bytes=nbytes, gbs=gbs)


# ---------------------------------------------------------------------------------- command
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m placer.calibrate.synthetic", description=__doc__.split(
        "\n")[0])
    ap.add_argument("-o", "--out", default=str(DEFAULT_OUT), help="JSONL file to write")
    ap.add_argument("--samples", type=int, default=LongTail.samples)
    ap.add_argument("--turns", type=int, default=LongTail.turns)
    ap.add_argument("--seed", type=int, default=LongTail.seed)
    ap.add_argument("--median", type=float, default=LongTail.response_median,
                    help="median response tokens per turn")
    args = ap.parse_args(argv)
    if args.samples < 1 or args.turns < 1 or args.median <= 0:
        ap.error("--samples and --turns must be >= 1 and --median > 0")
    p = LongTail(samples=args.samples, turns=args.turns, seed=args.seed,
                 response_median=args.median)
    rows = longtail_rows(p)
    write_rows(args.out, rows)
    sigma = p.distributions()["response"].sigma
    print(f"wrote {args.out}: {len(rows)} samples, {args.turns} turns, response lognormal "
          f"median {p.response_median:g} sigma {sigma:.4f} cap {p.response_cap:g}")
    for k, v in summarize(rows).items():
        print(f"  {k:<18} {v:,.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
