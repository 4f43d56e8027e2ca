"""Sequence-packed micro-batches padded under pipeline parallelism (`placer.cost.packing`):
NeMo-RL's Modified First-Fit Decreasing bins, dealt round-robin over the data-parallel ranks,
each rank's bins padded to its longest when the trainer is pipelined."""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from placer.base.roles import Role
from placer.cost.packing import dealt_bins, mffd_bins, pad_factor, pass_pad
from placer.cost.sharding import Parallel
from placer.spec.catalog import resolve
from placer.spec.distributions import Distribution
from placer.spec.load import job_from_dict

CAP = 8192


def test_mffd_places_every_item_once_within_capacity() -> None:
    lengths = [8192, 6000, 5000, 4000, 3000, 3000, 2500, 2000, 1500, 1000, 700, 300, 64]
    bins = mffd_bins(lengths, CAP)
    assert Counter(s for b in bins for s in b) == Counter(lengths)
    assert all(sum(b) <= CAP for b in bins)
    assert len(bins) >= -(-sum(lengths) // CAP)


def test_mffd_phases_by_hand() -> None:
    # two large items each take one medium one (phase 2): two full bins
    assert sorted(map(sum, mffd_bins([5000, 5000, 3000, 3000], CAP))) == [8000, 8000]
    # a large item, then the greedy fill takes the largest leftover that fits (2000) and the
    # rest (1000) no longer fits: MFFD's last phase opens a bin for it
    assert sorted(map(sum, mffd_bins([6000, 2000, 1000], CAP))) == [1000, 8000]


def test_bins_raised_to_the_ranks_and_dealt_round_robin() -> None:
    ranks = dealt_bins([[4000, 3000], [2000]], 4)  # 2 bins, 4 ranks: one item moved out
    assert sorted(len(r) for r in ranks) == [0, 1, 1, 1]  # 3 sequences cannot fill 4 bins
    ranks = dealt_bins([[1000, 1000], [1000, 1000], [500]], 2)  # 3 bins -> 4 (a multiple)
    assert [len(r) for r in ranks] == [2, 2]
    assert sum(sum(r) for r in ranks) == 4500


def test_pad_factor_by_hand_and_off_without_pipeline() -> None:
    fixed = Distribution(kind="fixed", value=6000)
    # every sequence alone in its bin, all the same length: nothing to pad
    assert pad_factor(128, fixed, 1, 64, 4, 4, CAP) == pytest.approx(1.0)
    skewed = Distribution(kind="lognormal", median=6000, sigma=1.0, cap=8064)
    assert pad_factor(128, skewed, 1, 512, 8, 1, CAP) == 1.0  # pp 1: bins are not padded
    assert pad_factor(128, skewed, 1, 512, 8, 4, 0) == 1.0  # no budget: nothing packed
    assert pad_factor(128, skewed, 1, 512, 8, 4, CAP) >= 1.0


def _job(pp: int, framework: str) -> dict:
    return {
        "name": "pack", "algorithm": "grpo", "framework": framework,
        "models": {"policy": "Qwen3-30B-A3B", "reward": "rule"},
        "batch": {"prompts": 8, "samples_per_prompt": 8},
        "lengths": {"prompt": {"kind": "fixed", "value": 128},
                    "response": {"kind": "lognormal", "median": 2000, "sigma": 1.2,
                                 "cap": 3968}},
        "micro_token_budget": {"forward": 4096, "update": 4096},
        "cluster": {"pools": [{"name": "g", "device": "H100-SXM", "devices_per_node": 8,
                               "nodes": 2}]}}


def test_pass_pad_only_where_the_framework_pads_a_pipelined_pass() -> None:
    nemo = resolve(job_from_dict(_job(2, "nemo-rl"), "pack"), "pack")
    verl = resolve(job_from_dict(_job(2, "verl"), "pack"), "pack")
    par = Parallel(pp=2, dp=4, micro_token_budget=4096)
    lengths = nemo.job.lengths
    expected = pad_factor(lengths.prompt.mean_value(), lengths.response, 1, 64, 4, 2, 4096)
    assert expected > 1.0  # sequences of ~2k in 4k bins: some bins half full, padded
    assert pass_pad(nemo, par, "forward") == pytest.approx(expected)
    assert pass_pad(verl, par, "forward") == 1.0
    assert pass_pad(nemo, replace(par, pp=1), "forward") == 1.0
    assert nemo.job.profile.pads_packed_bins and not verl.job.profile.pads_packed_bins


def test_the_trainers_passes_grow_by_the_pad(monkeypatch: pytest.MonkeyPatch) -> None:
    import placer.cost.estimate as estimate_mod
    from placer.cost.efficiency import Calibration
    from placer.cost.pricer import Pricer

    res = resolve(job_from_dict(_job(2, "nemo-rl"), "pack"), "pack")
    pool = res.cluster.pool("g")
    par = Parallel(pp=2, dp=4, ep=8)
    padded = Pricer(res, Calibration()).estimate(Role.ACTOR, pool, par)
    monkeypatch.setattr(estimate_mod, "pass_pad", lambda *_: 1.0)
    flat = Pricer(res, Calibration()).estimate(Role.ACTOR, pool, par)
    assert padded.stage_s["score"] > flat.stage_s["score"]
    assert padded.stage_s["train"] > flat.stage_s["train"]


def test_the_simulator_pads_the_samples_it_trains() -> None:
    from placer.cost.packing import lengths_pad, samples_pad

    res = resolve(job_from_dict(_job(2, "nemo-rl"), "pack"), "pack")
    par = Parallel(pp=2, dp=4, micro_token_budget=4096)
    lengths = [4096, 300, 2100, 2000, 900, 4000, 1200, 3500] * 8
    assert samples_pad(res, par, lengths, "forward") == pytest.approx(
        lengths_pad(lengths, 4, 4096))
    assert samples_pad(res, par, lengths, "forward") > 1.0
    assert samples_pad(res, replace(par, pp=1), lengths, "forward") == 1.0
    verl = resolve(job_from_dict(_job(2, "verl"), "pack"), "pack")
    assert samples_pad(verl, par, lengths, "update") == 1.0
