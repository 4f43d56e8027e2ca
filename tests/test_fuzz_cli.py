"""Property-based fuzzing of every command's files and flags: hostile input never escapes the
contract.

The contract (placer/cli.py): a command succeeds (0), or exits 2 with exactly one stderr line
`placer: error: ...`, or exits 3 (infeasible) - never a traceback, a hang or an exhausted memory.

Inputs are mutations of real ones: the example jobs, a plan solved from examples/tiny-cpu.yaml, a
simulated trace, a workload trace, a calibration profile and a simulator config. Mutations are
structural (a value replaced by a wrong type, a huge, negative, zero, NaN or infinite number, deep
nesting; a key deleted or added) or textual (binary garbage, truncation, an alias bomb, a
duplicate key, control characters, an empty file). Every command's numeric and path flags get
hostile values too. Commands run in-process through `placer.cli.main` with stdout and stderr
captured. `execute` is fuzzed up to the point where it would start Ray: `executors.run.execute`
is replaced by a stub, so only argument and plan validation run.

Hypothesis budgets are small (a few dozen examples per property) so the file runs in `make test`;
`KINDS` counts the input kinds exercised and the last test checks every kind was.
"""
from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placer.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
TINY = ROOT / "examples" / "tiny-cpu.yaml"
KINDS: Counter[str] = Counter()  # input kind -> examples run

