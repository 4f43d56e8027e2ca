"""Real architectures from local checkpoint folders: a job names `models.policy: {path: DIR}`,
the loader reads its config.json into the catalog (the planner prices the real model), and the
executor loads it with the Auto classes, generates with it and trains a step. Each folder is a
tiny random-init model built from its transformers config class (nothing is downloaded)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from exec_util import job_dict

from executors import rl
from executors.checkpoints import CONFIGS, build_checkpoint
from executors.model import BOS, load_policy
from executors.roles import RunConfig
from executors.sharding import Layout
from executors.trainer import Trainer
from executors.training import partition
from placer.base.errors import SpecError
from placer.spec.catalog import resolve
from placer.spec.load import job_from_dict


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ckpt")
    return {k: build_checkpoint(k, root / k, seed=1) for k in CONFIGS}


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_checkpoint_folder_plans_loads_and_trains(kind: str, dirs: dict[str, Path]) -> None:
    path = dirs[kind]
    job = job_from_dict(job_dict(models={"policy": {"path": str(path)}, "reward": "rule"}))
    arch = resolve(job).arch_of("actor")
    assert job.models.paths == {"policy": str(path.resolve())} and arch.name == kind
    assert (arch.layers, arch.hidden, arch.heads, arch.kv_heads, arch.vocab) == (2, 64, 4, 2, 64)
    assert arch.experts == (4 if kind in ("qwen3_moe", "mixtral") else 0)
    assert arch.qk_norm == kind.startswith("qwen3") and arch.qkv_bias == (kind == "qwen2")
    model = load_policy(path)
    assert type(model).__name__.lower().startswith(kind.replace("_", ""))
    resp, lps = rl.generate(model, [[BOS, 10, 20, 4], [BOS, 7]], 5, seeds=[1, 2])
    assert all(len(r) == len(lp) >= 1 for r, lp in zip(resp, lps))
    s = rl.Samples(["a", "b"], [[BOS, 10, 20, 4], [BOS, 7]], resp, lps, 0, ["g", "g"])
    cfg = RunConfig(algorithm="grpo", arch=arch.model_dump(), model_dir=str(path), seed=0,
                    max_new_tokens=5, lr=1e-3)
    tr = Trainer(cfg)
    before = {k: v.clone() for k, v in tr.weights().items()}
    adv = [[1.0] * len(resp[0]), [-1.0] * len(resp[1])]
    info, _ = tr.train(partition(s, adv, None, Layout(), 1, 1)[0])
    assert torch.isfinite(torch.tensor(info["loss"])) and info["optimizer_steps"] == 1
    assert any(not torch.equal(before[k], v) for k, v in tr.weights().items())


def test_checkpoint_folder_errors_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"models.policy.path: no readable config.json"):
        job_from_dict(job_dict(models={"policy": {"path": str(tmp_path)}}))
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(SpecError, match=r"models.policy.path: model_type 'gpt2' is not supported"):
        job_from_dict(job_dict(models={"policy": {"path": str(tmp_path)}}))
    with pytest.raises(SpecError, match=r"models.policy: expected a model name or"):
        job_from_dict(job_dict(models={"policy": {"dir": str(tmp_path)}}))
