"""The sglang backend without a GPU: its engine settings come from the plan and the job, a
missing log-prob is an error (its refreshes and generation on a fake engine:
tests/test_exec_sglang_refresh.py), and every name it hands SGLang exists in SGLang 0.5.23 (the
API contract, read from the installed package's source with `ast`: importing sglang needs its
CUDA dependencies, so the Makefile installs it without them, like verl and OpenRLHF for the
export tests). The engine itself runs in tests/test_exec_sglang.py on a GPU machine
(scripts/gpu_check.sh)."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from exec_util import GRPO_LAYOUT, hand_plan
from frameworks import package_dir

from executors import sglang_rollout as sr
from executors.backends import BACKENDS, backend_of, rollout_class
from executors.roles import run_config
from executors.run import check_layouts
from executors.runplan import Layout, resolve_plan
from placer.base.errors import SpecError
from placer.cost.sharding import Parallel

BACKEND_SRC = Path(sr.__file__)


def test_engine_kwargs_follow_the_plan_and_the_job() -> None:
    layout = {**GRPO_LAYOUT, "rollout": ("gpu", Parallel(tp=2, dp=1), "train")}
    plan = hand_plan(layout)
    cfg = run_config(resolve_plan(plan), model_dir="/m")
    r = plan.roles["rollout"]
    kw = sr.engine_kwargs(cfg, rank=1)
    assert kw["tp_size"] == 2 == r.tp
    assert kw["context_length"] == plan.resolved().job.max_context + 1 == 12 + 8 + 1
    frac = r.memory_gb / plan.resolved().device_of(r.pool).memory_gb
    assert kw["mem_fraction_static"] == pytest.approx(min(max(frac, 0.05), 0.95))
    assert kw["random_seed"] == cfg.seed + 1 and kw["model_path"] == "/m"
    assert kw["skip_tokenizer_init"] is True
    assert kw["attention_backend"] == "triton"  # tiny-llama's head dim is 16
    big = type(cfg)(**{**cfg.__dict__, "arch": {**cfg.arch, "hidden": 1024, "heads": 8}})
    assert "attention_backend" not in sr.engine_kwargs(big, 0)  # head dim 128: SGLang's choice


def test_the_backend_is_chosen_from_the_registry() -> None:
    assert set(BACKENDS) == {"torch", "vllm", "sglang"}
    with pytest.raises(SpecError, match=r"--backend: unknown backend 'sgl' \(expected one of "
                                        r"torch, vllm, sglang\)"):
        backend_of("sgl")
    run = resolve_plan(hand_plan({**GRPO_LAYOUT, "rollout": ("gpu", Parallel(tp=2, dp=1), "train")}))
    check_layouts(run, backend_of("sglang"))  # 4 heads, 2 KV heads over tp 2
    check_layouts(run, backend_of("torch"))  # the torch engine holds its TP shards too
    torch_engine = backend_of("torch").layout_problem
    assert "torch rollout backend runs no pipeline-parallel engine" in str(
        torch_engine(Layout(1, 1, 2), run.job.policy))
    assert "needs tp to divide the model's 4 query heads" in str(
        torch_engine(Layout(1, 3, 1), run.job.policy))
    sglang = backend_of("sglang").layout_problem
    arch = run.job.policy
    assert "runs no pipeline-parallel engine" in str(sglang(Layout(1, 1, 2), arch))
    assert "SGLang needs tp to divide the model's 4 query heads" in str(
        sglang(Layout(1, 3, 1), arch))


def test_importing_the_backend_does_not_import_sglang() -> None:
    code = ("import sys; from executors.backends import rollout_class; "
            "c = rollout_class('sglang'); print(c.__name__, 'sglang' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["SglangRollout", "False"]
    assert rollout_class("torch").__name__ == "Rollout"


# --------------------------------------------------------------------------- output parsing
def _out(tokens: list[int], lps: list[Any] | None, **meta: Any) -> dict[str, Any]:
    m: dict[str, Any] = {"finish_reason": {"type": "stop"}, **meta}
    if lps is not None:
        m["output_token_logprobs"] = [(lp, t, None) for lp, t in zip(lps, tokens)]
    return {"output_ids": tokens, "meta_info": m}


def test_log_probs_are_taken_from_the_output_and_missing_ones_refused() -> None:
    assert sr.sample_logprobs("s0", _out([5, 9], [-0.5, -2.0])) == ([5, 9], [-0.5, -2.0])
    with pytest.raises(RuntimeError, match="sglang returned 0 log-probs for 2 tokens of sample s0"):
        sr.sample_logprobs("s0", _out([5, 9], None))
    with pytest.raises(RuntimeError, match="1 log-probs for 2 tokens"):
        sr.sample_logprobs("s0", {"output_ids": [5, 9],
                                  "meta_info": {"output_token_logprobs": [(-0.5, 5, None)]}})
    with pytest.raises(RuntimeError, match=r"no log-prob for token 1 \(9\) of sample s1"):
        sr.sample_logprobs("s1", _out([5, 9], [-0.5, None]))
    other = {"output_ids": [5, 9], "meta_info": {"output_token_logprobs": [(-0.5, 5, None),
                                                                          (-1.0, 7, None)]}}
    with pytest.raises(RuntimeError, match=r"no log-prob for token 1 \(9\)"):
        sr.sample_logprobs("s1", other)  # a log-prob of another token is not this one's
    with pytest.raises(RuntimeError, match="sglang aborted sample s2: out of memory"):
        sr.sample_logprobs("s2", _out([], [], finish_reason={"type": "abort",
                                                            "message": "out of memory"}))


# ---------------------------------------------------------------------- the API contract
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    found = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    assert found, f"class {name} not found"
    return found[0]


def _fields(cls: ast.ClassDef) -> set[str]:
    return {n.target.id for n in cls.body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def server_args_fields(root: Path) -> set[str]:
    """ServerArgs' fields: `server_args.py` assembles them (`msgspec.defstruct`) from the
    namespace classes listed in `_INPUT_NAMESPACES`, each imported from `arg_groups.fields`."""
    tree = _tree(root / "srt" / "server_args.py")
    where = {a.asname or a.name: n.module for n in tree.body if isinstance(n, ast.ImportFrom)
             for a in n.names}
    spaces = next(n.value for n in tree.body if isinstance(n, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == "_INPUT_NAMESPACES"
                          for t in n.targets))
    assert isinstance(spaces, ast.List)
    out = _fields(_class(tree, "ServerArgs"))
    for elt in spaces.elts:
        assert isinstance(elt, ast.Name)
        module = where[elt.id]
        assert module is not None and module.startswith("sglang.")
        path = root.parent / (module.replace(".", "/") + ".py")
        out |= _fields(_class(_tree(path), elt.id))
    return out


def engine_methods(root: Path) -> dict[str, set[str]]:
    """Engine's methods and the parameters each takes (its own and its base classes')."""
    tree = _tree(root / "srt" / "entrypoints" / "engine.py")
    out: dict[str, set[str]] = {}
    for f in _class(tree, "Engine").body:
        if isinstance(f, ast.FunctionDef):
            a = f.args
            out[f.name] = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs} - {"self"}
    return out


def backend_engine_calls(src: Path) -> list[tuple[str, set[str]]]:
    """Every `self.engine.METHOD(kw=...)` call in the backend's source: (method, keywords)."""
    out = []
    for n in ast.walk(_tree(src)):
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                and isinstance(n.func.value, ast.Attribute) and n.func.value.attr == "engine"):
            out.append((n.func.attr, {k.arg for k in n.keywords if k.arg}))
    return out


