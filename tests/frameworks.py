"""The frameworks' own validators, for the export and import tests.

verl: Hydra composes verl's shipped trainer config (`verl/trainer/config/ppo_trainer.yaml` or
`ppo_megatron_trainer.yaml`, from the installed verl 0.9.1 package) with the exported overrides;
a key the config lacks is a `ConfigCompositionException`, as it is for `verl.trainer.main_ppo`.
`verl_validate` then runs what main_ppo runs next, verl's own `validate_config` and the config
dataclasses' checks, from the installed package's files: its packages' `__init__.py` bodies are
skipped (they import tensordict and GPU timers), two helpers of verl/utils/model.py (tensordict,
model loading) are stubbed, and HFModelConfig's download from the Hub is skipped (no network).

OpenRLHF: `openrlhf/cli/train_ppo_ray.py` builds its parser and checks its arguments under
`if __name__ == "__main__":`, and `train()` asserts the colocation shapes before it starts Ray.
`openrlhf_parse` runs that source itself: the `__main__` block with `parse_args()` given the
exported argv and `train(args)` caught, then every `assert` of `train()` reached through `if`s that
read only `args` (those before Ray is needed). Nothing is copied: the statements are the file's.

KubeRay: the RayCluster/RayJob CRDs of KubeRay v1.7.0 (tests/data/kuberay, SOURCE.md) validate
the objects with jsonschema, strictly (an unknown field fails, as `kubectl --validate=strict`);
kubernetes-validate checks the core objects (the plan's ConfigMap, every pod template) against
Kubernetes' own schemas.
NeMo-RL (not installable without CUDA): `nemo_rl_errors` merges an exported recipe onto the
shipped base recipe its `defaults:` names (tests/data/nemo-rl, NeMo-RL 0.6.0 at 7ea279ab) as
NeMo-RL's `load_config_with_inheritance` does, and checks that every key it sets exists there with
a value of the same type, and is a field of NeMo-RL's config classes (MasterConfig down to
the vLLM and Megatron sections; excerpts in config_classes.py.txt, read with ast).

Miles (its parser imports SGLang and Megatron): `miles_parse` builds an argparse parser from
every `add_argument` / `reset_arg` call of miles/utils/arguments.py (flag, type, action, nargs,
choices; tests/data/miles/arguments.json, Miles 31f1ca96) plus the Megatron-LM and SGLang flags
Miles' own launch scripts pass to train.py, and parses the exported argv strictly (an unknown
flag, a wrong type or a choice outside Miles' list fails).

verl and openrlhf are installed without dependencies by the Makefile (`make venv`): their import
chains need CUDA builds; the tests only read their files.
"""
from __future__ import annotations

import ast
import gzip
import importlib.abc
import importlib.machinery
import importlib.util
import re
import sys
from functools import cache
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import yaml

DATA = Path(__file__).resolve().parent / "data"


def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)  # finds the package without importing it
    assert spec is not None and spec.submodule_search_locations, f"{name} is not installed"
    return Path(list(spec.submodule_search_locations)[0])


# ------------------------------------------------------------------------------------- verl
def verl_compose(config_name: str, overrides: list[str]) -> Any:
    from hydra import compose, initialize_config_dir

    cfg_dir = package_dir("verl") / "trainer" / "config"
    with initialize_config_dir(str(cfg_dir), version_base=None):
        return compose(config_name=config_name, overrides=overrides)


