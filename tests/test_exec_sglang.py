"""The sglang rollout backend on a real GPU (skipped without CUDA or a working SGLang: the
`sglang` extra, in its own environment; scripts/gpu_check.sh makes it and runs this file).

  engine    a tiny Qwen2 checkpoint (a real architecture: q/k/v biases, GQA, untied head) in
            the backend's engine, greedy: every returned log-prob is the float32 Hugging Face
            model's log-prob of that token after the same prefix (teacher-forced), so the
            log-probs are the model's, not zeros or another token's;
  update    another checkpoint's weights (its LM head scaled, so the distributions move far)
            pushed in place through `receive_bucket` in several buckets, as the executor sends
            them: the same prompts' log-probs now match the new model and not the old one
            (a stale prefix cache or a half-loaded model fails this);
  executor  a GRPO run on Ray with `backend="sglang"`: every rollout has its step's policy
            version, weights handed over every step as CUDA IPC handles of whole tensors (the
            engine shares the trainer's GPU: `executors.ipc`, protocol `IPC_TENSORS`), passed
            unopened to `update_weights_from_tensor` as SGLang's per-TP-rank payloads.
Prints `SGLANG_FIGURES`: the engine's tokens/s on a batch, the in-place update time, and the
executor run's tokens/s and mean weight-sync time.
"""
from __future__ import annotations

import dataclasses
import time

import pytest
from exec_util import hand_plan, job_dict, run_module

from placer.cost.sharding import Parallel

pytestmark = [pytest.mark.gpu, pytest.mark.ray]


def _why_not() -> str | None:
    try:
        import torch  # lazy: the import is part of the check
        if not torch.cuda.is_available():
            return "needs a CUDA GPU"
        import sglang.srt.entrypoints.engine  # noqa: F401 - lazy: fails without its CUDA deps
    except Exception as e:  # noqa: BLE001 - no torch, no CUDA, or SGLang without its deps
        return f"needs a CUDA GPU and SGLang (pip install -e .[sglang]): {type(e).__name__}: {e}"
    return None


if (_reason := _why_not()) is not None:
    pytest.skip(_reason, allow_module_level=True)

import torch  # noqa: E402 - after the skip: only where the engine can run

from executors.checkpoints import build_checkpoint  # noqa: E402
from executors.model import BOS, load_policy  # noqa: E402
from executors.reshard import Stream  # noqa: E402
from executors.roles import run_config  # noqa: E402
from executors.runplan import resolve_plan  # noqa: E402
from executors.sglang_rollout import SglangRollout  # noqa: E402

STEPS = 4
TOL = 0.1  # nats: the bfloat16 engine against the float32 model
MOVED = 1.0  # nats: the scaled head moves the log-probs far more than that
# One GPU: the trainer and the SGLang engine share it (the engine takes the plan's share).
LAYOUT = {"actor": ("gpu", Parallel(dp=1), "train"), "rollout": ("gpu", Parallel(dp=1), "train"),
          "reference": ("cpu", Parallel(), "cpu"), "reward": ("cpu", Parallel(), "cpu"),
          "environment": ("cpu", Parallel(), "cpu")}
POOLS = [{"name": "gpu", "device": "emu-gpu", "devices_per_node": 1, "nodes": 1},
         {"name": "lpu", "device": "emu-lpu", "devices_per_node": 4, "nodes": 1},
         {"name": "cpu", "device": "laptop-cpu", "devices_per_node": 1, "nodes": 1}]
FIGURES: dict[str, float] = {}


def _plan():
    return hand_plan(LAYOUT, job_dict(cluster={"pools": POOLS}))


def teacher_forced(model, contexts: list[list[int]], responses: list[list[int]]
                   ) -> list[list[float]]:
    """The float32 model's log-prob of each response token after its prefix."""
    out = []
    with torch.no_grad():
        for c, r in zip(contexts, responses):
            logits = model(torch.tensor([c + r])).logits[0].float()
            lp = torch.log_softmax(logits, -1)
            out.append([float(lp[len(c) - 1 + k, t]) for k, t in enumerate(r)])
    return out