def backend_sampling_keys(src: Path) -> set[str]:
    """The keys of the sampling-parameter dicts `sampling_params` builds."""
    fn = next(n for n in ast.walk(_tree(src))
              if isinstance(n, ast.FunctionDef) and n.name == "sampling_params")
    return {k.value for d in ast.walk(fn) if isinstance(d, ast.Dict) for k in d.keys
            if isinstance(k, ast.Constant)}


def contract_problems(root: Path, kwargs: set[str], calls: list[tuple[str, set[str]]],
                      sampling: set[str]) -> list[str]:
    """What the backend names that SGLang's source lacks (empty: the contract holds)."""
    fields, methods = server_args_fields(root), engine_methods(root)
    sp = _fields(_class(_tree(root / "srt" / "sampling" / "sampling_params.py"),
                        "SamplingParams"))
    out = [f"Engine(**kw): {k} is not a ServerArgs field" for k in sorted(kwargs - fields)]
    for name, kws in calls:
        if name not in methods:
            out.append(f"Engine has no method {name}")
        else:
            out += [f"Engine.{name} takes no {k}" for k in sorted(kws - methods[name])]
    out += [f"SamplingParams has no {k}" for k in sorted(sampling - sp)]
    return out


@pytest.fixture(scope="module")
def sglang_root() -> Path:
    root = package_dir("sglang")
    version = next(root.parent.glob("sglang-*.dist-info")).name
    assert version == "sglang-0.5.23.dist-info", f"the contract is SGLang 0.5.23's ({version})"
    return root


