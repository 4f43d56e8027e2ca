"""The job's RL objective terms: where the KL penalty to the reference enters (`kl`) and the
sampling temperature (`sampling`).

KL. Frameworks put the reference KL in one of two places, never both:
  reward  a per-token penalty -coef * KL_t added to the reward before the advantages (PPO's
          classic form: OpenRLHF by default, verl with `algorithm.use_kl_in_reward`);
  loss    a term coef * KL_t added to the policy loss (GRPO's form: verl with
          `actor_rollout_ref.actor.use_kl_loss`, OpenRLHF with `--algo.kl.use_loss`).
The estimator of KL_t from the sampled token (Schulman, "Approximating KL divergence", 2020,
http://joschu.net/blog/kl-approx.html), with d = log pi - log ref:
  k1  d                        (unbiased, can be negative)
  k2  d^2 / 2                  (its gradient is the gradient of KL)
  k3  exp(-d) - 1 + d          (unbiased, non-negative, low variance)
Defaults of the frameworks (as of the commits below):
  verl      volcengine/verl@b178a3cd, verl/trainer/config/ppo_trainer.yaml: `use_kl_in_reward:
            False`, `kl_penalty: kl` (k1), `kl_ctrl.kl_coef: 0.001`;
            verl/trainer/config/actor/actor.yaml: `use_kl_loss: false`, `kl_loss_coef: 0.001`,
            `kl_loss_type: low_var_kl` (k3); estimators in verl/trainer/ppo/core_algos.py
            `kl_penalty_forward`. Both off unless asked; GRPO recipes turn on the loss form.
  OpenRLHF  OpenRLHF/OpenRLHF@3c3be623, openrlhf/cli/train_ppo_ray.py: `--algo.kl.init_coef`
            0.01, `--algo.kl.use_loss` off (KL in the reward), `--algo.kl.estimator` k1 (the
            CLI recommends k2 or k3 as a loss); estimators in openrlhf/models/utils.py
            `compute_approx_kl`.
This project's default: the loss form with k3 (verl's GRPO form) at coef 0 (off, as both
frameworks' defaults leave KL off, verl's entirely); a job sets `coef` to turn it on.

Temperature. The rollout samples from softmax(logits / T); the trainer's old, reference and new
log-probs divide the logits by the same T (verl's `logits.div_(temperature)` in
verl/workers/actor/dp_actor.py; OpenRLHF's `log_probs_from_logits(..., temperature)`), so
the ratio and the KL compare the distribution the tokens were drawn from.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from placer.spec.base import Strict

KLPlace = Literal["reward", "loss"]
KLEstimator = Literal["k1", "k2", "k3"]


class KL(Strict):
    """The KL penalty to the reference model: its coefficient, where it enters, its estimator."""

    # `in` is a Python keyword: the field is `where`, read and written as `in` only
    model_config = ConfigDict(**Strict.model_config, validate_by_alias=True,
                              validate_by_name=False, serialize_by_alias=True)

    coef: Annotated[float, Field(strict=True, ge=0, le=1e3)] = Field(
        0.0, description="KL coefficient (0: no KL term; verl 0.001, OpenRLHF 0.01)")
    where: KLPlace = Field(
        "loss", alias="in",
        description="reward: a per-token penalty in the reward (OpenRLHF's default, verl "
                    "use_kl_in_reward); loss: a term of the policy loss (verl use_kl_loss, "
                    "OpenRLHF --algo.kl.use_loss); never both")
    estimator: KLEstimator = Field(
        "k3", description="k1: log pi - log ref; k2: its square / 2; k3: exp(-d) - 1 + d "
                          "(verl kl_loss_type low_var_kl; OpenRLHF --algo.kl.estimator)")


class Sampling(Strict):
    """How the rollout samples tokens."""

    temperature: Annotated[float, Field(strict=True, gt=0, le=100)] = Field(
        1.0, description="softmax temperature of the rollout; the trainer's old, reference and "
                         "new log-probs divide the logits by it too (as verl does)")
