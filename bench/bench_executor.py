"""Executor overhead: per-step wall time of `placer execute` (Ray) against a plain torch loop.

The baseline (`bench.plain_loop`) is written apart from the executor: the same tiny model class
and initial weights, the same batch (prompts x samples per prompt, prompt and response lengths),
the same optimizer (Adam at the executor's learning rate, gradient clipping at 1.0),
mini-batches, precision and micro-batches (the plan's: BF16 autocast over FP32 weights, and the
trainer's gradient accumulation, `executors.roles.plan_settings`), one process, one thread, no
Ray, no sandbox, no weight sync. The executor runs the
plan `placer plan` makes of examples/tiny-cpu.yaml (its own one-process runtime is shown too:
the executor's work without Ray).

Where the difference goes is read off the Ray run's trace, per step (median after step 0):
  compute        the workers' own time on the step's critical path: generation, the longer of
                 the reference forward and the sandboxed verifier plus the reward, training;
  environment    the verifier's calls, from the score stage's start to the reward's: the
                 sandbox's start-up and runs (and those calls' own dispatch, which the trace
                 cannot separate); part of compute above; the plain loop has none: the job
                 asks for it;
  weight sync    the driver's sync stage (the plain loop samples with the model it trains);
  checkpoint     the per-step checkpoint (`checkpoint_every` 1);
  serialisation  pickling the step's payloads (the batch through each role, the weights once),
                 timed in this process with the protocol Ray uses (an estimate of the store's
                 copies: Ray's own serialiser is not instrumented);
  dispatch       the rest: the step's wall time outside all of the above (actor calls, the
                 object store's round trips, scheduling, the driver's own bookkeeping).
Usage: python -m bench.bench_executor [--steps N] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from placer.cost.calibration import load_calibration
from placer.cost.pricer import Pricer
from placer.solve.planfile import Plan
from placer.solve.planner import plan_job
from placer.spec.catalog import resolve
from placer.spec.load import load_job
from traces.schema import Trace

ROOT = Path(__file__).resolve().parents[1]
BATCH_HOPS = 5  # the batch crosses processes to the reference, environment, reward, trainers
# and back from the rollout: five copies of the step's samples per step


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def step_parts(trace: Trace, step: int) -> dict[str, float]:
    """One step's wall time and its parts (module docstring), from the executed trace; the
    dispatch of each stage is its wall time less its workers' critical path."""
    evs = [e for e in trace.events if e.args.get("step") == step]

    def longest(cat: str, prefix: str = "") -> float:
        return max((e.dur_s for e in evs if e.cat == cat and e.name.startswith(prefix)),
                   default=0.0)
    stages = {e.name: e for e in evs if e.cat == "stage" and e.pid == "driver"}
    tools = [e for e in evs if e.cat == "tool"]
    runs = (max(e.end_s for e in tools) - min(e.ts_s for e in tools)) if tools else 0.0
    rewards = [e for e in evs if e.cat == "reward"]
    reward = sum(e.dur_s for e in rewards)
    # the verifier's calls: from the score stage's start to the reward's (it waits for them)
    env = (min(e.ts_s for e in rewards) - stages["score"].ts_s
           if tools and rewards and "score" in stages else runs)
    work = {"rollout": longest("generate"), "score": max(longest("forward"), env + reward),
            "train": longest("train", "train actor")}
    step_s = next(e.dur_s for e in evs if e.cat == "step")
    ckpt = sum(e.dur_s for e in evs if e.cat == "checkpoint")
    walls = {k: e.dur_s for k, e in stages.items()}
    out = {"step_s": step_s, "compute_s": sum(work.values()), "generate_s": work["rollout"],
           "reference_s": longest("forward"), "train_s": work["train"], "environment_s": env,
           "environment_runs_s": runs,
           "sync_s": walls.get("sync", 0.0), "checkpoint_s": ckpt,
           "between_stages_s": max(step_s - sum(walls.values()) - ckpt, 0.0)}
    for name, w in work.items():
        out[f"dispatch_{name}_s"] = max(walls.get(name, 0.0) - w, 0.0)
    return out