def test_every_name_the_backend_hands_sglang_exists(sglang_root: Path) -> None:
    plan = hand_plan({**GRPO_LAYOUT, "rollout": ("gpu", Parallel(tp=2, dp=1), "train")})
    kwargs = set(sr.engine_kwargs(run_config(resolve_plan(plan), model_dir="/m"), 0))
    calls = backend_engine_calls(BACKEND_SRC)
    used = {c[0] for c in calls}
    assert {"generate", "update_weights_from_tensor", "begin_weight_update",
            "end_weight_update", "flush_cache", "release_memory_occupation",
            "resume_memory_occupation", "init_weights_update_group",
            "update_weights_from_distributed",
            "destroy_weights_update_group"} <= used  # the reader sees the calls
    # the rollout shares the actor's slot: colocated, it releases its memory while training
    assert {"tp_size", "context_length", "mem_fraction_static", "random_seed",
            "enable_memory_saver"} <= kwargs
    sampling = backend_sampling_keys(BACKEND_SRC)
    assert "sampling_seed" in sampling
    assert contract_problems(sglang_root, kwargs, calls, sampling) == []
    # the output keys the parser reads are the ones the tokenizer manager writes
    tm = (sglang_root / "srt" / "managers" / "tokenizer_manager.py").read_text()
    assert 'meta_info["output_token_logprobs"] = ' in tm and '"output_ids": ' in tm
    assert (sglang_root / "srt" / "entrypoints" / "engine.py").is_file()  # start_engine's import


def test_the_contract_fails_on_a_wrong_name(sglang_root: Path) -> None:
    """vLLM's spelling of the TP size, a parameter SGLang does not take, an absent method and
    an unknown sampling key are each reported."""
    calls = [("update_weights_from_tensor", {"named_tensors", "flush"}), ("sleep", set())]
    assert contract_problems(sglang_root, {"tp_size", "tensor_parallel_size"}, calls,
                             {"max_new_tokens", "seed"}) == [
        "Engine(**kw): tensor_parallel_size is not a ServerArgs field",
        "Engine.update_weights_from_tensor takes no flush",
        "Engine has no method sleep",
        "SamplingParams has no seed"]


def test_the_gpu_hand_over_names_what_sglang_defines(sglang_root: Path) -> None:
    """The CUDA-IPC hand-over's contract with SGLang 0.5.23's source: the payload class
    `local_serialized` imports is where it says, a dataclass of `values` that SGLang's
    unpickler admits; `update_weights_from_tensor`'s default load unwraps it for the TP rank;
    the device argument the sender rewrites to a UUID is the one SGLang's patched rebuild maps
    back (`ipc.DEVICE_ARG`)."""
    from executors import ipc
    fn = next(n for n in ast.walk(_tree(BACKEND_SRC))
              if isinstance(n, ast.FunctionDef) and n.name == "local_serialized")
    [imp] = [n for n in ast.walk(fn) if isinstance(n, ast.ImportFrom)]
    module, name = imp.module or "", imp.names[0].name
    path = sglang_root.parent / (module.replace(".", "/") + ".py")
    cls = _class(_tree(path), name)
    assert [ast.unparse(a.target) for a in cls.body if isinstance(a, ast.AnnAssign)] == [
        "values"]
    common = (sglang_root / "srt" / "utils" / "common.py").read_text()
    assert f'"{module}",\n            "{name}",' in common  # SafeUnpickler.ALLOWED_GLOBALS
    updater = path.read_text()
    assert "isinstance(tensor, LocalSerializedTensor)" in updater
    assert "tensor = tensor.get(tp_rank)" in updater
    patch = (sglang_root / "srt" / "utils" / "patch_torch.py").read_text()
    assert f"_REDUCE_TENSOR_ARG_DEVICE_INDEX = {ipc.DEVICE_ARG}" in patch
    assert "def _device_from_maybe_uuid" in patch and "get_device_properties(device).uuid" in patch
