"""The RL objective's KL and temperature (executors.rl, executors.training, executors.trainer):
the job's KL to the reference is counted once, in the reward or in the loss, with the job's
estimator; the trainer's log-probs use the rollout's temperature. One process, no Ray. (Bad
`kl` and `sampling` values: tests/bad_jobs, tests/test_bad_input.py.)"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from executors import rl
from executors.roles import RunConfig
from placer.base.roles import Role

PROMPTS = [[1, 10, 11], [1, 12, 13, 14]]
RESPS = [[20, 21, 2], [22, 2]]
COEF = 0.5


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    from executors.model import build_policy, save_model_dir
    from placer.spec.catalog import shipped_models
    arch = shipped_models()["tiny-llama"]
    return arch, save_model_dir(build_policy(arch, 5), arch, tmp_path_factory.mktemp("m") / "m")


def _cfg(policy: tuple[Any, Path], **kw: Any) -> RunConfig:
    arch, path = policy
    return RunConfig(algorithm="ppo", arch=arch.model_dump(), model_dir=str(path), seed=0,
                     max_new_tokens=4, lr=1e-3, **kw)


def _rows(x: torch.Tensor) -> list[list[float]]:
    return [x[i, :len(r)].tolist() for i, r in enumerate(RESPS)]


def _kl_terms(cfg: RunConfig) -> dict[str, Any]:
    """Where the reference enters a PPO step of `cfg`: the critic's returns (the reward path,
    `Training.advantages`) and the trainer's micro-batch loss (`Trainer._micro_loss`), each
    with the reference and with a reference equal to the sampled log-probs (KL 0)."""
    from executors.trainer import Trainer
    from executors.training import Training
    tr = Trainer(cfg)
    s0 = rl.Samples(["a", "b"], PROMPTS, RESPS, [[], []], 0, ["g", "g"])
    own = tr._logprobs(s0)  # the policy's own log-probs: behaviour == old, a fresh sample
    s = dataclasses.replace(s0, logprobs=_rows(own))
    ref = _rows(own - torch.tensor([[0.3, -0.2, 0.4], [0.1, -0.5, 0.0]]))
    training = Training(SimpleNamespace(cfg=cfg), None)  # type: ignore[arg-type]

    def scored(r: list[list[float]]) -> dict[str, Any]:
        return {Role.REWARD: [1.0, 0.0], Role.REFERENCE: r,
                Role.CRITIC: [[0.0] * len(x) for x in RESPS]}
    returns = {k: training.advantages(s, scored(r))[1]["returns"]
               for k, r in (("ref", ref), ("none", s.logprobs))}
    adv = [[1.0] * len(r) for r in RESPS]
    loss = {k: float(tr._micro_loss(s, adv, r, own)[0].detach())
            for k, r in (("ref", ref), ("none", s.logprobs))}
    return {"own": own, "ref": ref, "returns": returns, "loss": loss}


def _counted(t: dict[str, Any]) -> int:
    in_reward = t["returns"]["ref"] != t["returns"]["none"]
    in_loss = t["loss"]["ref"] != t["loss"]["none"]
    return int(in_reward) + int(in_loss)


def test_ppo_with_a_reference_counts_kl_once(policy) -> None:
    """A PPO step with a reference and a KL coefficient: the reference moves the reward or the
    loss, not both (the executor once added k1 to the reward and k3 to the loss)."""
    t = _kl_terms(_cfg(policy, kl_coef=COEF))
    assert _counted(t) == 1


def test_kl_in_the_loss_is_exactly_one_k3_term(policy) -> None:
    """`kl: {in: loss, estimator: k3}`: the returns ignore the reference, and the loss gains
    coef * sum_t k3_t, k3 = exp(ref - logp) - (ref - logp) - 1, computed here by hand."""
    t = _kl_terms(_cfg(policy, kl_coef=COEF, kl_in="loss", kl_estimator="k3"))
    assert t["returns"]["ref"] == t["returns"]["none"]
    own = t["own"]
    k3 = sum(math.exp(r - lp) - (r - lp) - 1 for i, row in enumerate(t["ref"])
             for r, lp in zip(row, own[i, :len(row)].tolist()))
    assert t["loss"]["ref"] - t["loss"]["none"] == pytest.approx(COEF * k3, rel=1e-4)


def test_kl_in_the_reward_is_exactly_one_k1_penalty(policy) -> None:
    """`kl: {in: reward, estimator: k1}`: the loss ignores the reference, and the returns
    (values 0, GAE with gamma 1 and lambda 0.95) move by the lambda-discounted sum of the
    per-token penalties -coef * (logp - ref), computed here by hand."""
    t = _kl_terms(_cfg(policy, kl_coef=COEF, kl_in="reward", kl_estimator="k1"))
    assert t["loss"]["ref"] == t["loss"]["none"]
    own = t["own"]
    for i, row in enumerate(t["ref"]):
        pen = [-COEF * (lp - r) for r, lp in zip(row, own[i, :len(row)].tolist())]
        want = [sum(0.95 ** (k - j) * pen[k] for k in range(j, len(pen)))
                for j in range(len(pen))]
        got = [a - b for a, b in zip(t["returns"]["ref"][i], t["returns"]["none"][i])]
        assert got == pytest.approx(want, abs=1e-5)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_estimators(estimator: str) -> None:
    """Schulman's estimators at d = logp - ref (placer/spec/rlterms.py), by hand."""
    logp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    d = [0.5, -1.0]
    want = {"k1": d, "k2": [x * x / 2 for x in d],
            "k3": [math.exp(-x) - 1 + x for x in d]}[estimator]
    assert rl.kl_estimate(logp, ref, estimator).tolist() == pytest.approx(want)