def serialisation_s(plan: Plan, samples: int, tokens: int) -> float:
    """Pickle round trips (protocol 5, as Ray) of a step's payloads: a batch of `samples`
    samples of `tokens` tokens (ids and log-probs) `BATCH_HOPS` times, and the weights once."""
    from executors.model import build_policy
    from executors.rl import Samples
    res = plan.resolved()
    arch = res.model_of("actor")
    assert arch is not None
    weights = {k: v.clone() for k, v in build_policy(arch, 0).state_dict().items()}
    half = tokens // 2
    batch = Samples([str(i) for i in range(samples)], [[5] * half] * samples,
                    [[6] * (tokens - half)] * samples, [[-1.0] * (tokens - half)] * samples, 0,
                    [str(i // 4) for i in range(samples)])
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(BATCH_HOPS):
            pickle.loads(pickle.dumps(batch, protocol=5))
        pickle.loads(pickle.dumps(weights, protocol=5))
        runs.append(time.perf_counter() - t0)
    return _median(runs)


def measure(steps: int, job: Path) -> dict[str, Any]:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from bench import plain_loop
    from executors.roles import RunConfig, plan_settings
    from executors.run import execute  # lazy: Ray and torch load after the environment is set
    from executors.runplan import resolve_plan

    loaded = load_job(job)
    plan = plan_job(Pricer(resolve(loaded, str(job)), load_calibration(None)))
    res = plan.resolved()
    arch = res.model_of("actor")
    assert arch is not None
    out: dict[str, Any] = {}
    trainer = plan_settings(resolve_plan(plan))  # what the executor's trainer runs
    plain = plain_loop.run(arch, loaded.seed, loaded.batch.prompts,
                           loaded.batch.samples_per_prompt,
                           int(loaded.lengths.prompt.max_value()),
                           int(loaded.lengths.response.max_value()), steps,
                           lr=RunConfig.lr, mini_batches=loaded.batch.mini_batches,
                           bf16=trainer["precision"] == "bf16",
                           micro_batches=trainer["accumulate"])
    out["plain torch"] = {"median_step_s": _median(plain.step_s[1:]),
                          "precision": trainer["precision"],
                          "micro_batches": trainer["accumulate"],
                          "phases_s": {k: _median(v[1:]) for k, v in plain.phase_s.items()}}
    with tempfile.TemporaryDirectory() as d:
        for name, local in (("one process", True), ("ray", False)):
            r = execute(plan, steps, Path(d) / name.replace(" ", "-"), local=local)
            parts = [step_parts(r.trace, s.step) for s in r.stats[1:]]
            out[name] = {"median_step_s": _median([p["step_s"] for p in parts]),
                         "setup_s": round(r.setup_s, 2),
                         "parts_s": {k: _median([p[k] for p in parts]) for k in parts[0]}}
            if not local:
                import ray  # lazy: like `execute` above, after the environment is set
                ray.shutdown()
    tokens = int(loaded.lengths.prompt.max_value() + loaded.lengths.response.max_value())
    ray_parts = out["ray"]["parts_s"]
    ser = serialisation_s(plan, loaded.batch.samples, tokens)
    rest = (ray_parts["step_s"] - ray_parts["compute_s"] - ray_parts["sync_s"]
            - ray_parts["checkpoint_s"])
    out["ray"]["parts_s"].update(serialisation_s=ser, dispatch_s=max(rest - ser, 0.0))
    base = out["plain torch"]["median_step_s"]
    out["ratio"] = out["ray"]["median_step_s"] / base
    # the same work as the plain loop: without the sandboxed verifier the job adds
    out["ratio_without_verifier"] = (out["ray"]["median_step_s"] - ray_parts["environment_s"]) / base
    out["ratio_one_process"] = out["one process"]["median_step_s"] / base
    out["layout"] = {name: f"{r.pool} dp{r.dp} tp{r.tp} pp{r.pp}"
                     for name, r in plan.roles.items()}
    return out


def report(res: dict[str, Any], steps: int, job: str) -> list[str]:
    ray, base = res["ray"], res["plain torch"]
    p = ray["parts_s"]
    lines = [f"executor overhead, {steps} GRPO steps of {job} (median after step 0); plan: "
             + ", ".join(f"{k} {v}" for k, v in res["layout"].items()),
             f"  {'runtime':<26} {'median step s':>14} {'vs plain':>9}",
             f"  {'plain torch loop':<26} {base['median_step_s']:>14.3f} {1.0:>8.2f}x",
             f"  {'executor, one process':<26} {res['one process']['median_step_s']:>14.3f} "
             f"{res['ratio_one_process']:>8.2f}x",
             f"  {'executor, Ray':<26} {ray['median_step_s']:>14.3f} {res['ratio']:>8.2f}x",
             f"  plain loop's step ({base['precision']}, {base['micro_batches']} micro-batch(es) "
             "per mini-batch, as the executor's trainer): " + ", ".join(
                 f"{k} {v:.3f} s" for k, v in base["phases_s"].items()),
             "  where the Ray step goes (s): "
             f"compute {p['compute_s']:.3f} (generate {p['generate_s']:.3f}, reference "
             f"{p['reference_s']:.3f} beside the verifier, train {p['train_s']:.3f}; "
             f"the sandboxed verifier's calls "
             f"{p['environment_s']:.3f}: answers running {p['environment_runs_s']:.3f}, the "
             f"rest sandbox start-up and those calls' dispatch), weight sync {p['sync_s']:.3f}, checkpoint "
             f"{p['checkpoint_s']:.3f}, serialisation ~{p['serialisation_s']:.3f}, dispatch "
             f"{p['dispatch_s']:.3f} (rollout stage {p['dispatch_rollout_s']:.3f}, score stage "
             f"{p['dispatch_score_s']:.3f}, train stage {p['dispatch_train_s']:.3f}, between "
             f"stages {p['between_stages_s']:.3f})",
             f"  ratio executor (Ray) / plain torch loop: {res['ratio']:.2f}x; without the "
             f"sandboxed verifier (work the plain loop does not do): "
             f"{res['ratio_without_verifier']:.2f}x"]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--steps", type=int, default=24)  # the median of 8 moved by +-15% run to run
    ap.add_argument("--job", default=str(ROOT / "examples" / "tiny-cpu.yaml"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    steps = max(a.steps, 3)
    res = measure(steps, Path(a.job))
    if a.json:
        print(json.dumps(res, indent=2))
        return 0
    print("\n".join(report(res, steps, Path(a.job).name)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
