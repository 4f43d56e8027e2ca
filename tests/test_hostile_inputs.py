"""Hostile inputs, one by one: each exits 2 with one line naming the field or flag and the value
(never a traceback, a hang or an exhausted memory), and output paths are checked before work.

Each case guards against one kind of failure (a hang, a MemoryError, a ZeroDivisionError, a
traceback, or an error only after the work was done); `tests/test_fuzz_cli.py` searches for new
ones.
"""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

import executors.run
from executors.model import load_policy
from executors.run import MODEL_STAMP, prepare_model
from executors.runplan import resolve_plan
from executors.world import World
from placer.base.errors import SpecError
from placer.base.inputs import MAX_YAML_NODES, check_output, escape, load_json, load_yaml
from placer.cli import emit_json, main
from placer.solve.planfile import load_plan

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "examples" / "tiny-cpu.yaml"


def run_cli(argv: list[str]) -> tuple[int, str]:
    """(exit code, stderr) of `placer ARGV` in-process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, err.getvalue()


def bad(argv: list[str], *needles: str) -> str:
    rc, err = run_cli(argv)
    lines = err.splitlines()
    assert rc == 2, (rc, err)
    assert len(lines) == 1 and lines[0].startswith("placer: error: "), err
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hostile") / "plan.json"
    assert run_cli(["plan", str(TINY), "-o", str(path), "--time-limit", "2"])[0] == 0
    return path


EXECUTE = executors.run.execute  # the real one, for the tests that need its own checks


@pytest.fixture(autouse=True)
def no_ray(monkeypatch):
    """`placer execute` must fail before Ray starts; reaching it fails the test."""
    def started(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("execute got past validation")

    monkeypatch.setattr(executors.run, "execute", started)


def tiny(**changes: Any) -> dict[str, Any]:
    doc = yaml.safe_load(TINY.read_text())
    doc.update(changes)
    return doc


# ------------------------------------------------------------------------------------ YAML
def bomb(levels: int = 9) -> str:
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_alias_bomb_in_a_number_field(tmp_path) -> None:
    job = tmp_path / "bomb.yaml"
    job.write_text(bomb() + TINY.read_text().replace("seed: 0", "seed: *a8"))
    bad(["validate", str(job)], "aliases expand the document beyond", str(job))


def test_aliases_that_stay_small_still_work() -> None:
    assert load_yaml("base: &b {x: 1}\na: *b\nc: {<<: *b, y: 2}\n", "f") == {
        "base": {"x": 1}, "a": {"x": 1}, "c": {"x": 1, "y": 2}}
    with pytest.raises(SpecError, match="beyond"):
        load_yaml(bomb(7), "f")  # 10^6 leaves > MAX_YAML_NODES
    assert MAX_YAML_NODES < 10**6


def test_recursive_alias() -> None:
    with pytest.raises(SpecError, match="refers to the node that contains it"):
        load_yaml("x: &a [1, *a]\n", "f")


def test_duplicate_key_is_named(tmp_path) -> None:
    job = tmp_path / "dup.yaml"
    job.write_text(TINY.read_text() + "seed: 3\n")
    bad(["validate", str(job)], "duplicate key 'seed'", "line ")


def test_control_characters_are_escaped(tmp_path) -> None:
    job = tmp_path / "ctl.yaml"
    job.write_text(TINY.read_text().replace("device: emu-gpu", 'device: "emu\\e[2J\\ngpu"'))
    line = bad(["validate", str(job)], "cluster.pools.0.device")
    assert "\x1b" not in line and "\\x1b" in line
    assert escape("a\nb\x1b\u202e") == "a\\nb\\x1b\\u202e"


def test_a_newline_in_a_path_stays_on_one_line(tmp_path) -> None:
    bad(["validate", str(tmp_path / "a\nb.yaml")], "a\\nb.yaml: no such file")


def test_huge_integer_and_deep_nesting(tmp_path) -> None:
    job = tmp_path / "big.yaml"
    job.write_text(TINY.read_text().replace("seed: 0", "seed: " + "9" * 5000))
    bad(["validate", str(job)], "not valid YAML", "4300")
    job.write_text("a: " + "[" * 20000 + "]" * 20000 + "\n")
    bad(["validate", str(job)], "nested too deeply")


# ----------------------------------------------------------------------------- binary, sizes
def test_binary_workload(tmp_path, plan) -> None:
    work = tmp_path / "w.jsonl"
    work.write_bytes(bytes(range(256)) * 4)
    bad(["simulate", str(plan), "--workload", str(work)], "binary data", str(work))
    work.write_bytes(b'{"response_tokens": 5}\n\xff\xfe\n')
    bad(["simulate", str(plan), "--workload", str(work)], "not UTF-8", "0xff")


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_numbers_in_an_empirical_trace(tmp_path, plan, value) -> None:
    work = tmp_path / "w.jsonl"
    work.write_text('{"response_tokens": 5}\n' f'{{"response_tokens": {value}}}\n')
    bad(["simulate", str(plan), "--workload", str(work)], f"{work}:2", value)


@pytest.mark.parametrize("value", ["NaN", "Infinity"])
def test_non_finite_bundle_resources_in_a_plan(tmp_path, plan, value) -> None:
    text = plan.read_text()
    doc = json.loads(text)
    key = next(iter(doc["bundles"][0]["resources"]))
    doc["bundles"][0]["resources"][key] = 1.5
    bad_plan = tmp_path / "p.json"
    bad_plan.write_text(json.dumps(doc).replace("1.5", value, 1))
    bad(["simulate", str(bad_plan)], value)
    bad(["execute", str(bad_plan), "--steps", "1", "--out", str(tmp_path / "o")], value)
    yml = tmp_path / "p.yaml"  # YAML says .inf where JSON cannot
    doc["bundles"][0]["resources"][key] = float("inf")
    yml.write_text(yaml.safe_dump(doc))
    bad(["goodput", str(yml), "--steps", "5", "--trials", "1"], "bundles.0.resources", "inf")


def test_json_refuses_nan_but_reads_numbers() -> None:
    assert load_json('{"a": 1.5e3, "b": [1, -2]}', "f") == {"a": 1500.0, "b": [1, -2]}
    with pytest.raises(SpecError, match="NaN"):
        load_json('{"a": NaN}', "f")


def test_a_pool_of_a_billion_nodes(tmp_path) -> None:
    doc = tiny()
    doc["cluster"]["pools"][2]["nodes"] = 10**9
    job = tmp_path / "huge.yaml"
    job.write_text(yaml.safe_dump(doc))
    for cmd in ("validate", "plan"):
        bad([cmd, str(job)], "cluster", "1,000,000,002 nodes", "100,000")


def test_replan_adding_a_billion_nodes(plan) -> None:
    bad(["replan", str(plan), "--added", "cpu:1000000000"], "--added", "cpu:1000000000")


def test_goodput_trials_and_steps_are_bounded(plan) -> None:
    bad(["goodput", str(plan), "--trials", "1000000000"], "--trials", "1000000000")
    bad(["goodput", str(plan), "--steps", "1000000000000"], "--steps", "1000000000000")
    bad(["goodput", str(plan), "--hours", "1e9"], "--hours")


def test_simulated_work_is_bounded(plan) -> None:
    bad(["simulate", str(plan), "--iterations", "100000000"], "--iterations", "100000000")


def test_executed_batch_is_bounded(tmp_path, plan, monkeypatch) -> None:
    """The executor's own check (`executors.run.preflight`), before it starts any worker."""
    def started(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("execute got past validation")

    monkeypatch.setattr(executors.run, "execute", EXECUTE)
    monkeypatch.setattr(World, "local", started)
    monkeypatch.setattr(World, "ray", started)
    doc = json.loads(plan.read_text())
    doc["job"]["batch"] = {"prompts": 10**6, "samples_per_prompt": 4}
    p = tmp_path / "big.json"
    p.write_text(json.dumps(doc))
    bad(["execute", str(p), "--out", str(tmp_path / "o")], "plan.job.batch", "4,000,000")


@pytest.mark.parametrize("flag", ["--seed", "--sim-seed"])
def test_negative_seeds(plan, flag) -> None:
    if flag == "--seed":
        bad(["simulate", str(plan), "--seed", "-5"], "--seed", "-5")
        bad(["goodput", str(plan), "--seed", "-5", "--steps", "5"], "--seed", "-5")
        bad(["plan", str(TINY), "--seed", "-5"], "--seed", "-5")
        bad(["plan", str(TINY), "--seed", str(2**40)], "--seed", str(2**40))
    else:
        bad(["compare", str(TINY), "--simulate", "--sim-seed", "-5"], "--sim-seed", "-5")


def test_bad_flag_values_are_one_line(plan) -> None:
    bad(["simulate", str(plan), "--iterations", "x"], "--iterations", "'x'")
    bad(["plan", str(TINY), "--time-limit", "inf"], "--time-limit", "inf")
    bad(["simulate", str(plan), "--no-such-flag"], "--no-such-flag")


# ------------------------------------------------------------------- calibration and traces
def test_a_zero_calibration_factor(tmp_path, plan) -> None:
    cal = tmp_path / "cal.yaml"
    cal.write_text("default: {mfu_train: 0}\n")
    bad(["simulate", str(plan), "--calibration", str(cal)], "default.mfu_train", "got 0")
    bad(["validate", str(TINY), "--calibration", str(cal)], "default.mfu_train")
    cal.write_text("default: {mfu_train: 1.0e-320}\n")  # times overflowed to inf, then NaN
    bad(["simulate", str(plan), "--calibration", str(cal)], "default.mfu_train", "1e-320")
    cal.write_text("devices: {emu-gpu: {kv_mem_fraction: 1.5}}\n")
    bad(["validate", str(TINY), "--calibration", str(cal)], "devices.emu-gpu.kv_mem_fraction")


@pytest.mark.parametrize("metadata", ["a string", [1, 2], 7])
def test_trace_metadata_that_is_not_a_mapping(tmp_path, plan, metadata) -> None:
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": [], "metadata": metadata}))
    bad(["calibrate", str(trace), "--plan", str(plan)], "metadata", "expected a mapping")


def test_trace_with_infinite_duration(tmp_path, plan) -> None:
    trace = tmp_path / "t.json"
    trace.write_text('{"traceEvents": [{"ph": "X", "name": "n", "ts": 0, "dur": Infinity, '
                     '"pid": "p", "tid": "t"}]}')
    # refused where the file is parsed: a trace is JSON without Infinity, like every input
    bad(["calibrate", str(trace), "--plan", str(plan)], str(trace), "Infinity")


# ------------------------------------------------------------------------------ output paths
@pytest.mark.parametrize("argv, flag", [
    (["plan", str(TINY), "-o", "/proc/nope/plan.json"], "--output"),
    (["plan", str(TINY), "-o", "/dev/null"], "--output"),
    (["simulate", "{plan}", "--trace", "/proc/nope/t.json"], "--trace"),
    (["simulate", "{plan}", "--plots", "{plan}"], "--plots"),
    (["replan", "{plan}", "--lost", "cpu:1", "-o", "/sys/new.json"], "--output"),
    (["execute", "{plan}", "--out", "{plan}"], "--out"),
    (["execute", "{plan}", "--trace", "/proc/nope/t.json", "--out", "{tmp}/o"], "--trace"),
    (["calibrate", "{plan}", "-o", "/proc/nope/c.yaml"], "--out"),
    (["fidelity", "{plan}", "{plan}", "--plots", "/proc/nope"], "--plots"),
])
def test_unwritable_outputs_fail_before_any_work(tmp_path, plan, argv, flag) -> None:
    args = [a.replace("{plan}", str(plan)).replace("{tmp}", str(tmp_path)) for a in argv]
    bad(args, flag)


def test_check_output_accepts_new_files_and_folders(tmp_path) -> None:
    check_output(tmp_path / "new" / "deeper" / "plan.json", "-o")
    check_output(tmp_path, "--plots", folder=True)
    assert not (tmp_path / "new").exists()  # the probe leaves nothing behind
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------- a half-written --out
def test_a_half_written_model_dir_is_rebuilt(tmp_path, plan) -> None:
    p = resolve_plan(load_plan(plan)).job
    half = tmp_path / "model-v0"
    half.mkdir()
    (half / "config.json").write_text("{}")  # a run killed after the first file
    path = Path(prepare_model(p, tmp_path))
    assert (path / MODEL_STAMP).is_file()
    load_policy(path)  # loads: every later run into this --out works
    first = (path / MODEL_STAMP).stat().st_mtime_ns
    assert prepare_model(p, tmp_path) == str(path)  # complete: reused, not rebuilt
    assert (path / MODEL_STAMP).stat().st_mtime_ns == first
    assert [x.name for x in tmp_path.iterdir()] == ["model-v0"]  # no temporary folders left
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # cut short after it was written
    prepare_model(p, tmp_path)
    load_policy(path)


# --------------------------------------------------------------- found by tests/test_fuzz_cli.py
def test_a_huge_response_scale_in_a_simulator_config(tmp_path, plan) -> None:
    cfg = tmp_path / "sim.yaml"
    cfg.write_text("workload: {response_scale: 1.0e+18}\n")  # lengths overflowed int64
    bad(["simulate", str(plan), "--config", str(cfg)], "workload.response_scale", "1e+18")


def test_a_device_price_that_overflows(tmp_path) -> None:
    """A catalog device at 1e308 USD/hour under the cost objective overflowed the ILP's integer
    prices; prices are bounded like every other number (the most still plans)."""
    doc = tiny(objective="cost")
    dev = {"name": "pricey", "kind": "gpu", "memory_gb": 16, "bf16_tflops": 0.2,
           "mem_bw_gbs": 20, "intra_link_gbs": 5, "nic_gbs": 1, "can_train": True,
           "memory_is_host": True, "price_per_hour": 1e308}
    doc["catalog"] = {"devices": [dev]}
    doc["cluster"]["pools"][0]["device"] = "pricey"
    job = tmp_path / "pricey.yaml"
    job.write_text(yaml.safe_dump(doc))
    for cmd in ("validate", "plan"):
        bad([cmd, str(job)], "catalog.devices.0.price_per_hour", "1e+308")
    dev["price_per_hour"] = 1000.0
    job.write_text(yaml.safe_dump(doc))
    assert run_cli(["plan", str(job), "--time-limit", "2"])[0] == 0


@pytest.mark.parametrize("flag, value", [("--hours", "1e308"), ("--mtbf", "gpu:1e308"),
                                         ("--checkpoint-interval", "1e308"),
                                         ("--restart", "1e300")])
def test_goodput_times_that_overflow(plan, flag, value) -> None:
    bad(["goodput", str(plan), flag, value, "--trials", "1"], flag, "(got ")


def test_resume_needs_a_complete_checkpoint(tmp_path, plan) -> None:
    out = tmp_path / "out"
    bad(["execute", str(plan), "--out", str(out), "--resume"], "--resume", "no checkpoint")
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "latest.json").write_text('{"step": 1, "actor": "/nowhere/a.pt"}')
    bad(["execute", str(plan), "--out", str(out), "--resume", "--steps", "5"], "--resume",
        "missing file", "/nowhere/a.pt")
    (out / "checkpoints" / "latest.json").write_text('{"step": 1, "act')  # cut short
    bad(["execute", str(plan), "--out", str(out), "--resume"], "--resume", "incomplete")


def test_a_job_given_for_a_plan_and_a_plan_for_a_job_say_so(tmp_path, capsys) -> None:
    job = ROOT / "examples" / "tiny-cpu.yaml"
    assert main(["simulate", str(job)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "this is a job file, not a plan" in err
    assert f"placer plan {job} -o plan.json" in err
    plan = tmp_path / "plan.json"
    assert main(["plan", str(job), "-o", str(plan)]) == 0
    capsys.readouterr()
    assert main(["validate", str(plan)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "this is a plan, not a job file" in err


def test_json_output_is_strict_when_a_number_is_unbounded(capsys) -> None:
    # e.g. the MTBF of a job whose devices never fail: null, never Infinity or NaN
    emit_json({"job_mtbf_h": float("inf"), "rows": [{"error": float("nan")}, 1.5]})
    doc = json.loads(capsys.readouterr().out,
                     parse_constant=lambda c: pytest.fail(f"{c} in --json output"))
    assert doc == {"job_mtbf_h": None, "rows": [{"error": None}, 1.5]}
