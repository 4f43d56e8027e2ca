"""Rollout backends: the one registry that `--backend` (`placer execute`, `execute()`) names.

A backend is the class that runs a rollout engine and the engine layouts it can run:

  torch    `executors.roles.Rollout`: the sampling loop in the actor's process (tp 1, pp 1)
  vllm     `executors.vllm_rollout.VllmRollout`: a vLLM engine (the `gpu` extra)
  sglang   `executors.sglang_rollout.SglangRollout`: an SGLang engine (the `sglang` extra)

The class is imported only when its backend is chosen (vLLM and SGLang load CUDA libraries);
the layout check runs before any actor starts, so a layout the engine cannot run exits 2.
Adding a backend is one `Backend` entry here: the CLI, `execute()`, the layout check and the
runtimes all read `BACKENDS`.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from placer.base.errors import SpecError

if TYPE_CHECKING:
    from executors.sharding import Layout
    from placer.spec.arch import ModelArch

# None when an engine can run the layout for the model, else why not.
LayoutCheck = Callable[["Layout", "ModelArch"], "str | None"]


@dataclass(frozen=True)
class Backend:
    name: str
    rollout: str  # "module:Class" of the rollout worker, imported when the backend is chosen
    layout_problem: LayoutCheck


def _torch_engine(lay: Layout, arch: ModelArch) -> str | None:
    """The torch backend generates with the whole model in the engine's one process."""
    if lay.tp > 1 or lay.pp > 1:
        return ("the torch rollout backend runs each engine whole in one process (tp 1, pp 1); "
                "plan the rollout with tp 1 and pp 1, or use --backend vllm or sglang for tp > 1")
    return None


def _tp_engine(name: str, engine: str) -> LayoutCheck:
    """vLLM and SGLang split the query heads over TP and shard (or, below TP, replicate) the KV
    heads (their QKVParallelLinear); both engines are started without pipeline stages
    (`engine_args` of `executors.vllm_rollout`, `engine_kwargs` of `executors.sglang_rollout`)."""
    def check(lay: Layout, arch: ModelArch) -> str | None:
        if lay.pp > 1:
            return f"the {name} rollout backend runs no pipeline-parallel engine (pp 1)"
        if arch.heads % lay.tp or (arch.kv_heads % lay.tp and lay.tp % arch.kv_heads):
            return (f"{engine} needs tp to divide the model's {arch.heads} query heads and to "
                    f"divide, or be a multiple of, its {arch.kv_heads} KV heads")
        return None
    return check


BACKENDS: dict[str, Backend] = {b.name: b for b in (
    Backend("torch", "executors.roles:Rollout", _torch_engine),
    Backend("vllm", "executors.vllm_rollout:VllmRollout", _tp_engine("vllm", "vLLM")),
    Backend("sglang", "executors.sglang_rollout:SglangRollout", _tp_engine("sglang", "SGLang")),
)}


def backend_of(name: str) -> Backend:
    """The backend `name`; SpecError (exit 2) naming the flag and the known ones otherwise."""
    b = BACKENDS.get(name)
    if b is None:
        known = ", ".join(BACKENDS)
        raise SpecError(f"--backend: unknown backend {name!r} (expected one of {known})")
    return b


def rollout_class(name: str) -> type:
    """The rollout worker class of backend `name`, imported now."""
    module, cls = backend_of(name).rollout.split(":")
    out: type = getattr(importlib.import_module(module), cls)
    return out
