"""The policy-gradient objective (executors.rl, OFF_POLICY): the PPO clip acts once the policy
has moved from the proximal one, and truncated importance weights down-weight tokens that a
stale (or numerically different) rollout policy sampled, capped at TIS_CAP."""
from __future__ import annotations

import pytest
import torch

from executors import rl


def loss_grad(logp0: torch.Tensor, old: torch.Tensor, adv: torch.Tensor,
              behaviour: torch.Tensor | None) -> tuple[torch.Tensor, dict]:
    logp = logp0.clone().requires_grad_(True)
    loss, info = rl.policy_loss(logp, old, adv, torch.ones_like(adv), None, 0.0,
                                behaviour=behaviour)
    loss.backward()
    assert logp.grad is not None
    return logp.grad, info


def test_clip_stops_the_gradient_outside_the_trust_region() -> None:
    old = torch.zeros(1, 4)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    # ratios 1.5 (pos adv: clipped), 1.1 (inside), 0.5 (neg adv: clipped), 0.9 (inside)
    logp = torch.log(torch.tensor([[1.5, 1.1, 0.5, 0.9]]))
    g, info = loss_grad(logp, old, adv, None)
    assert g[0, 0] == 0 and g[0, 2] == 0  # clipped: no push further out
    assert g[0, 1] < 0 and g[0, 3] > 0  # inside: the usual ratio * advantage gradient
    assert info["clip_frac"] == 0.5
    # at the proximal weights (ratio 1) nothing is clipped
    _, info = loss_grad(old.clone(), old, adv, None)
    assert info["clip_frac"] == 0.0


def test_truncated_importance_weights_stale_samples() -> None:
    old = torch.zeros(1, 3)
    adv = torch.ones(1, 3)
    fresh, _ = loss_grad(old, old, adv, behaviour=old)  # rollout == trainer: weight 1
    # token 0: the behaviour policy gave it more mass than the proximal one (a stale sample the
    # policy has moved away from): weight exp(-1); token 1: less mass, weight e^0.5 = 1.65;
    # token 2: far less, weight e^3 truncated to TIS_CAP
    behaviour = torch.tensor([[1.0, -0.5, -3.0]])
    stale, info = loss_grad(old, old, adv, behaviour=behaviour)
    w = stale / fresh
    torch.testing.assert_close(w, torch.tensor([[torch.e ** -1, torch.e ** 0.5, rl.TIS_CAP]]))
    assert abs(info["tis_truncated"] - 1 / 3) < 1e-6
    torch.testing.assert_close(rl.tis_weights(old, behaviour), w)


def test_behaviour_log_probs_are_the_old_policy_when_fresh() -> None:
    """Fresh samples with agreeing numerics: weighting by behaviour changes nothing."""
    logp = torch.log(torch.tensor([[0.3, 0.6]]))
    old = torch.log(torch.tensor([[0.25, 0.5]]))
    adv = torch.tensor([[0.7, -0.2]])
    a, _ = loss_grad(logp, old, adv, behaviour=old)
    b, _ = loss_grad(logp, old, adv, behaviour=None)
    torch.testing.assert_close(a, b)


def test_mini_batches_cover_every_sample_once() -> None:
    for n, k in [(8, 3), (2, 4), (5, 1)]:
        parts = rl.mini_batches(n, k)
        assert len(parts) == min(n, k) and sorted(i for p in parts for i in p) == list(range(n))


def test_trainer_weights_samples_by_their_behaviour_log_probs(tmp_path) -> None:
    """In the trainer: behaviour log-probs equal to its own give the plain PPO step; a stale
    sampler (much less mass on its tokens) is truncated at TIS_CAP on every token."""
    from executors.model import build_policy, load_policy, save_model_dir
    from executors.roles import RunConfig
    from executors.sharding import Layout
    from executors.trainer import Trainer
    from executors.training import partition
    from placer.spec.catalog import shipped_models

    arch = shipped_models()["tiny-llama"]
    path = save_model_dir(build_policy(arch, 5), arch, tmp_path / "m")
    prompts, resps = [[1, 10, 11], [1, 12, 13, 14]], [[20, 21, 2], [22, 2]]
    own = rl.response_logprobs(load_policy(path), rl.Samples(["a", "b"], prompts, resps,
                                                             [[], []], 0))
    own_rows = [own[i, :len(r)].tolist() for i, r in enumerate(resps)]
    adv = [[1.0] * 3, [-1.0] * 2]

    def step(behaviour: list[list[float]]) -> tuple[dict, dict]:
        cfg = RunConfig(algorithm="grpo", arch=arch.model_dump(), model_dir=str(path), seed=0,
                        max_new_tokens=4, lr=1e-3)
        tr = Trainer(cfg)
        s = rl.Samples(["a", "b"], prompts, resps, behaviour, 0, ["g", "g"])
        info, _ = tr.train(partition(s, adv, None, Layout(), 1, 1)[0])
        return info, tr.weights()

    fresh, w_fresh = step(own_rows)
    plain, w_plain = step([])  # no behaviour log-probs: weight 1
    assert fresh["tis_truncated"] == 0.0
    for k in w_plain:
        torch.testing.assert_close(w_fresh[k], w_plain[k], atol=1e-6, rtol=1e-5)
    stale, _ = step([[x - 3.0 for x in row] for row in own_rows])
    assert stale["tis_truncated"] == pytest.approx(1.0)