# The suite's budget is small and derandomized (the same examples every run); a longer, random
# exploration: PLACER_FUZZ_EXAMPLES=300 pytest tests/test_fuzz_cli.py
EXAMPLES_PER_TEST = int(os.environ.get("PLACER_FUZZ_EXAMPLES", "25"))
FUZZ = settings(max_examples=EXAMPLES_PER_TEST, deadline=None, database=None,
                derandomize="PLACER_FUZZ_EXAMPLES" not in os.environ,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FEW = settings(FUZZ, max_examples=max(1, EXAMPLES_PER_TEST // 2))  # the slower commands


# --------------------------------------------------------------------------------- the contract
class WouldStartRay(Exception):
    """Raised by the stub that stands in for `executors.run.execute`."""


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """`placer ARGV` in-process: (exit code, stdout, stderr); an escaping exception fails."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def check(argv: list[str], kind: str) -> int:
    KINDS[kind] += 1
    try:
        rc, out, err = run_cli(argv)
    except WouldStartRay:
        return 0  # `execute` accepted every argument and the plan: validation is done
    assert "Traceback" not in out + err, (argv, err)
    assert rc in (0, 2, 3), (argv, rc, err)
    if rc == 2:
        lines = err.splitlines()  # one line per mistake (a job reports all of them at once)
        assert lines and all(ln.startswith("placer: error: ") for ln in lines), (argv, err)
    if rc == 0 and "--json" in argv:  # one strict JSON document: no NaN, no Infinity
        json.loads(out, parse_constant=lambda c: _not_json(c, argv))
    return rc


def _not_json(constant: str, argv: list[str]) -> float:
    raise AssertionError((argv, f"{constant} in the --json output"))


@pytest.fixture(scope="module", autouse=True)
def no_ray():
    """`placer execute` stops where Ray would start."""
    import executors.run

    def stub(*_a: Any, **_k: Any) -> Any:
        raise WouldStartRay

    saved = executors.run.execute
    executors.run.execute = stub
    yield
    executors.run.execute = saved


# --------------------------------------------------------------------------------- the inputs
@pytest.fixture(scope="module")
def base(tmp_path_factory) -> dict[str, Any]:
    """The real inputs every mutation starts from."""
    d = tmp_path_factory.mktemp("fuzz")
    plan = d / "plan.json"
    assert run_cli(["plan", str(TINY), "-o", str(plan), "--time-limit", "2"])[0] == 0
    trace = d / "trace.json"
    assert run_cli(["simulate", str(plan), "--trace", str(trace)])[0] == 0
    work = d / "work.jsonl"
    work.write_text("".join(json.dumps({"sample_id": i, "prompt_tokens": 12,
                                        "response_tokens": [8 + i % 5],
                                        "tool_latency_s": [0.05]}) + "\n" for i in range(40)))
    cal = {"default": {"mfu_train": 0.3, "decode_bw_eff": 0.6},
           "devices": {"emu-gpu": {"mfu_prefill": 0.4}}}
    sim = {"stragglers": {"fraction": 0.1, "slowdown_median": 2.0},
           "failures": {"mtbf_hours": {"emu-gpu": 100.0}, "checkpoint_every": 2},
           "network": {"bandwidth_factor": 0.5, "link_factors": {"send": 0.5}},
           "workload": {"lengths": "mean", "response_scale": 1.5}}
    return {"dir": d, "plan": plan, "plan_doc": json.loads(plan.read_text()), "trace": trace,
            "trace_doc": json.loads(trace.read_text()), "work": work, "cal": cal, "sim": sim,
            "jobs": {p.stem: yaml.safe_load(p.read_text()) for p in EXAMPLES}}


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path into a nested document (dict keys and list indices)."""
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:4]):  # a few items of long lists (bundles, events)
            out += _paths(v, (*prefix, i))
    return out


def _nested(depth: int) -> Any:
    v: Any = 1
    for _ in range(depth):
        v = [v]
    return v


HOSTILE_VALUES = st.one_of(
    st.sampled_from([None, True, "", "many", "\x1b[31mred\n\x00", [], {}, [1, 2], {"x": 1},
                     0, -1, -5, 1, 2**31, 10**9, 10**12, 10**30, 10**400, 1e308, -1e308,
                     math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-320]),
    st.integers(), st.floats(), st.text(max_size=12),
    st.integers(min_value=20, max_value=300).map(_nested),
)


@st.composite
def mutated(draw, doc: Any) -> tuple[str, Any]:
    """(mutation kind, document): one structural change at a random path."""
    doc = copy.deepcopy(doc)
    path = draw(st.sampled_from(_paths(doc)))
    op = draw(st.sampled_from(["replace", "replace", "replace", "delete", "add_key"]))
    if not path:
        return "top_level", draw(HOSTILE_VALUES)
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    key = path[-1]
    if op == "delete":
        del parent[key]
    elif op == "add_key" and isinstance(parent, dict):
        parent[draw(st.sampled_from(["colour", "nodes\n", "\x1b]0;x", "extra"]))] = 1
    else:
        op = "replace"
        parent[key] = draw(HOSTILE_VALUES)
    return op, doc


def _yaml_text(doc: Any) -> str:
    try:
        return yaml.safe_dump(doc, sort_keys=False)
    except (RecursionError, yaml.YAMLError):  # deeper than the dumper goes: write it as flow
        return json.dumps(doc, default=str)


def _json_text(doc: Any) -> str:
    try:
        return json.dumps(doc)  # NaN and Infinity as JavaScript writes them
    except (RecursionError, ValueError):
        return "[" * 100_000


def _bomb(field: str) -> str:
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    return "\n".join(lines) + f"\n{field}: *a8\n"


TEXT_MUTATIONS = ["binary", "truncated", "alias_bomb", "duplicate_key", "control_chars", "empty",
                  "deep_nesting", "recursive_alias", "not_utf8", "huge_int"]


def text_mutation(kind: str, text: str, field: str) -> str | bytes:
    """A hostile file made from `text` (a valid input) or from scratch."""
    made: dict[str, str | bytes] = {
        "binary": bytes(range(256)) * 4,
        "truncated": text[: len(text) // 2],
        "alias_bomb": _bomb(field) + text,
        "duplicate_key": text + f"\n{field}: 1\n{field}: 2\n",
        "control_chars": text.replace("tiny", "ti\x1b[2J\nny\r", 1) if "tiny" in text
        else "name: \"\\x1b[2J\\nx\"\n",
        "empty": "",
        "deep_nesting": "[" * 50_000 + "]" * 50_000,
        "recursive_alias": "x: &a [*a]\n",
        "not_utf8": text.encode() + b"\xff\xfe",
        "huge_int": f"{field}: {'9' * 5000}\n",
    }
    return made[kind]


def write(path: Path, data: str | bytes) -> Path:
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data)
    return path


# ------------------------------------------------------------------------------------- the jobs
@FUZZ
@given(data=st.data())
def test_jobs_validate(base, data) -> None:
    name = data.draw(st.sampled_from(sorted(base["jobs"])))
    op, doc = data.draw(mutated(base["jobs"][name]))
    path = write(base["dir"] / "job.yaml", _yaml_text(doc))
    check(["validate", str(path), "--json"], f"job:{op}")


@FUZZ
@given(kind=st.sampled_from(TEXT_MUTATIONS), field=st.sampled_from(["seed", "batch", "name"]))
def test_job_files_hostile_text(base, kind, field) -> None:
    path = write(base["dir"] / "job-text.yaml", text_mutation(kind, TINY.read_text(), field))
    check(["validate", str(path)], f"job:{kind}")


@FEW
@given(data=st.data())
def test_jobs_plan(base, data) -> None:
    op, doc = data.draw(mutated(base["jobs"]["tiny-cpu"]))
    path = write(base["dir"] / "job-plan.yaml", _yaml_text(doc))
    check(["plan", str(path), "--time-limit", "1", "--json"], f"plan-job:{op}")


# ------------------------------------------------------------------------------------ the plans
PLAN_COMMANDS = [
    ["simulate", "{p}", "--iterations", "1", "--json"],
    ["goodput", "{p}", "--iterations", "1", "--steps", "20", "--trials", "2"],
    ["execute", "{p}", "--steps", "1", "--out", "{d}/exec"],
    ["replan", "{p}", "--added", "cpu:1", "--time-limit", "1"],
]


def _argv(template: list[str], base: dict[str, Any], plan: Path) -> list[str]:
    return [a.replace("{p}", str(plan)).replace("{d}", str(base["dir"])) for a in template]


@FUZZ
@given(data=st.data())
def test_plans(base, data) -> None:
    op, doc = data.draw(mutated(base["plan_doc"]))
    cmd = data.draw(st.sampled_from(PLAN_COMMANDS))
    path = write(base["dir"] / "plan-m.json", _json_text(doc))
    check(_argv(cmd, base, path), f"plan:{op}")


@FUZZ
@given(kind=st.sampled_from(TEXT_MUTATIONS), cmd=st.sampled_from(PLAN_COMMANDS))
def test_plan_files_hostile_text(base, kind, cmd) -> None:
    text = base["plan"].read_text()
    path = write(base["dir"] / "plan-t.json", text_mutation(kind, text, "version"))
    check(_argv(cmd, base, path), f"plan:{kind}")


# ----------------------------------------------------- traces, workloads, profiles, sim configs
@FEW
@given(data=st.data())
def test_traces(base, data) -> None:
    doc = base["trace_doc"]
    small = {"traceEvents": doc["traceEvents"][:40], "metadata": doc.get("metadata", {}),
             "displayTimeUnit": "ms"}
    op, bad = data.draw(mutated(small))
    if data.draw(st.booleans()):
        op, bad = "metadata", {**small, "metadata": data.draw(HOSTILE_VALUES)}
    path = write(base["dir"] / "trace-m.json", _json_text(bad))
    cmd = data.draw(st.sampled_from([
        ["calibrate", str(path), "--plan", str(base["plan"]), "-o", str(base["dir"] / "c.yaml")],
        ["calibrate", str(path), "-o", str(base["dir"] / "c.yaml")],
        ["fidelity", str(base["plan"]), str(path)]]))
    check(cmd, f"trace:{op}")


@FEW
@given(kind=st.sampled_from(TEXT_MUTATIONS))
def test_trace_files_hostile_text(base, kind) -> None:
    path = write(base["dir"] / "trace-t.json",
                 text_mutation(kind, base["trace"].read_text()[:2000], "metadata"))
    check(["calibrate", str(path), "--plan", str(base["plan"])], f"trace:{kind}")


WORK_LINES = st.one_of(
    st.sampled_from(['{"response_tokens": NaN}', '{"response_tokens": Infinity}',
                     '{"response_tokens": -Infinity}', '{"response_tokens": 1e999}',
                     '{"response_tokens": [1, "x"]}', '{"response_tokens": -3}',
                     '{"response_tokens": true}', "[1, 2]", "{", '"text"', "",
                     '{"response_tokens": ' + "9" * 5000 + "}", '{"prompt_tokens": 1}',
                     '{"response_tokens": [[[[1]]]]}', "\x00\x01\x02"]),
    st.text(max_size=30))


@FUZZ
@given(lines=st.lists(WORK_LINES, min_size=0, max_size=4), keep=st.integers(0, 40))
def test_workloads(base, lines, keep) -> None:
    good = base["work"].read_text().splitlines()[:keep]
    path = write(base["dir"] / "work-m.jsonl", "\n".join(good + lines) + "\n")
    check(["simulate", str(base["plan"]), "--workload", str(path), "--json"], "workload:lines")


@FUZZ
@given(data=st.data())
def test_calibration_profiles(base, data) -> None:
    op, doc = data.draw(mutated(base["cal"]))
    if data.draw(st.booleans()):
        factor = data.draw(st.sampled_from(["mfu_train", "decode_bw_eff", "link_eff",
                                            "kv_mem_fraction", "offload_gbs", "lpu_kv_reserve",
                                            "tool_overhead_s", "nonsense"]))
        op = f"factor={factor}"
        doc = {"default": {factor: data.draw(HOSTILE_VALUES)}}
    path = write(base["dir"] / "cal-m.yaml", _yaml_text(doc))
    cmd = data.draw(st.sampled_from([["validate", str(TINY)], ["simulate", str(base["plan"])]]))
    check([*cmd, "--calibration", str(path), "--json"], f"calibration:{op}")


@FUZZ
@given(data=st.data())
def test_sim_configs(base, data) -> None:
    op, doc = data.draw(mutated(base["sim"]))
    if data.draw(st.booleans()):
        section = data.draw(st.sampled_from(["stragglers", "failures", "network", "workload",
                                             "record_tools", "nonsense"]))
        op = f"section={section}"
        doc = {section: data.draw(st.one_of(HOSTILE_VALUES, st.dictionaries(
            st.sampled_from(["fraction", "slowdown_cap", "mtbf_hours", "restart_s", "checkpoint_s",
                             "checkpoint_every", "bandwidth_factor", "x"]), HOSTILE_VALUES,
            max_size=3)))}
    path = write(base["dir"] / "sim-m.yaml", _yaml_text(doc))
    check(["simulate", str(base["plan"]), "--config", str(path), "--json"], f"simconfig:{op}")


# ------------------------------------------------------------------------------------ the flags
NUMBERS = st.one_of(
    st.sampled_from(["0", "-1", "-5", "1", "2", "1000000000", "1e9", "nan", "inf", "-inf",
                     "1e308", "0x10", "", "abc", "9" * 5000, "-0", "1_000", " 3"]),
    st.integers(-10**12, 10**12).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr))