class _VerlPackages(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """verl's packages without their `__init__.py` bodies: verl/__init__.py imports
    `verl.protocol` (tensordict) and verl/utils/profiler/__init__.py its GPU timers, none of which
    the config checks use. A package's names resolve on first use from the submodules its
    `__init__.py` imports them from, so `from verl.trainer.config import CheckpointConfig` runs
    verl's own verl/trainer/config/config.py. Modules are verl's own files; nothing is copied."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "verl" and not fullname.startswith("verl."):
            return None
        d = self.root.joinpath(*fullname.split(".")[1:])
        if d.is_dir() and not d.with_suffix(".py").exists():  # config/algorithm/ is YAML
            spec = importlib.machinery.ModuleSpec(fullname, self, is_package=True)
            spec.submodule_search_locations = [str(d)]
            return spec
        return None

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        name = module.__name__
        d = self.root.joinpath(*name.split(".")[1:])
        module.__path__ = [str(d)]
        init = d / "__init__.py"
        text = init.read_text() if init.exists() else ""
        subs = re.findall(r"^from (?:\.|" + re.escape(name) + r"\.)(\w+) import", text, re.M)

        def lookup(attr: str) -> Any:
            for sub in subs:
                try:
                    found = importlib.import_module(f"{name}.{sub}")
                except ImportError:  # a submodule needing what is not installed (tensordict)
                    continue
                if hasattr(found, attr):
                    return getattr(found, attr)
            raise AttributeError(f"module {name!r} has no attribute {attr!r}")

        module.__getattr__ = lookup  # type: ignore[method-assign]


# verl/workers/config/model.py imports two helpers of verl/utils/model.py (tensordict, CUDA
# model loading); HFModelConfig is built only when a worker loads its model, never by the checks
_VERL_STUBS = {"verl.utils.model": ("get_generation_config", "update_model_config")}


@cache
def _verl_checks() -> tuple[Any, Any, Any]:
    """verl's `validate_config` (verl/utils/config.py, what `verl.trainer.main_ppo.main` runs
    first) and the two predicates main_ppo gives it (verl/trainer/ppo/utils.py)."""
    sys.meta_path.insert(0, _VerlPackages(package_dir("verl")))
    for mod, names in _VERL_STUBS.items():
        stub = ModuleType(mod)
        for n in names:
            def stubbed(*_a: Any, _n: str = f"{mod}.{n}", **_k: Any) -> Any:
                raise RuntimeError(f"{_n} is stubbed in the tests (needs CUDA/tensordict)")
            setattr(stub, n, stubbed)
        sys.modules[mod] = stub
    config = importlib.import_module("verl.utils.config")
    # a critic's config builds its HFModelConfig, whose __post_init__ downloads the checkpoint's
    # tokenizer and config.json from the Hugging Face Hub (no network here): skipped; the model
    # path itself the exporter takes from the catalog
    model = importlib.import_module("verl.workers.config.model")
    model.HFModelConfig.__post_init__ = lambda self: None
    # verl/trainer/ppo/utils.py and core_algos.py import the Ray worker and verl's torch helpers
    # (verl.protocol: tensordict) at the top; the two predicates main_ppo uses, and the enum they
    # read, are run from those files' own source
    ns: dict[str, Any] = {"warnings": __import__("warnings"), "DictConfig": Any,
                          "Enum": __import__("enum").Enum}
    _run_defs(("trainer", "ppo", "core_algos.py"), {"AdvantageEstimator"}, ns)
    _run_defs(("trainer", "ppo", "utils.py"), {"need_reference_policy", "need_critic"}, ns)
    return config.validate_config, ns["need_reference_policy"], ns["need_critic"]


def _run_defs(where: tuple[str, ...], names: set[str], ns: dict[str, Any]) -> None:
    """Run the top-level `def`s and `class`es called `names` of verl's file `where` in `ns`."""
    path = package_dir("verl").joinpath(*where)
    tree = ast.parse(path.read_text())
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))
            and n.name in names]
    assert {d.name for d in defs} == names, f"{path}: {names} not all found"
    exec(compile(ast.Module(body=defs, type_ignores=[]), str(path), "exec"), ns)


