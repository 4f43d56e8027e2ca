"""`python -m bench executor`'s parts: the plain torch loop it measures against trains, and the
Ray step's wall time is split into parts that add up to it (bench/bench_executor.py). No
timing is asserted: the benchmark prints ratios, tests check only what they are made of."""
from __future__ import annotations

import pytest

from traces.schema import Trace


def _step(tr: Trace, k: int) -> None:
    """A hand-made executed step `k`: stages on the driver, the workers' calls inside them."""
    def add(name: str, cat: str, ts: float, dur: float, pid: str = "gpu:0") -> None:
        tr.add(name, cat, ts, dur, pid, name, step=k)
    add("step", "step", 0.0, 2.0, "driver")
    add("sync", "stage", 0.0, 0.1, "driver")
    add("rollout", "stage", 0.1, 0.5, "driver")
    add("generate", "generate", 0.12, 0.4)
    add("generate", "generate", 0.12, 0.3)  # a second replica, shorter
    add("score", "stage", 0.6, 1.0, "driver")
    add("reference", "forward", 0.6, 0.2)
    for i in range(3):
        add("tool", "tool", 0.7 + 0.2 * i, 0.1, "cpu:0")
    add("reward", "reward", 1.5, 0.05, "cpu:0")
    add("train", "stage", 1.6, 0.3, "driver")
    add("train actor", "train", 1.6, 0.25)
    add("checkpoint", "checkpoint", 1.9, 0.05, "driver")


def test_the_step_parts_add_up_to_the_step() -> None:
    from bench.bench_executor import step_parts
    tr = Trace()
    _step(tr, 1)
    p = step_parts(tr, 1)
    assert p["environment_runs_s"] == pytest.approx(0.5)  # first tool start to last tool end
    assert p["environment_s"] == pytest.approx(0.9)  # score start to the reward's start
    # rollout 0.4 (the longer replica) + score max(0.2, 0.9 + 0.05) + train 0.25
    assert p["compute_s"] == pytest.approx(0.4 + 0.95 + 0.25)
    assert (p["dispatch_rollout_s"], p["dispatch_score_s"], p["dispatch_train_s"]) == \
        pytest.approx((0.1, 0.05, 0.05))
    rest = sum(p[k] for k in ("compute_s", "sync_s", "checkpoint_s", "dispatch_rollout_s",
                              "dispatch_score_s", "dispatch_train_s", "between_stages_s"))
    assert rest == pytest.approx(p["step_s"])


def test_the_plain_loop_trains_the_same_model_class() -> None:
    """Two steps of the plain loop: every phase timed each step, and the weights move."""
    from bench import plain_loop
    from executors.model import build_policy
    from placer.spec.catalog import shipped_models
    arch = shipped_models()["tiny-llama"]
    start = build_policy(arch, 0).state_dict()
    run = plain_loop.run(arch, 0, prompts=2, samples_per_prompt=2, prompt_len=6, max_new=4,
                         steps=2, lr=1e-2)
    assert len(run.step_s) == 2
    assert set(run.phase_s) == {"generate", "reference and old log-probs", "train"}
    assert all(len(v) == 2 for v in run.phase_s.values())
    assert run.model is not None
    end = run.model.state_dict()
    assert max(float((end[k] - start[k]).abs().max()) for k in start) > 1e-4


def test_the_plain_loops_micro_batches_sum_to_the_mini_batchs_gradient() -> None:
    """One step in two micro-batches trains the weights one batch does (each micro-batch's loss
    is scaled by the mini-batch's tokens); in BF16 autocast the weights still move, and stay
    close to FP32's (within what BF16's rounding of the forward allows)."""
    from bench import plain_loop
    from placer.spec.catalog import shipped_models
    arch = shipped_models()["tiny-llama"]
    kw = dict(prompts=2, samples_per_prompt=2, prompt_len=6, max_new=4, steps=1, lr=1e-3)
    one = plain_loop.run(arch, 0, **kw).model.state_dict()  # type: ignore[union-attr]
    two = plain_loop.run(arch, 0, micro_batches=2, **kw).model.state_dict()  # type: ignore[union-attr]
    assert max(float((one[k] - two[k]).abs().max()) for k in one) < 1e-5  # 1% of a step
    bf = plain_loop.run(arch, 0, bf16=True, **kw).model.state_dict()  # type: ignore[union-attr]
    assert all(v.dtype == one[k].dtype for k, v in bf.items())  # FP32 master weights
    assert max(float((one[k] - bf[k]).abs().max()) for k in one) <= 2.5e-3  # 2 x lr at most