FLAGS = {  # command -> [(flag, argv prefix)]
    "simulate": ["--iterations", "--seed"],
    "goodput": ["--iterations", "--seed", "--trials", "--steps", "--hours",
                "--checkpoint-interval", "--checkpoint-cost", "--restart", "--mtbf"],
    "plan": ["--time-limit", "--workers", "--seed", "--points"],
    "replan": ["--lost", "--added", "--move-cost", "--time-limit", "--workers"],
    "execute": ["--steps", "--max-restarts", "--deadline"],
    "compare": ["--iterations", "--sim-seed", "--workers"],
    "calibrate": ["--min-events"],
}


def _flag_value(flag: str, value: str) -> str:
    """POOL:N, TYPE:HOURS and ROLE=S flags take the number after their prefix."""
    return {"--lost": f"cpu:{value}", "--added": f"cpu:{value}", "--mtbf": f"gpu:{value}",
            "--deadline": f"rollout={value}"}.get(flag, value)


@settings(FUZZ, max_examples=2 * EXAMPLES_PER_TEST)  # many flags; most fail fast
@given(cmd=st.sampled_from(sorted(FLAGS)), data=st.data())
def test_numeric_flags(base, cmd, data) -> None:
    flag = data.draw(st.sampled_from(FLAGS[cmd]))
    value = _flag_value(flag, data.draw(NUMBERS))
    target = {"plan": str(TINY), "compare": str(TINY), "calibrate": str(base["trace"])}.get(
        cmd, str(base["plan"]))
    argv = [cmd, target, f"{flag}={value}"]
    if cmd == "goodput":
        argv += ["--trials", "2"] if flag != "--trials" else []
        argv += ["--steps", "20"] if flag not in ("--steps", "--hours") else []
        argv += ["--iterations", "1"] if flag != "--iterations" else []
    if cmd in ("plan", "replan", "compare") and flag != "--time-limit":
        argv += ["--time-limit", "1"]
    if cmd == "replan" and flag not in ("--lost", "--added"):
        argv += ["--added", "cpu:1"]  # feasible: the flag's own handling is what runs
    if cmd == "calibrate":
        argv += ["--plan", str(base["plan"]), "-o", str(base["dir"] / "cal-out.yaml")]
    if cmd == "execute":
        argv += ["--out", str(base["dir"] / "exec")]
    check(argv, f"flag:{cmd}{flag}")