def verl_validate(cfg: Any) -> None:
    """verl 0.9's own checks of a composed config, as `verl.trainer.main_ppo.main` runs them
    before it starts Ray: the batch divisibility, the micro-batch settings, every config
    dataclass's `__post_init__` and `validate` (verl/workers/config/actor.py, critic.py).
    Raises what verl raises (AssertionError, ValueError)."""
    validate, need_ref, need_critic = _verl_checks()
    validate(config=cfg, use_reference_policy=need_ref(cfg), use_critic=need_critic(cfg))


# ---------------------------------------------------------------------------------- OpenRLHF
def _is_main(node: ast.stmt) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__")


class _Train(Exception):
    def __init__(self, args: Any) -> None:
        super().__init__("train")
        self.parsed = args


@cache
def _openrlhf_source() -> tuple[ast.Module, dict[str, Any]]:
    root = package_dir("openrlhf")
    tree = ast.parse((root / "cli" / "train_ppo_ray.py").read_text())
    spec = importlib.util.spec_from_file_location("_openrlhf_config", root / "utils" / "config.py")
    assert spec is not None and spec.loader is not None
    config = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(config)  # the hierarchize helper: plain Python, no imports
    return tree, {"hierarchize": config.hierarchize}


def openrlhf_parse(argv: list[str]) -> SimpleNamespace:
    """train_ppo_ray's own parsing and checks of `argv`; AssertionError or SystemExit (exit 2,
    a bad flag) when OpenRLHF would refuse it. Returns the hierarchical args `train` gets."""
    tree, helpers = _openrlhf_source()
    main = next(n for n in tree.body if _is_main(n))
    assert isinstance(main, ast.If)
    body = [s for s in main.body
            if not (isinstance(s, ast.ImportFrom) and s.module == "openrlhf.utils.config")]
    # the file's own standard-library imports (argparse, os, datetime); not Ray's or OpenRLHF's
    stdlib = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
              and all((a.name if isinstance(n, ast.Import) else n.module or "").split(".")[0]
                      in sys.stdlib_module_names for a in n.names)]
    block = ast.Module(body=stdlib + body, type_ignores=[])
    ns: dict[str, Any] = {"argparse": __import__("argparse"), "__name__": "openrlhf_check",
                          **helpers}

    def train(args: Any) -> None:
        raise _Train(args)

    ns["train"] = train
    real = ns["argparse"].ArgumentParser.parse_args

    def parse(self, args=None, namespace=None):
        return real(self, argv if args is None else args, namespace)

    ns["argparse"].ArgumentParser.parse_args = parse
    try:
        exec(compile(ast.fix_missing_locations(block), "train_ppo_ray.py", "exec"), ns)
    except _Train as t:
        _train_asserts(tree, t.parsed)
        return t.parsed
    finally:
        ns["argparse"].ArgumentParser.parse_args = real
    raise AssertionError("train_ppo_ray's __main__ block ended without calling train()")


def _reads_only_args(node: ast.AST) -> bool:
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    return names <= {"args"}


def _train_asserts(tree: ast.Module, args: Any) -> None:
    train = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "train")

    def walk(stmts: list[ast.stmt]) -> None:
        for s in stmts:
            if isinstance(s, ast.Assert) and _reads_only_args(s.test):
                ok = eval(compile(ast.Expression(s.test), "train", "eval"), {"args": args})
                assert ok, f"train_ppo_ray.train: {ast.unparse(s.test)}"
            elif isinstance(s, ast.If) and _reads_only_args(s.test):
                taken = eval(compile(ast.Expression(s.test), "train", "eval"), {"args": args})
                walk(s.body if taken else s.orelse)

    walk(train.body)


# ----------------------------------------------------------------------------------- KubeRay
@cache
def crd_schema(kind: str) -> dict[str, Any]:
    """The openAPIV3Schema of a KubeRay CRD (`rayclusters`, `rayjobs`), made strict."""
    text = gzip.decompress((DATA / "kuberay" / f"ray.io_{kind}.yaml.gz").read_bytes())
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd = yaml.load(text, Loader=loader)
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return _strict(version["schema"]["openAPIV3Schema"])


