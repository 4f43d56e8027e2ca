"""Rollout backends: the one registry that `--backend` (`placer execute`, `execute()`) names.

A backend is one class here: the engine layouts it can run (`layout_problem`, checked before
any actor starts, so a layout the engine cannot run exits 2) and the rollout worker the
runtime starts for each engine replica group (`rollout_worker`):

  torch    `executors.modelroles.Rollout`: the sampling loop in the actor's process; at tp > 1 it
           holds each TP rank's shards, gathered for the forward (pp 1)
  vllm     `executors.vllm_rollout.VllmRollout`: a vLLM engine (the `gpu` extra)
  sglang   `executors.sglang_rollout.SglangRollout`: an SGLang engine (the `sglang` extra)

The worker class is imported only when its backend starts one (vLLM and SGLang load CUDA
libraries), so this module stays light: the CLI reads its names for `--help`. Adding a backend
is one class here (and its worker's module); nothing outside this module compares a backend's
name.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, ClassVar

from placer.base.errors import SpecError

if TYPE_CHECKING:
    from executors.roles import RunConfig
    from executors.runplan import EngineGroup, Layout
    from placer.spec.arch import ModelArch

DEFAULT_BACKEND = "torch"


class Backend:
    """A rollout backend: the engine that generates, and the layouts it can run."""

    name: ClassVar[str]
    extra: ClassVar[str | None] = None  # the package extra that installs its engine
    worker: ClassVar[str]  # "module:Class" of the rollout worker, imported on first use
    splits_tp: ClassVar[bool] = False  # whether one engine runs over several devices (tp > 1)
    reads_images: ClassVar[bool] = False  # whether its engines run a vision-language policy

    def layout_problem(self, lay: Layout, arch: ModelArch) -> str | None:
        """None when an engine can run `lay` (dp, tp, pp) for the model, else why not."""
        raise NotImplementedError

    def worker_class(self) -> type:
        """The rollout worker class, imported now."""
        module, cls = self.worker.split(":")
        out: type = getattr(importlib.import_module(module), cls)
        return out

    def rollout_worker(self, cfg: RunConfig, engines: EngineGroup, rank: int
                       ) -> tuple[type, tuple[object, ...]]:
        """The class and constructor arguments of rollout rank `rank`, one replica of the
        engine group `engines` (a split rollout's part: its pool's TP and memory share)."""
        return self.worker_class(), (cfg.for_engines(engines), rank)

    def describe(self) -> str:
        return self.name + (f" (the {self.extra} extra)" if self.extra else "")


class TorchBackend(Backend):
    name = "torch"
    worker = "executors.modelroles:Rollout"
    splits_tp = True
    reads_images = True  # the torch engine loads the policy's model class (`executors.vlm`)

    def layout_problem(self, lay: Layout, arch: ModelArch) -> str | None:
        """The torch backend holds an engine's TP shards in one process (no pipeline stages);
        the cut is vLLM's (`executors.reshard`), so TP must divide the heads as there."""
        if lay.pp > 1:
            return "the torch rollout backend runs no pipeline-parallel engine (pp 1)"
        return _heads_problem("the torch rollout backend", lay, arch)


def _heads_problem(engine: str, lay: Layout, arch: ModelArch) -> str | None:
    if arch.heads % lay.tp or (arch.kv_heads % lay.tp and lay.tp % arch.kv_heads):
        return (f"{engine} needs tp to divide the model's {arch.heads} query heads and "
                f"to divide, or be a multiple of, its {arch.kv_heads} KV heads")
    return None


class EngineBackend(Backend):
    """An inference library's engine: vLLM and SGLang split the query heads over TP and shard
    (or, below TP, replicate) the KV heads (their QKVParallelLinear); both engines are started
    without pipeline stages (`engine_args` of `executors.vllm_rollout`, `engine_kwargs` of
    `executors.sglang_rollout`)."""

    engine: ClassVar[str]  # the library's own name, for messages
    splits_tp = True

    def layout_problem(self, lay: Layout, arch: ModelArch) -> str | None:
        if lay.pp > 1:
            return f"the {self.name} rollout backend runs no pipeline-parallel engine (pp 1)"
        return _heads_problem(self.engine, lay, arch)


class VllmBackend(EngineBackend):
    name = "vllm"
    engine = "vLLM"
    extra = "gpu"
    worker = "executors.vllm_rollout:VllmRollout"


class SglangBackend(EngineBackend):
    name = "sglang"
    engine = "SGLang"
    extra = "sglang"
    worker = "executors.sglang_rollout:SglangRollout"


BACKENDS: dict[str, Backend] = {b.name: b for b in (TorchBackend(), VllmBackend(), SglangBackend())}


def _either(names: list[str]) -> str:
    return ", ".join(names[:-1]) + (" or " if len(names) > 1 else "") + names[-1] if names else ""


def backend_of(name: str = DEFAULT_BACKEND) -> Backend:
    """The backend `name`; SpecError (exit 2) naming the flag and the known ones otherwise."""
    b = BACKENDS.get(name)
    if b is None:
        known = ", ".join(BACKENDS)
        raise SpecError(f"--backend: unknown backend {name!r} (expected one of {known})")
    return b


def rollout_class(name: str) -> type:
    """The rollout worker class of backend `name`, imported now."""
    return backend_of(name).worker_class()


def backends_help() -> str:
    """The backends as `--help` lists them: "torch, vllm (the gpu extra) or sglang (...)"."""
    return _either([b.describe() for b in BACKENDS.values()])
