"""Host image preparation inside the step (`placer.cost.vision.host_prep_s`): EasyR1's engine
re-runs the image processor on every prompt and its FSDP worker on every distinct prompt of its
chunk (`FrameworkProfile.host_image_prep`); frameworks that do not are priced without it."""
from __future__ import annotations

import pytest
from specdata import vlm_job

from placer.base.roles import Role
from placer.cost.estimate import estimate
from placer.cost.pricer import Pricer
from placer.cost.sharding import Parallel
from placer.cost.vision import distinct_prompts, engine_prompts, host_prep_s
from placer.spec.catalog import resolve
from placer.spec.framework import EASYR1_IMAGE_PREP_S_PER_PATCH, profile_of
from placer.spec.load import job_from_dict


def test_a_ranks_distinct_prompts() -> None:
    assert distinct_prompts(512, 5, 1) == 512  # one rank holds every prompt
    assert distinct_prompts(512, 1, 8) == pytest.approx(64)  # one sample each: its share
    # r13's batch over 8 ranks: a prompt is missed only when all 5 samples are elsewhere
    assert distinct_prompts(512, 5, 8) == pytest.approx(512 * (1 - (7 / 8) ** 5))
    for group in (2, 5, 16):  # between a rank's prompts kept together and its samples
        seen = distinct_prompts(512, group, 8)
        assert 512 / 8 < seen < 512 * group / 8
    assert distinct_prompts(0, 5, 8) == 0.0


def test_engine_prompts_round_up() -> None:
    assert engine_prompts(640, 5) == 128 and engine_prompts(641, 5) == 129
    assert engine_prompts(7, 1) == 7


@pytest.mark.parametrize(("role", "par"), [(Role.ROLLOUT, Parallel(tp=2, dp=2)),
                                           (Role.REFERENCE, Parallel(dp=4)),
                                           (Role.ACTOR, Parallel(dp=4))])
def test_easyr1_prepares_its_images_on_the_host(role: str, par: Parallel) -> None:
    # One image (256 tokens) + 100 text tokens against 356 text tokens, both under EasyR1:
    # the language model's work is the same, so each stage differs by the encoder and, on the
    # engine and the trainer, the host's preparation of the images.
    img = resolve(job_from_dict(vlm_job(100, 1, "easyr1")), "img")
    txt = resolve(job_from_dict(vlm_job(356, 0, "easyr1")), "txt")
    pool = img.cluster.pool("h100")
    px = Pricer(img)
    a, b = estimate(px, role, pool, par), estimate(Pricer(txt), role, pool, par)
    m, dev = img.arch_of(role), img.device_of(pool)
    eff = px.calib.for_device(dev)
    assert eff.host_image_prep_s_per_patch == EASYR1_IMAGE_PREP_S_PER_PATCH > 0
    assert m.vision is not None
    per_image = m.vision.patches_per_image * EASYR1_IMAGE_PREP_S_PER_PATCH
    # rollout: 64 samples over 2 replicas, 4 per prompt -> 8 prompts each, one image each;
    # trainer: 16 prompts x 4 samples over 4 ranks -> 16 x (1 - (3/4)^4) distinct prompts
    want: dict[str, tuple[str, float]] = {
        Role.ROLLOUT: ("rollout", 8 * per_image), Role.REFERENCE: ("score", 0.0),
        Role.ACTOR: ("train", 16 * (1 - 0.75 ** 4) * per_image)}
    native = resolve(job_from_dict(vlm_job(100, 1, "native")), "native")
    c, d = estimate(Pricer(native), role, pool, par), estimate(
        Pricer(resolve(job_from_dict(vlm_job(356, 0, "native")), "n")), role, pool, par)
    stage, prep = want[role]
    encoder = (c.stage_s[stage] - d.stage_s[stage])  # native: the encoder alone
    assert a.stage_s[stage] - b.stage_s[stage] == pytest.approx(encoder + prep, rel=1e-9)
    assert host_prep_s(m, 8, 1, eff) == pytest.approx(8 * per_image)


def test_only_easyr1_re_runs_the_processor_and_text_jobs_pay_nothing() -> None:
    assert [n for n in ("native", "verl", "verl-megatron", "openrlhf", "nemo-rl", "miles",
                        "easyr1") if profile_of(n).host_image_prep] == ["easyr1"]
    res = resolve(job_from_dict(vlm_job(356, 0, "easyr1")), "txt")
    eff = Pricer(res).calib.for_device(res.device_of(res.cluster.pool("h100")))
    assert host_prep_s(res.arch_of(Role.ACTOR), 16, 0, eff) == 0.0