def _strict(schema: Any) -> Any:
    """Unknown fields fail: objects with `properties` get additionalProperties false, unless the
    schema keeps unknown fields on purpose (x-kubernetes-preserve-unknown-fields)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def crd_errors(doc: dict[str, Any], kind: str) -> list[str]:
    import jsonschema

    validator = jsonschema.Draft7Validator(crd_schema(kind))
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(doc)]


K8S_VERSION = "1.33"  # a Kubernetes release kubernetes-validate carries the schemas of


def k8s_errors(doc: dict[str, Any]) -> list[str]:
    """A core Kubernetes object against its release's OpenAPI schema, strictly (unknown fields
    fail); kubernetes-validate bundles the schemas."""
    import kubernetes_validate

    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [str(e).splitlines()[0]]
    return []


def pod_template(template: dict[str, Any]) -> dict[str, Any]:
    """A worker group's pod template as a core PodTemplate object, for `k8s_errors`."""
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
            "template": template}


# ------------------------------------------------------------------------------------- NeMo-RL
NEMO_RL_CONFIGS = DATA / "nemo-rl" / "examples" / "configs"


@cache
def _nemo_classes(ppo: bool) -> dict[str, ast.ClassDef]:
    """The config classes by name; PPO's MasterConfig (nemo_rl/algorithms/ppo.py) replaces
    GRPO's for a PPO recipe."""
    files = ["config_classes.py.txt"] + (["config_classes_ppo.py.txt"] if ppo else [])
    out: dict[str, ast.ClassDef] = {}
    for name in files:
        tree = ast.parse((DATA / "nemo-rl" / name).read_text())
        out.update({n.name: n for n in tree.body if isinstance(n, ast.ClassDef)})
    return out


def _nemo_fields(classes: dict[str, ast.ClassDef], name: str) -> dict[str, ast.expr]:
    """A config class's annotated fields, its bases' (in the excerpt) and its subclasses'
    (VllmConfig extends GenerationConfig with vllm_cfg)."""
    out: dict[str, ast.expr] = {}
    related = [name] + [b.id for b in classes[name].bases if isinstance(b, ast.Name)] + [
        c for c, node in classes.items()
        if any(isinstance(b, ast.Name) and b.id == name for b in node.bases)]
    for cls in related:
        for stmt in classes.get(cls, ast.ClassDef(name="", body=[])).body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                out.setdefault(stmt.target.id, stmt.annotation)
    return out


def _nemo_field_error(classes: dict[str, ast.ClassDef], key: str, value: Any) -> str | None:
    """Why `key` (dotted, from MasterConfig) is not a field of NeMo-RL's config classes with
    `value`'s type, or None."""
    owners = ["MasterConfig"]
    parts = key.split(".")
    for i, part in enumerate(parts):
        ann = next((f[part] for f in (_nemo_fields(classes, o) for o in owners) if part in f),
                   None)
        if ann is None:
            return f"{key}: {part!r} is not a field of {' | '.join(owners)}"
        if i == len(parts) - 1:
            text = ast.unparse(ann)
            want = {bool: "bool", int: "int", float: "float", str: "str"}.get(type(value), "")
            ok = want in text or (want == "int" and "float" in text) or repr(value) in text
            return None if ok else f"{key}: {value!r} does not fit {text}"
        owners = [n.id for n in ast.walk(ann) if isinstance(n, ast.Name) and n.id in classes]
        if not owners:
            return f"{key}: {part!r} is not a section ({ast.unparse(ann)})"
    return None


# Keys of the base recipes that NeMo-RL's workers read although its PolicyConfig TypedDict does
# not declare them (a TypedDict is not checked at run time): key -> where it is read, at 7ea279a
UNDECLARED_READ = {
    "policy.offload_optimizer_for_logprob": "nemo_rl/models/policy/workers/"
    "dtensor_policy_worker.py:269, megatron_policy_worker.py:514 (grpo_math_1B.yaml:139)",
}