HOSTILE_OUTPUTS = ["/proc/nope/out.json", "/proc/out.json", "/etc/passwd/x.json", "/dev/null",
                   "", "{d}", "{d}/plan.json/x", "/sys/out.json", "{d}/ok\n\x1b.json"]


@FUZZ
@given(where=st.sampled_from(HOSTILE_OUTPUTS), which=st.integers(0, 6))
def test_output_paths(base, where, which) -> None:
    out = where.replace("{d}", str(base["dir"]))
    p, t = str(base["plan"]), str(base["trace"])
    argv = [["plan", str(TINY), "-o", out, "--time-limit", "1"],
            ["simulate", p, "--trace", out],
            ["simulate", p, "--plots", out],
            ["execute", p, "--out", out],
            ["execute", p, "--trace", out, "--out", str(base["dir"] / "exec")],
            ["calibrate", t, "--plan", p, "-o", out],
            ["fidelity", p, t, "--plots", out]][which]
    rc = check(argv, f"output:{argv[0]}")
    folder = which in (2, 3, 6)  # --plots and --out name folders: an existing one is fine
    # a strange name in a writable folder is allowed; everything else is refused up front
    if where != "{d}/ok\n\x1b.json" and not (folder and where == "{d}"):
        assert rc == 2, (argv, rc)


# ---------------------------------------------------------------------------- what was covered
def test_every_input_kind_was_exercised() -> None:
    """Runs last (file order): every family of inputs got examples, and the counts are shown."""
    families: Counter[str] = Counter()  # family -> examples run
    for kind, n in KINDS.items():
        families[kind.split(":")[0]] += n
    print("\nfuzzed input kinds:", json.dumps(dict(sorted(KINDS.items())), indent=1))
    print("families:", dict(families), "total:", sum(KINDS.values()))
    for fam in ("job", "plan-job", "plan", "trace", "workload", "calibration", "simconfig",
                "flag", "output"):
        assert families[fam] > 0, fam
    kinds = Counter(k.split(":")[0] for k in KINDS)  # family -> distinct kinds
    print("distinct kinds per family:", dict(kinds), "in all:", len(KINDS))
    assert {f"job:{k}" for k in TEXT_MUTATIONS} <= set(KINDS)
    # hypothesis stops early once a small space (a mutation x a field) is exhausted
    assert sum(KINDS.values()) >= 4 * EXAMPLES_PER_TEST
