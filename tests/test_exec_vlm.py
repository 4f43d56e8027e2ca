"""The tiny vision-language policy (executors/vlm.py): the ViT's shapes and parameter count
against the cost model's, images and placeholders as pure functions, and
`examples/vlm-tiny-cpu.yaml` planned and executed end to end on Ray: every actor where the plan
put it, the executed layout the plan's, the encoder's runs in the trace (rollout prefill,
log-probs, training) and the trace calibrated as other traces are.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from executors import rl
from executors.vlm import (
    MASKED_LOGIT,
    TinyViT,
    build_vlm,
    encoder_spans,
    grid,
    image_pixels,
    image_side,
    image_slots,
    image_token_id,
    patchify,
)
from placer.spec.arch import ModelArch
from placer.spec.catalog import resolve
from placer.spec.load import load_job
from placer.spec.vision import VisionEncoder

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "vlm-tiny-cpu.yaml"
STEPS = 3  # the calibration needs 3 events of a kind: the reference runs one a step


@pytest.fixture(scope="module")
def arch() -> ModelArch:
    a = resolve(load_job(EXAMPLE)).model_of("actor")
    assert a is not None and a.vision is not None
    return a


def test_vit_shapes_and_parameters_are_the_cost_models(arch: ModelArch) -> None:
    v = arch.vision
    assert v is not None
    vit = TinyViT(v)
    assert sum(p.numel() for p in vit.parameters()) == v.params()  # placer/spec/vision.py
    side = image_side(v)
    assert side == grid(v) * v.merge * v.patch_size == 16
    out = vit(torch.rand(3, 3, side, side))
    assert out.shape == (3, v.tokens_per_image, v.out_hidden)
    # the same at Qwen2.5-VL's proportions (a bigger grid, more heads, merge 2)
    q = VisionEncoder(layers=1, hidden=48, mlp=80, heads=3, patch_size=2,
                      temporal_patch_size=2, merge=2, out_hidden=40, tokens_per_image=9)
    big = TinyViT(q)
    assert sum(p.numel() for p in big.parameters()) == q.params()
    assert big(torch.rand(2, 3, image_side(q), image_side(q))).shape == (2, 9, 40)


def test_patches_come_in_merge_windows(arch: ModelArch) -> None:
    v = arch.vision
    assert v is not None
    side = image_side(v)
    # a pixel's value is its patch's row * 10 + column: each patch vector is one number
    rows = torch.arange(side)[:, None] // v.patch_size
    cols = torch.arange(side)[None, :] // v.patch_size
    img = (rows * 10 + cols).float().expand(3, side, side)[None]
    patches, pos = patchify(img, v)
    assert patches.shape == (1, v.patches_per_image, 3 * v.temporal_patch_size * v.patch_size ** 2)
    assert torch.all(patches[0] == patches[0, :, :1])  # a patch is uniform, every frame too
    ids = [int(x) for x in patches[0, :, 0]]
    assert ids[:4] == [0, 1, 10, 11] and ids[4:8] == [2, 3, 12, 13]  # window by window
    assert [r * 10 + c for r, c in pos.tolist()] == ids


def test_images_are_seeded_by_job_and_prompt(arch: ModelArch) -> None:
    v = arch.vision
    assert v is not None
    a = image_pixels(0, [1, 5, 6], 0, v)
    assert a.shape == (3, 16, 16) and 0 <= float(a.min()) and float(a.max()) < 1
    assert torch.equal(a, image_pixels(0, [1, 5, 6], 0, v))
    for other in (image_pixels(1, [1, 5, 6], 0, v), image_pixels(0, [1, 5, 7], 0, v),
                  image_pixels(0, [1, 5, 6], 1, v)):
        assert not torch.equal(a, other)
    slots = image_slots(arch, 2)
    assert slots == [image_token_id(arch)] * 8 and image_token_id(arch) == arch.vocab - 1
    assert image_slots(arch, 0) == [] and image_slots(arch.model_copy(update={"vision": None}),
                                                      2) == []


def test_images_reach_the_lm_and_gradients_reach_the_encoder(arch: ModelArch) -> None:
    model = build_vlm(arch, 0)
    img = image_token_id(arch)
    prompts = [[1, 12, 20, 13] + image_slots(arch, 2), [1, 12, 21, 13] + image_slots(arch, 2)]
    resp, lps = rl.generate(model, prompts, 5, [3, 4])
    assert all(img not in r for r in resp)  # the placeholder is input-only
    spans = encoder_spans(model)["encodes"]
    assert [e["images"] for e in spans] == [4] and encoder_spans(model) == {}  # drained
    s = rl.Samples(["a", "b"], prompts, resp, lps, 0, ["p0", "p1"])
    model.train()
    lp = rl.response_logprobs(model, s)
    # scoring the samples encodes the same images the prefill saw: the same log-probs
    assert torch.allclose(lp[0, :len(resp[0])], torch.tensor(lps[0]), atol=1e-4)
    lp.sum().backward()
    assert model.visual.patch_embed.weight.grad.abs().sum() > 0
    logits = model(input_ids=torch.tensor(prompts)).logits
    assert torch.all(logits[..., img] == MASKED_LOGIT)
    with torch.no_grad():  # other images for the same tokens: another answer distribution
        other = model.embed_images(torch.tensor([[1, 12, 22, 13] + image_slots(arch, 2)]))
        same = model.embed_images(torch.tensor([prompts[0]]))
    assert not torch.allclose(other[0, 4:], same[0, 4:])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from exec_util import run_module  # lazy: Ray and torch only for the run

    import placer
    plan = placer.plan(str(EXAMPLE))
    result = run_module(plan, STEPS, tmp_path_factory.mktemp("vlm"))
    return plan, result


@pytest.mark.ray
def test_vlm_runs_as_planned(run) -> None:
    plan, r = run
    assert all(p["on_plan_node"] and p["in_bundle"] for p in r.placement), r.placement
    assert sorted({p["role"] for p in r.placement}) == sorted(plan.roles)
    want = {role: {"dp": plan.roles[role].dp, "tp": plan.roles[role].tp,
                   "pp": plan.roles[role].pp} for role in ("actor", "rollout")}
    want["actor"]["recompute"] = plan.roles["actor"].recompute
    got = r.trace.metadata["executed_layout"]
    # The actor's entry is read off the built model and holds more (mesh, placements, precision).
    assert {role: {k: got[role][k] for k in want[role]} for role in want} == want
    assert got["actor"]["precision"] == "bf16"
    assert r.ledger_ok and len(r.stats) == STEPS


@pytest.mark.ray
def test_encoder_runs_in_every_pass_and_the_trace_calibrates(run) -> None:
    from placer.calibrate.fit import fit_trace  # lazy: with the run
    plan, r = run
    job = plan.resolved().job
    per_prompt = job.lengths.images_per_prompt
    enc = [e for e in r.trace.events if e.cat == "encode"]
    by = {(e.args["call"], e.args["role"]) for e in enc}
    assert {("rollout prefill", "rollout"), ("log-probs", "reference"),
            ("old log-probs", "actor"), ("training", "actor")} <= by
    def images(call: str) -> int:
        return sum(e.args["images"] for e in enc if e.args["call"] == call)
    # every sample's images once per pass and step (the trainer's ranks encode their shares)
    for call in ("rollout prefill", "log-probs", "old log-probs", "training"):
        assert images(call) == STEPS * job.batch.samples * per_prompt, call
    gens = [e for e in r.trace.events if e.cat == "generate"]
    image_tokens = per_prompt * plan.resolved().model_of("actor").vision.tokens_per_image
    assert min(p for e in gens for p in e.args["prompt_tokens"]) > image_tokens
    fit = fit_trace(r.trace, plan)
    assert fit.counts["generate@emu-gpu"] >= STEPS and fit.counts["train@emu-gpu"] >= STEPS
    assert not any("encode" in why for why in fit.skipped)  # not a fitted category: left out


def test_encoder_recomputes_with_the_layers(arch: ModelArch) -> None:
    """With the plan's recompute (the LM's layers wrapped, `executors.sharding`), every ViT
    block runs its forward again in the backward pass; the gradients are the same."""
    from executors.sharding import recompute_layers  # lazy: torch.distributed's wrappers
    prompts = [[1, 12, 20, 13] + image_slots(arch, 2)]
    s = rl.Samples(["a"], prompts, [[14, 15, 2]], [[0.0] * 3], 0, ["p0"])
    grads, calls = [], []
    for recompute in (False, True):
        model = build_vlm(arch, 0)
        if recompute:
            recompute_layers(model)
        model.train()
        runs: list[int] = []  # the block's forward body, counted (hooks skip a recompute)
        block = model.visual.blocks[0]
        block.forward = lambda *a, seen=runs, f=block.forward: (seen.append(1), f(*a))[1]
        rl.response_logprobs(model, s).sum().backward()
        grads.append(model.visual.patch_embed.weight.grad.clone())
        calls.append(len(runs))
        assert model.visual.recompute is recompute
    assert calls == [1, 2]
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_what_the_executor_cannot_run_is_refused_before_it_starts() -> None:
    """`placer execute` exits 2 (a SpecError from `preflight`) with these messages."""
    import yaml
    from exec_util import hand_plan  # lazy: the planner's assembly

    import placer
    from executors.backends import backend_of
    from executors.runplan import resolve_plan
    from executors.vlm import vision_problem
    from placer.cost.sharding import Parallel
    run = resolve_plan(placer.plan(str(EXAMPLE)))
    assert vision_problem(run, backend_of("torch")) is None
    assert "--backend: 'vllm'" in (vision_problem(run, backend_of("vllm")) or "")
    job = yaml.safe_load(EXAMPLE.read_text())
    job["catalog"]["models"][0]["vision"]["tokens_per_image"] = 2  # no square grid
    plan = hand_plan({"actor": ("gpu", Parallel(dp=2), "train"),
                      "rollout": ("gpu", Parallel(dp=2), "train"),
                      "reference": ("gpu", Parallel(dp=1), "train"),
                      "reward": ("cpu", Parallel(), "cpu"),
                      "environment": ("cpu", Parallel(), "cpu")}, job)
    why = vision_problem(resolve_plan(plan), backend_of("torch")) or ""
    assert "tokens_per_image 2 is not a square" in why