def nemo_rl_errors(text: str) -> list[str]:
    """What NeMo-RL 0.6.0 would not accept in an exported recipe (module docstring)."""
    from placer.interop.nemorl import _flat, load_recipe

    data = yaml.safe_load(text)
    base_name = data.pop("defaults")
    base = _flat(load_recipe((NEMO_RL_CONFIGS / base_name).read_text(),
                             str(NEMO_RL_CONFIGS / base_name)))
    classes = _nemo_classes("ppo" in data)
    errors = []
    for key, value in _flat(data).items():
        if key not in base:
            errors.append(f"{key}: not in {base_name}")
        elif base[key] is not None and not isinstance(base[key], str) and \
                type(base[key]) is not type(value) and \
                not (isinstance(base[key], float) and type(value) is int):
            errors.append(f"{key}: {value!r} is not a {type(base[key]).__name__} as in {base_name}")
        error = None if key in UNDECLARED_READ else _nemo_field_error(classes, key, value)
        if error:
            errors.append(error)
    return errors + _nemo_setup_errors({**base, **_flat(data)})


def _nemo_setup_errors(cfg: dict[str, Any]) -> list[str]:
    """The asserts NeMo-RL 0.6.0 makes on these sections before it starts (restated, as its
    modules import CUDA libraries): nemo_rl/algorithms/grpo.py `setup` (a non-colocated
    generation takes GPUs of a one-node cluster or whole nodes, and leaves the policy some) and
    nemo_rl/models/generation/vllm/vllm_generation.py (world size a multiple of TP x PP; EP a
    multiple of TP; PP needs the async engine, DP inside vLLM refuses it)."""
    g = "policy.generation"
    tp, pp = cfg[f"{g}.vllm_cfg.tensor_parallel_size"], cfg[f"{g}.vllm_cfg.pipeline_parallel_size"]
    ep, eng = cfg[f"{g}.vllm_cfg.expert_parallel_size"], cfg[f"{g}.vllm_cfg.async_engine"]
    nodes, per = cfg["cluster.num_nodes"], cfg["cluster.gpus_per_node"]
    errors = []
    world = nodes * per
    if not cfg[f"{g}.colocated.enabled"]:
        r_per = cfg[f"{g}.colocated.resources.gpus_per_node"]
        r_nodes = cfg[f"{g}.colocated.resources.num_nodes"]
        if nodes == 1:
            world = r_per
            if r_nodes not in (None, 1) or not 0 < r_per < per:
                errors.append(f"colocated.resources: {r_nodes} x {r_per} on one node of {per}")
        else:
            world = r_nodes * per
            if r_per != per or not 0 < r_nodes < nodes:
                errors.append(f"colocated.resources: {r_nodes} x {r_per} of {nodes} x {per}")
    if world % (tp * pp):
        errors.append(f"vllm_cfg: {world} GPUs are not a multiple of TP {tp} x PP {pp}")
    if ep > 1 and ep % tp:
        errors.append(f"vllm_cfg.expert_parallel_size: {ep} is not a multiple of TP {tp}")
    if pp > 1 and not eng:
        errors.append("vllm_cfg: pipeline_parallel_size > 1 needs async_engine")
    if ep > 1 and ep != tp and eng:
        errors.append("vllm_cfg: DP inside vLLM (EP > TP) refuses async_engine")
    return errors


# --------------------------------------------------------------------------------------- Miles
@cache
def _miles_table() -> dict[str, Any]:
    import json
    return json.loads((DATA / "miles" / "arguments.json").read_text())