def test_grpo_puts_a_reward_kl_into_the_group_baseline(policy) -> None:
    """GRPO with the KL in the reward: each sample's reward loses coef * its summed k1 before
    the group normalisation; with the KL in the loss the advantages ignore the reference."""
    from executors.training import Training
    s = rl.Samples(["a", "b"], PROMPTS, RESPS, [[-1.0, -1.0, -1.0], [-1.0, -1.0]], 0,
                   ["g", "g"])
    ref = [[-1.5, -1.0, -1.0], [-1.0, -1.0]]  # sample a: k1 = +0.5 on its first token
    scored = {Role.REWARD: [1.0, 1.0], Role.REFERENCE: ref}
    cfg = _cfg(policy, kl_coef=COEF, kl_in="reward", kl_estimator="k1")
    cfg = dataclasses.replace(cfg, algorithm="grpo")
    adv, _ = Training(SimpleNamespace(cfg=cfg), None).advantages(s, scored)  # type: ignore[arg-type]
    want = rl.grpo_advantages([1.0 - COEF * 0.5, 1.0], ["g", "g"])
    assert [a[0] for a in adv] == pytest.approx(want)
    in_loss = dataclasses.replace(cfg, kl_in="loss")
    adv, _ = Training(SimpleNamespace(cfg=in_loss), None).advantages(s, scored)  # type: ignore[arg-type]
    assert [a[0] for a in adv] == pytest.approx(rl.grpo_advantages([1.0, 1.0], ["g", "g"]))


def test_trainer_log_probs_use_the_rollout_temperature(policy) -> None:
    """The trainer's (old and new) and the reference's log-probs are those of softmax(logits /
    T), the distribution the rollout sampled from: computed here from the raw logits."""
    from executors.model import load_policy
    from executors.modelroles import Reference
    from executors.trainer import Trainer
    temp = 0.7
    cfg = _cfg(policy, temperature=temp)
    s = rl.Samples(["a", "b"], PROMPTS, RESPS, [[], []], 0, ["g", "g"])
    ids, mask, rmask = rl.pack(s)
    with torch.no_grad():
        logits = load_policy(cfg.model_dir)(input_ids=ids, attention_mask=mask,
                                            position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
    w = rmask.shape[1]
    want = torch.log_softmax(logits[:, -w - 1:-1] / temp, -1).gather(
        -1, ids[:, -w:, None]).squeeze(-1) * rmask
    torch.testing.assert_close(Trainer(cfg)._logprobs(s), want, atol=1e-5, rtol=1e-5)
    got, _ = Reference(cfg).logprobs(s)
    torch.testing.assert_close(rl.to_padded(got, w), want, atol=1e-5, rtol=1e-5)
    at_one = torch.log_softmax(logits[:, -w - 1:-1], -1).gather(
        -1, ids[:, -w:, None]).squeeze(-1) * rmask
    assert not torch.allclose(want, at_one, atol=1e-3)  # the temperature changes them


def test_rollout_samples_at_the_temperature_it_reports(policy) -> None:
    """The torch rollout's behaviour log-probs at temperature T are the trainer's at T for the
    same tokens: a fresh sample's importance weight is 1."""
    from executors.modelroles import Rollout
    from executors.trainer import Trainer
    cfg = _cfg(policy, temperature=0.6)
    s, _ = Rollout(cfg).generate(["a", "b"], ["g", "g"], PROMPTS, [3, 4])
    got = Trainer(cfg)._logprobs(s)
    w = got.shape[1]
    torch.testing.assert_close(got, rl.to_padded(s.logprobs, w), atol=1e-5, rtol=1e-5)


def test_job_kl_and_temperature_reach_the_workers() -> None:
    """The job's `kl` and `sampling` go through the run plan to every worker's config."""
    from exec_util import GRPO_LAYOUT, hand_plan, job_dict

    from executors.roles import run_config
    from executors.runplan import resolve_plan
    job = job_dict(kl={"coef": 0.01, "in": "reward", "estimator": "k1"},
                   sampling={"temperature": 0.8})
    cfg = run_config(resolve_plan(hand_plan(GRPO_LAYOUT, job)))
    assert (cfg.kl_coef, cfg.kl_in, cfg.kl_estimator, cfg.temperature) == (0.01, "reward",
                                                                           "k1", 0.8)
    assert cfg.kl.loss_coef == 0.0
