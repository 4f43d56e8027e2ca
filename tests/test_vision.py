"""Vision-language models: the vision encoder's parameters and FLOPs, image tokens in the prompt
(KV cache, prefill, training) and the encoder's work in every pass (`placer.spec.vision`,
`placer.cost.vision`)."""
from __future__ import annotations

import pytest
from specdata import ROOT, vlm_job

from placer.base.roles import Role
from placer.commands.validate import describe
from placer.cost.estimate import estimate
from placer.cost.pricer import Pricer
from placer.cost.rolloutcost import replica_devices
from placer.cost.sharding import Parallel
from placer.cost.tail_samples import at_means
from placer.cost.vision import pass_encode_s, rollout_encode_s
from placer.solve.planner import plan_job
from placer.spec.catalog import resolve, shipped_models
from placer.spec.load import dump_job, job_from_dict, load_job


def test_encoder_flops_grow_faster_than_its_tokens() -> None:
    v = shipped_models()["Qwen2.5-VL-7B"].vision
    assert v is not None and v.patches_per_image == 1024
    big = v.model_copy(update={"tokens_per_image": 1024})
    # linear in patches, plus attention over an image's patches (quadratic)
    assert big.flops_per_image() > 4 * v.flops_per_image()
    # about 2 FLOPs per block weight per patch (19.7M weights a block), plus the attention
    # scores and values over the image's 1024 patches in each of the 32 blocks
    assert v.flops_per_image() == pytest.approx(2 * 1024 * 32 * 19.7e6
                                                + 32 * 4 * 1024 ** 2 * 1280, rel=0.05)


def test_image_tokens_join_the_prompt_once() -> None:
    res = resolve(job_from_dict(vlm_job(100, 2)), "v")
    prompt = res.job.lengths.prompt
    assert prompt.offset == 512 and prompt.mean_value() == 612 and prompt.max_value() == 612
    assert resolve(res.job, "again").job.lengths.prompt == prompt  # idempotent
    assert at_means(res.job).lengths.prompt.mean_value() == pytest.approx(612)
    assert resolve(at_means(res.job), "m").job.lengths.prompt.mean_value() == pytest.approx(612)
    # text jobs dump without the new keys (regression guard: their plans stay byte-identical)
    text = dump_job(job_from_dict(vlm_job(100, 0)))
    assert "images_per_prompt" not in text["lengths"] and "offset" not in text["lengths"]["prompt"]


@pytest.mark.parametrize(("role", "par"), [(Role.ROLLOUT, Parallel(tp=2, dp=2)),
                                           (Role.REFERENCE, Parallel(dp=4)),
                                           (Role.ACTOR, Parallel(dp=4))])
def test_an_image_costs_its_tokens_plus_the_encoder(role: str, par: Parallel) -> None:
    # One image (256 tokens) + 100 text tokens against 356 text tokens: the language model's
    # work, KV cache and memory are the same, so every stage differs by the encoder alone.
    img = resolve(job_from_dict(vlm_job(100, 1)), "img")
    txt = resolve(job_from_dict(vlm_job(356, 0)), "txt")
    pool = img.cluster.pool("h100")
    a = estimate(Pricer(img), role, pool, par)
    b = estimate(Pricer(txt), role, pool, par)
    m, dev = img.arch_of(role), img.device_of(pool)
    eff = Pricer(img).calib.for_device(dev)
    n = img.job.batch.samples
    if role == Role.ROLLOUT:
        per = -(-n // par.dp)
        enc = {"rollout": rollout_encode_s(m, dev, replica_devices(m, dev, par, eff), per, 1, eff)}
        assert a.concurrency == b.concurrency  # the image's tokens hold KV like text
    elif role == Role.REFERENCE:
        enc = {"score": pass_encode_s(m, dev, par, n, 1, eff)}
    else:
        enc = {"score": pass_encode_s(m, dev, par, n, 1, eff),
               "train": pass_encode_s(m, dev, par, n, 1, eff, train=True)}
    for stage, t in b.stage_s.items():
        assert a.stage_s[stage] - t == pytest.approx(enc.get(stage, 0.0), rel=1e-9, abs=1e-12)
    assert all(v > 0 for v in enc.values())
    assert a.memory.weights == b.memory.weights and a.memory.total >= b.memory.total


def test_vlm_example_plans_with_the_encoder_priced() -> None:
    res = resolve(load_job(ROOT / "examples" / "vlm-qwen25vl-7b.yaml"), "vlm")
    assert res.job.lengths.prompt.offset == 256
    plan = plan_job(Pricer(res), time_limit_s=10, workers=1)
    assert {Role.ACTOR, Role.ROLLOUT, Role.REFERENCE} <= set(plan.roles)
    assert plan.spec.lengths.images_per_prompt == 1


def test_validate_counts_the_image_tokens() -> None:
    res = resolve(load_job(ROOT / "examples" / "vlm-qwen25vl-7b.yaml"), "vlm")
    doc = describe(res, None)
    assert doc["image_tokens_per_prompt"] == 256
    assert doc["max_context"] == 1024 + 256 + 2048  # prompt cap, image tokens, response cap