def miles_parse(argv: list[str]) -> Any:
    """The Namespace Miles' parser gives `argv` (module docstring); SystemExit on an unknown
    flag, a wrong type or a value outside a flag's choices, as argparse exits."""
    import argparse

    table = _miles_table()
    parser = argparse.ArgumentParser(allow_abbrev=False, add_help=False)
    types = {"int": int, "float": float, "str": str}
    actions = {"BooleanOptionalAction": argparse.BooleanOptionalAction}
    for flag, spec in table["miles_flags"].items():
        kw: dict[str, Any] = {}
        if "action" in spec:
            kw["action"] = actions.get(spec["action"], spec["action"])
        if spec.get("type") in types:
            kw["type"] = types[spec["type"]]
        for k in ("nargs", "choices"):
            if k in spec:
                kw[k] = spec[k]
        parser.add_argument(flag, **kw)
    for flag in table["passed_by_scripts"]:  # Megatron-LM's and SGLang's: a switch or values
        if flag not in parser._option_string_actions:  # not a --no-X of Miles' own flags
            parser.add_argument(flag, nargs="*")
    return parser.parse_args(argv)


# ------------------------------------------------------------------------------------- EasyR1
EASYR1 = DATA / "easyr1"


@cache
def _easyr1_classes() -> dict[str, dict[str, tuple[str, str | None, bool]]]:
    """Class -> field -> (annotation, the dataclass its default_factory builds, settable) from
    EasyR1's config dataclasses (tests/data/easyr1/config_classes.py.txt)."""
    tree = ast.parse((EASYR1 / "config_classes.py.txt").read_text())
    out: dict[str, dict[str, tuple[str, str | None, bool]]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        fields: dict[str, tuple[str, str | None, bool]] = {}
        for st in node.body:
            if not (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)):
                continue
            kw = {k.arg: k.value for k in st.value.keywords} if isinstance(st.value, ast.Call) else {}
            factory = kw.get("default_factory")
            init = kw.get("init")
            fields[st.target.id] = (ast.unparse(st.annotation),
                                    factory.id if isinstance(factory, ast.Name) else None,
                                    not (isinstance(init, ast.Constant) and init.value is False))
        out[node.name] = fields
    return out


def _easyr1_type_ok(annotation: str, value: Any) -> bool:
    if annotation.startswith("Optional["):
        return value is None or _easyr1_type_ok(annotation[len("Optional["):-1], value)
    base = annotation.split("[")[0].lower()
    checks = {"int": lambda v: isinstance(v, int) and not isinstance(v, bool),
              "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
              "bool": lambda v: isinstance(v, bool), "str": lambda v: isinstance(v, str),
              "tuple": lambda v: isinstance(v, list), "dict": lambda v: isinstance(v, dict)}
    return checks[base](value)


def easyr1_errors(text: str) -> list[str]:
    """What EasyR1's `OmegaConf.merge(OmegaConf.structured(PPOConfig()), file)` would refuse in
    a config file: a key that is no field, a value of another type, an auto (init=False) key."""
    classes = _easyr1_classes()
    errors: list[str] = []

    def walk(cls: str, node: dict[str, Any], path: str) -> None:
        for key, value in node.items():
            where = f"{path}{key}"
            spec = classes[cls].get(key)
            if spec is None:
                errors.append(f"{where}: not a field of {cls}")
                continue
            annotation, factory, settable = spec
            if not settable:
                errors.append(f"{where}: an auto key of {cls} (init=False)")
            elif factory in classes:
                if isinstance(value, dict):
                    walk(factory, value, where + ".")
                else:
                    errors.append(f"{where}: {factory} expects a mapping")
            elif not _easyr1_type_ok(annotation, value):
                errors.append(f"{where}: {value!r} is not {annotation}")

    doc = yaml.safe_load(text)
    walk("PPOConfig", doc, "")
    return errors


def easyr1_keys(doc: dict[str, Any], prefix: str = "") -> set[str]:
    """Every dotted leaf key of a config mapping."""
    out: set[str] = set()
    for k, v in doc.items():
        out |= easyr1_keys(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}"}
    return out