def _gap(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


def test_engine_log_probs_and_in_place_update(tmp_path) -> None:
    old_dir = build_checkpoint("qwen2", tmp_path / "old", seed=0)
    new_dir = build_checkpoint("qwen2", tmp_path / "new", seed=1)
    old, new = load_policy(old_dir), load_policy(new_dir)
    with torch.no_grad():
        new.lm_head.weight.mul_(20.0)  # peaked distributions: far from the old model's
    cfg = run_config(resolve_plan(_plan()), model_dir=str(old_dir))
    cfg = dataclasses.replace(cfg, temperature=0.0, max_model_len=256,
                              engines=dataclasses.replace(cfg.engines, mem_fraction=0.3))
    r = SglangRollout(cfg, 0)
    try:
        contexts = [[BOS, 3 + i % 10, 4 + i % 7, 5] for i in range(8)]
        ids, groups, seeds = [f"s{i}" for i in range(8)], ["g"] * 8, list(range(8))
        s0, _ = r.generate(ids, groups, contexts, seeds, [24] * 8)
        assert all(s0.responses) and s0.version == 0
        assert _gap(s0.logprobs, teacher_forced(old, contexts, s0.responses)) < TOL

        stream = Stream(new.state_dict(), bucket_bytes=64 * 1024)
        assert stream.count > 1
        t0 = time.time()
        for k in range(stream.count):
            r.receive_bucket(stream.bucket(k), 1, 1, "v1.1")
        FIGURES["update_s"] = time.time() - t0
        assert r.current_version() == 1

        s1, _ = r.generate(ids, groups, contexts, seeds, [24] * 8)
        assert s1.version == 1 and s1.responses != s0.responses
        assert _gap(s1.logprobs, teacher_forced(new, contexts, s1.responses)) < TOL
        assert _gap(s1.logprobs, teacher_forced(old, contexts, s1.responses)) > MOVED

        n = 256  # throughput: one batch, up to 128 new tokens each
        batch = [[BOS, 3 + i % 40, 4 + i % 13] for i in range(n)]
        t0 = time.time()
        s, timing = r.generate([f"b{i}" for i in range(n)], ["g"] * n, batch, list(range(n)),
                               [128] * n)
        FIGURES["engine_tps"] = timing["tokens"] / (time.time() - t0)
        assert timing["tokens"] > 0
    finally:
        r.engine.shutdown()


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    return run_module(_plan(), STEPS, tmp_path_factory.mktemp("sglang"), backend="sglang")


def test_sglang_rollouts_follow_the_policy_version(result) -> None:
    assert [s.versions for s in result.stats] == [[s] for s in range(STEPS)]
    assert result.ledger_ok, result.ledger_problems
    assert "gpu" not in result.emulated
    assert result.trace.metadata["backend"] == "sglang"


def test_sglang_figures(result) -> None:
    gen = result.trace.of("generate")
    sync = [e for e in result.trace.of("transfer") if e.args["policy_version"] > 0]
    tokens = sum(e.args["tokens"] for e in gen)
    tps = tokens / sum(e.dur_s for e in gen)
    upd = sum(e.dur_s for e in sync) / max(len(sync), 1)
    print(f"SGLANG_FIGURES engine_tokens/s={FIGURES.get('engine_tps', float('nan')):.1f} "
          f"engine_update_s={FIGURES.get('update_s', float('nan')):.4f} "
          f"run_tokens/s={tps:.1f} run_weight_sync_s={upd:.4f} steps={len(result.stats)} "
          f"tokens={tokens} updates={len(sync)} bytes={sum(e.args['bytes'] for e in sync)}")
    assert tokens > 0 and len(sync) == STEPS - 1 and all(e.args["bytes"] > 0 for e in sync)


def test_sglang_weights_are_handed_over_as_cuda_ipc(result) -> None:
    """The engine shares the trainer's GPU (one slot): every refresh was handed over as CUDA
    IPC handles of whole tensors (`executors.ipc`, `SglangRollout.handover_receive_tensors`)
    and loaded by SGLang's TP ranks through `update_weights_from_tensor`, no group formed, no
    CUDA context in the engine's actor; Ray carried only handles, bucket heads and
    acknowledgements, far fewer bytes than the weights."""
    sync = [e for e in result.trace.of("transfer") if e.args["policy_version"] > 0]
    assert sync and {e.args["backend"] for e in sync} == {"cuda-ipc"}
    assert all(e.args["control_bytes"] < e.args["bytes"] / 10 for e in sync)
    print(f"SGLANG_GROUP refreshes={len(sync)} bytes={sync[-1].args['bytes']} "
          f"control_bytes={sync[-1].args['control_bytes']}")
