"""Goodput over long runs (`simulator.longrun`, `placer goodput`): the exact renewal-reward formula,
its Monte Carlo and the simulator's step-by-step walk agree; goodput falls as MTBF falls; the best
checkpoint interval is within 20% of Young/Daly where its assumptions hold; seeded."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from simplans import small_plan

from placer.cli import main
from placer.solve.planfile import save_plan
from simulator import longrun as lr
from simulator.config import Failures
from simulator.faults import compose

# 10 s steps with a little spread: short against any interval Young/Daly would pick here
STEPS = [9.0, 10.0, 10.5, 11.0, 9.5]
COSTS = lr.Costs(restart_s=120.0, checkpoint_s=30.0)


def _rate(job_mtbf_h: float) -> float:
    return 1 / (job_mtbf_h * 3600)


def test_goodput_falls_as_mtbf_falls() -> None:
    goods, mcs = [], []
    for mtbf_h in (100.0, 10.0, 2.0, 0.5):
        rate = _rate(mtbf_h)
        k = lr.best_interval(STEPS, rate, COSTS)
        goods.append(lr.expected(STEPS, k, rate, COSTS, 5000).goodput)
        mcs.append(lr.monte_carlo(STEPS, k, rate, COSTS, 5000, trials=20, seed=1).goodput)
    assert goods == sorted(goods, reverse=True) and goods[0] - goods[-1] > 0.1
    assert mcs == sorted(mcs, reverse=True)
    assert lr.expected(STEPS, 10, 0.0, COSTS, 100).goodput == pytest.approx(
        10 * np.mean(STEPS) / (10 * np.mean(STEPS) + 30))  # no failures: only checkpoints cost


@pytest.mark.parametrize("mtbf_h,ckpt_s", [(24.0, 30.0), (8.0, 60.0), (2.0, 10.0)])
def test_best_interval_near_young_daly(mtbf_h: float, ckpt_s: float) -> None:
    """C << MTBF and steps short against the interval: the formula's assumptions hold."""
    rate, costs = _rate(mtbf_h), lr.Costs(restart_s=300.0, checkpoint_s=ckpt_s)
    best_s = lr.best_interval(STEPS, rate, costs) * np.mean(STEPS)
    yd = lr.young_daly_s(rate, ckpt_s)
    assert abs(best_s - yd) <= 0.2 * yd, (best_s, yd)
    # and it is the best: goodput at half and twice the interval is lower
    k = lr.best_interval(STEPS, rate, costs)
    g = {m: lr.expected(STEPS, max(1, round(k * m)), rate, costs, 10_000).goodput
         for m in (0.5, 1, 2)}
    assert g[1] > g[0.5] and g[1] > g[2]


def test_young_daly_breaks_down_when_checkpoints_are_costly() -> None:
    """C comparable to MTBF: the first-order formula overestimates the best interval."""
    rate, costs = _rate(0.25), lr.Costs(restart_s=0.0, checkpoint_s=600.0)
    best_s = lr.best_interval(STEPS, rate, costs) * np.mean(STEPS)
    assert best_s < 0.8 * lr.young_daly_s(rate, 600.0)


def test_monte_carlo_matches_formula_and_the_simulator_walk() -> None:
    rate, every, steps = _rate(1.0), 20, 400
    exact = lr.expected(STEPS, every, rate, COSTS, steps)
    mc = lr.monte_carlo(STEPS, every, rate, COSTS, steps, trials=400, seed=3)
    assert mc.mean_s == pytest.approx(exact.expected_s, rel=0.03)
    # simulator.faults.compose walks steps one by one with the same failure model; its mean
    # over seeds, for fixed step times, is the formula with that (degenerate) distribution
    durs = [STEPS[i % len(STEPS)] for i in range(steps)]
    cfg = Failures(restart_s=COSTS.restart_s, checkpoint_every=every,
                   checkpoint_s=COSTS.checkpoint_s)
    walls = [compose(durs, rate, cfg, seed, COSTS.checkpoint_s).wall_s for seed in range(300)]
    fixed = sum(math.expm1(rate * (sum(durs[j:j + every]) + COSTS.checkpoint_s))
                * (1 / rate + COSTS.restart_s) for j in range(0, steps, every))
    assert np.mean(walls) == pytest.approx(fixed, rel=0.03)


def test_seeded() -> None:
    a = lr.monte_carlo(STEPS, 30, _rate(2.0), COSTS, 2000, trials=10, seed=7)
    b = lr.monte_carlo(STEPS, 30, _rate(2.0), COSTS, 2000, trials=10, seed=7)
    c = lr.monte_carlo(STEPS, 30, _rate(2.0), COSTS, 2000, trials=10, seed=8)
    assert a == b and a != c


def test_per_gpu_mtbf_from_failure_facts() -> None:
    facts = lr.FAILURE_FACTS
    assert facts["Meta HPCA'25, 1,024-GPU jobs, job MTTF 7.9 h"] == pytest.approx(8089.6)
    assert all(5_000 < v < 60_000 for v in facts.values())


def test_goodput_cli(tmp_path, capsys) -> None:
    path = tmp_path / "plan.json"
    save_plan(small_plan(), path)
    docs = []
    for mtbf in ("gpu:50000", "gpu:500"):
        rc = main(["goodput", str(path), "--mtbf", mtbf, "--hours", "48", "--iterations", "2",
                   "--trials", "20", "--json"])
        assert rc == 0
        docs.append(json.loads(capsys.readouterr().out))  # stdout is one JSON document
    hi, lo = (d["intervals"]["best"] for d in docs)
    assert hi["goodput"] > lo["goodput"] and hi["expected_s"] < lo["expected_s"]
    assert docs[0]["steps"] == docs[1]["steps"] > 0
    assert main(["goodput", str(path), "--iterations", "1", "--trials", "5"]) == 0
    out = capsys.readouterr().out
    assert "young_daly" in out and "best" in out


@pytest.mark.parametrize("argv,needle", [
    (["--mtbf", "gpu"], "--mtbf"), (["--mtbf", "gpu:-3"], "--mtbf"),
    (["--mtbf", "tpu:100"], "no device of that type"),
    (["--checkpoint-cost", "-1"], "checkpoint_s"), (["--hours", "0"], "--hours"),
    (["--checkpoint-interval", "0"], "--checkpoint-interval"), (["--trials", "0"], "--trials"),
])
def test_goodput_bad_input(tmp_path, capsys, argv, needle) -> None:
    path = tmp_path / "plan.json"
    save_plan(small_plan(), path)
    assert main(["goodput", str(path), "--iterations", "1", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
