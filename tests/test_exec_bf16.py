"""BF16 mixed precision in the trainer (`executors.precision`): autocast compute over FP32
master weights, FSDP2 gathering BF16 parameters and reducing FP32 gradients. On gloo, dp 2 x
tp 2 and pp 2 in bf16 take the same optimizer step as one process in bf16 within BF16's rounding; the
master weights and Adam's state stay FP32; bf16 differs from fp32 (the format is really used);
fp32 stays exact (tests/test_exec_sharding.py). The PPO critic trains, and the torch rollout
engine generates, and the reference scores, in the same precision.

Measured (tiny-llama, 8 samples, 2 mini-batches, lr 1e-3; `python -m pytest -q -s
tests/test_exec_bf16.py`): the summed |weight difference| from one process in bf16 is 0.92%
(dp 2 x tp 2) and 0.90% (pp 2) of the step's summed move; fp32 against bf16 in one process
differs by 0.77%. The critic in bf16 against fp32, three steps: 0.60% of the summed move. The
reference's log-probs in bf16 against fp32 (8 samples): 1.5e-3 at most, 5.8e-4 on average.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from test_exec_sharding import ARCH, batch, config, distributed, one_process

from executors.model import build_policy, load_policy, save_model_dir
from executors.precision import autocast, fsdp_policy, of_job
from executors.sharding import Layout
from executors.trainer import Trainer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_model_dir(build_policy(ARCH, 3), ARCH, tmp_path_factory.mktemp("m") / "v0")


def test_bf16_computes_in_bf16_over_fp32_masters(model_dir: Path) -> None:
    tr = Trainer(config(model_dir, precision="bf16"))
    ids = torch.tensor([[5, 9, 14, 3, 7, 11]])
    with autocast("bf16"):
        logits = tr.model(input_ids=ids).logits
    assert logits.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in tr.model.parameters())
    assert fsdp_policy("fp32") is None and fsdp_policy("bf16").param_dtype == torch.bfloat16
    assert fsdp_policy("bf16").reduce_dtype == torch.float32
    assert of_job("bf16") == of_job("fp8") == "bf16"


def bf16_step_against_one_process(cfg: Any, tmp_path: Path, model_dir: Path, label: str
                                  ) -> tuple[list[Any], dict[str, Any]]:
    """One BF16 step distributed (`cfg`) against the same step in one process in BF16: the
    summed |difference| from the one-process weights over the step's summed move, under 3%
    (Adam moves a weight ~lr whatever its gradient's size, so a near-zero gradient whose BF16
    rounding flips its sign moves that weight ~2 lr the other way: the largest difference is
    ~2 lr in any BF16 comparison, fp32 against bf16 too. BF16 rounding alone leaves ~1% of the
    move; a wrong reduction all of it); FP32 masters; gradient norms within BF16's 3
    significant digits. The ranks' outputs and the one process's figures."""
    want, info = one_process(cfg)
    fp32, _ = one_process(dataclasses.replace(cfg, precision="fp32"))
    got, ranks = distributed(cfg, tmp_path)
    start = load_policy(model_dir).state_dict()
    moved = sum(float((want[k] - start[k]).abs().sum()) for k in want)

    def rel(a: dict[str, torch.Tensor]) -> float:
        return sum(float((a[k] - want[k]).abs().sum()) for k in want) / moved
    print(f"bf16 {label} vs one process in bf16: {rel(got):.2%} of the step's move; "
          f"one process fp32 vs bf16: {rel(fp32):.2%}")
    assert all(v.dtype == torch.float32 for v in got.values())  # FP32 masters
    assert rel(got) < 0.03 and rel(fp32) > 0
    for r in ranks:
        assert r[1]["grad_norms"] == pytest.approx(info["grad_norms"], rel=2e-2)
    return ranks, info


@pytest.mark.parametrize("layout,accumulate", [((2, 2, 1), 1), ((1, 1, 2), 2)],
                         ids=["dp2xtp2", "pp2"])
def test_bf16_step_matches_one_process_in_bf16(layout: tuple[int, int, int], accumulate: int,
                                               model_dir: Path, tmp_path: Path) -> None:
    """pp 2: BF16 activations cross the stage boundary (FSDP2's BF16 parameters)."""
    cfg = config(model_dir, trainer=Layout(*layout), mini_batches=2, precision="bf16",
                 accumulate=accumulate)
    ranks, info = bf16_step_against_one_process(cfg, tmp_path, model_dir, str(layout))
    lay = Layout(*layout)
    leaders = [r for r in ranks if lay.leads(r[0])]
    assert abs(sum(r[1]["loss"] for r in leaders) - info["loss"]) < 1e-2


def _critic_steps(cfg, steps: int) -> tuple[dict[str, torch.Tensor], list[float], list[float]]:
    """A critic trained `steps` times on one batch toward fixed returns: its weights, losses
    and the values it then gives."""
    import random

    from executors.modelroles import Critic
    s, _ = batch(2)
    rng = random.Random(4)
    returns = [[rng.uniform(-1, 1) for _ in r] for r in s.responses]
    critic = Critic(cfg)
    losses = []
    for _ in range(steps):
        old, _ = critic.values(s)
        losses.append(critic.train(s, returns, old)[0]["value_loss"])
    values, _ = critic.values(s)
    return ({k: v.detach().clone() for k, v in critic.model.state_dict().items()}, losses,
            [x for row in values for x in row])


def test_a_bf16_critic_matches_fp32_within_bf16(model_dir: Path) -> None:
    """The critic trains in the job's precision as the actor does: under bf16 its forward runs
    in BF16 over FP32 weights and Adam; three steps land within BF16's rounding of FP32's (the
    summed weight difference a few % of the summed move, losses and values to ~1e-2), and
    differ from it (the format is really used)."""
    from executors.modelroles import Critic
    cfg = dataclasses.replace(config(model_dir, critic_lr=1e-3), algorithm="ppo")
    critic = Critic(dataclasses.replace(cfg, precision="bf16"))
    s, _ = batch(2)
    assert critic._values(s)[0].dtype == torch.float32  # handed on in FP32 (with its mask)
    with autocast("bf16"):
        assert critic.model(torch.tensor([[5, 9, 14]]), torch.ones(1, 3)).dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in critic.model.parameters())
    w32, l32, v32 = _critic_steps(dataclasses.replace(cfg, precision="fp32"), 3)
    w16, l16, v16 = _critic_steps(dataclasses.replace(cfg, precision="bf16"), 3)
    start = Critic(cfg).model.state_dict()
    moved = sum(float((w32[k] - start[k]).abs().sum()) for k in w32)
    diff = sum(float((w16[k] - w32[k]).abs().sum()) for k in w32)
    print(f"bf16 critic vs fp32: {diff / moved:.2%} of the 3 steps' move")
    assert 0 < diff / moved < 0.05
    assert l16 == pytest.approx(l32, rel=2e-2, abs=1e-3)
    assert v16 == pytest.approx(v32, rel=5e-2, abs=2e-2)


