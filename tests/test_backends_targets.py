"""The executor's and the front end's registries: rollout backends (`executors.backends`) and
export targets (`placer.interop.targets`); the spec's are in test_registries.py. Each variant is
one class there; an unknown name is one error line naming the field and the known names (exit 2
at the CLI); and no code outside the registry compares a variant's name (a scan of the source,
so that a new branch on a name fails here instead of drifting from the registry)."""
from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest
from exec_util import GRPO_LAYOUT, hand_plan

import placer
from executors.backends import BACKENDS, Backend, backend_of, backends_help
from placer.base.errors import SpecError
from placer.interop.targets import TARGETS, Target, importer_of, target_of
from placer.solve.planfile import save_plan

ROOT = Path(__file__).resolve().parents[1]


def test_each_variant_is_one_class() -> None:
    assert list(BACKENDS) == ["torch", "vllm", "sglang"]
    assert all(isinstance(b, Backend) and type(b).name == n for n, b in BACKENDS.items())
    assert len({type(b) for b in BACKENDS.values()}) == len(BACKENDS)
    assert list(TARGETS) == ["verl", "openrlhf", "nemo-rl", "miles", "easyr1", "kuberay"]
    assert all(isinstance(t, Target) and type(t).name == n for n, t in TARGETS.items())
    assert [t.name for t in TARGETS.values() if t.imports] == ["verl", "openrlhf", "nemo-rl",
                                                               "miles", "easyr1"]
    assert backends_help() == "torch, vllm (the gpu extra) or sglang (the sglang extra)"


def test_unknown_names_name_the_field_and_the_known_ones() -> None:
    with pytest.raises(SpecError, match=r"^--backend: unknown backend 'tpu' \(expected one of "
                                        r"torch, vllm, sglang\)$"):
        backend_of("tpu")
    with pytest.raises(SpecError, match=r"^framework: unknown export target 'trlx' \(expected "
                                        r"one of verl, openrlhf, nemo-rl, miles, easyr1, kuberay\)$"):
        target_of("trlx")
    with pytest.raises(SpecError, match=r"^framework: no importer for 'kuberay' \(expected one "
                                        r"of verl, openrlhf, nemo-rl, miles, easyr1\)$"):
        importer_of("kuberay")


def test_a_target_takes_its_own_options_only() -> None:
    plan = hand_plan(GRPO_LAYOUT)
    e = placer.export(plan, "kuberay", image="example.com/p:1", steps=3)
    assert "--steps 3" in e.files["rayjob.yaml"] and "example.com/p:1" in e.files["rayjob.yaml"]
    with pytest.raises(SpecError, match=r"^image: applies to kuberay only \(got framework "
                                        r"'verl'\)$"):
        placer.export(plan, "verl", image="example.com/p:1")


@pytest.mark.parametrize("argv, line", [
    (["export", "trlx", "{plan}"], "framework: unknown export target 'trlx' (expected one of "
                                   "verl, openrlhf, nemo-rl, miles, easyr1, kuberay)"),
    (["import", "kuberay", "{plan}", "--json"], "framework: no importer for 'kuberay' (expected "
                                                "one of verl, openrlhf, nemo-rl, miles, easyr1)"),
    (["import", "trlx", "{plan}", "--json"], "framework: unknown framework 'trlx' (expected "
                                             "one of verl, openrlhf, nemo-rl, miles, easyr1)"),
    (["execute", "{plan}", "--backend", "tpu"], "--backend: unknown backend 'tpu' (expected one "
                                                "of torch, vllm, sglang)"),
])
def test_an_unknown_name_at_the_cli_is_one_line_and_exit_2(tmp_path, placer_cmd, argv,
                                                            line) -> None:
    plan = tmp_path / "plan.json"
    save_plan(hand_plan(GRPO_LAYOUT), plan)
    out = subprocess.run(placer_cmd + [a.replace("{plan}", str(plan)) for a in argv],
                         capture_output=True, text=True)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == f"placer: error: {line}\n"


# --------------------------------------------------------------------------- no name branches
def name_comparisons(path: Path, names: set[str]) -> list[str]:
    """`x == "name"`, `x != "name"`, `x in ("name", ...)` and `match` cases on a name in a
    module's source: where the code branches on a variant's name."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        consts: list[ast.expr] = []
        if isinstance(node, ast.Compare):
            for c in [node.left, *node.comparators]:
                consts += c.elts if isinstance(c, (ast.Tuple, ast.List, ast.Set)) else [c]
        elif isinstance(node, ast.MatchValue):
            consts = [node.value]
        hit = [c.value for c in consts if isinstance(c, ast.Constant) and c.value in names]
        if hit:
            out.append(f"{path.name}:{node.lineno}: {hit[0]!r}")
    return out


def _sources(*tops: str) -> list[Path]:
    return sorted(p for top in tops for p in (ROOT / top).rglob("*.py"))


def test_the_scan_finds_a_name_branch(tmp_path) -> None:
    code = tmp_path / "x.py"
    code.write_text("def f(b, t):\n    if b == 'vllm' or t in ('kuberay', 'x'):\n"
                    "        return 1\n    match t:\n        case 'verl':\n            return 2\n"
                    "    return b == 'other'\n")
    assert name_comparisons(code, {"vllm", "kuberay", "verl"}) == [
        "x.py:2: 'vllm'", "x.py:2: 'kuberay'", "x.py:5: 'verl'"]


def test_no_code_outside_a_registry_compares_a_variants_name() -> None:
    backends = [p for p in _sources("executors", "placer", "workflows", "bench")
                if p != ROOT / "executors" / "backends.py"]
    targets = [p for p in _sources("placer", "workflows", "bench")
               if p != ROOT / "placer" / "interop" / "targets.py"]
    found = [x for p in backends for x in name_comparisons(p, set(BACKENDS))]
    found += [x for p in targets for x in name_comparisons(p, set(TARGETS))]
    assert found == []