def test_a_bf16_rollout_samples_as_fp32_within_bf16(model_dir: Path) -> None:
    """The torch rollout engine generates in the plan's precision (BF16 autocast, as vLLM and
    SGLang run `dtype=bfloat16`, over FP32 weight tensors; a BF16 job's refresh loads BF16
    values into them, `test_exec_bf16sync`):
    from the same seeds it samples nearly the same tokens as in FP32, its log-probs within
    BF16's rounding where the tokens agree, and not exactly FP32's (the format is really used)."""
    from executors.modelroles import Rollout
    prompts = [[1, 5 + i, 9, 14 + i] for i in range(16)]
    out = {}
    for p in ("fp32", "bf16"):
        engine = Rollout(config(model_dir, precision=p))
        s, _ = engine.generate([f"s{i}" for i in range(16)], ["g"] * 16, prompts,
                               list(range(16)))
        assert all(v.dtype == torch.float32 for v in engine.model.state_dict().values())
        out[p] = s
    same = [i for i in range(16) if out["fp32"].responses[i] == out["bf16"].responses[i]]
    assert len(same) >= 12  # a near-tie may flip a draw, and the rest of that sample with it
    pairs = [(a, b) for i in same for a, b in zip(out["fp32"].logprobs[i],
                                                   out["bf16"].logprobs[i])]
    assert max(abs(a - b) for a, b in pairs) < 0.1 and any(a != b for a, b in pairs)


def test_a_bf16_reference_matches_fp32_within_bf16(model_dir: Path) -> None:
    """The reference model's forward runs in the plan's precision, as the actor's old-log-prob
    pass does: under bf16 its log-probs are FP32's within BF16's rounding and not identical to
    them (the format is really used); its weights stay FP32."""
    from executors.modelroles import Reference
    s, _ = batch(4)
    got = {p: Reference(config(model_dir, precision=p)).logprobs(s)[0] for p in ("fp32", "bf16")}
    pairs = [(a, b) for r32, r16 in zip(got["fp32"], got["bf16"]) for a, b in zip(r32, r16)]
    assert pairs and len(pairs) == sum(len(r) for r in s.responses)
    diff = [abs(a - b) for a, b in pairs]
    print(f"bf16 reference vs fp32: max |dlogp| {max(diff):.3g}, mean {sum(diff) / len(diff):.3g}")
    assert max(diff) < 0.02 and any(d > 0 for d in diff)  # measured: 1.5e-3 at most
    ref = Reference(config(model_dir, precision="bf16"))
    assert all(v.dtype == torch.float32 for v in ref.model.state_dict().values())
