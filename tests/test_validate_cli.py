"""`placer validate`: every example validates; `--json` prints exactly one JSON document."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from specdata import EXAMPLES, ROOT

from placer.cli import main
from placer.spec.catalog import resolve
from placer.spec.load import load_job, read_structured


def one_document(text: str):
    """Parse stdout as exactly one JSON document (nothing before or after it)."""
    doc, end = json.JSONDecoder().raw_decode(text.lstrip())
    assert text.lstrip()[end:].strip() == "", "more than one document on stdout"
    return doc


def test_all_examples_in_one_json_run(placer_cmd: list[str]) -> None:
    proc = subprocess.run([*placer_cmd, "validate", *map(str, EXAMPLES), "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    docs = one_document(proc.stdout)
    assert [d["name"] for d in docs] == [p.stem for p in EXAMPLES]
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_each_example_describes_its_roles(path: Path, capsys) -> None:
    assert main(["validate", str(path), "--json"]) == 0
    out = capsys.readouterr()
    doc = one_document(out.out)
    res = resolve(load_job(path))
    job = res.job
    assert doc["name"] == job.name and doc["algorithm"] == job.algorithm.value
    assert doc["samples"] == job.batch.samples and doc["max_context"] == job.max_context
    assert list(doc["roles"]) == job.role_names()  # AGENT.ROLE for a multi-agent job
    assert set(doc["pools"]) == {p.name for p in job.cluster.pools}
    for role, r in doc["roles"].items():
        m = res.model_of(role)
        if m is None:
            assert r["model"] is None and r["memory_floor_gb"] == 0
        else:
            per_param = 16 if role.rpartition(".")[2] in ("actor", "critic") else 2
            assert r["memory_floor_gb"] == pytest.approx(per_param * m.params() / 1e9, abs=1e-3)
        assert r["min_devices"], f"{role}: no pool can host it"
        for pool, n in r["min_devices"].items():
            assert n is None or 1 <= n <= doc["pools"][pool]["devices"]


def test_hetero_example_minimum_devices(capsys) -> None:
    main(["validate", str(ROOT / "examples" / "ppo-llama8b-hetero.yaml"), "--json"])
    roles = one_document(capsys.readouterr().out)["roles"]
    assert set(roles["actor"]["min_devices"]) == {"train"}  # L40S and LPUs do not train
    assert roles["rollout"]["min_devices"]["lpu"] == 77  # 16 GB of weights in 230 MB chips
    assert set(roles["environment"]["min_devices"]) == {"cpu"}


def test_text_output_names_every_role(capsys) -> None:
    path = ROOT / "examples" / "agentic-code.yaml"
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("agentic-code: grpo, 512 samples/iteration, async mode")
    for role in load_job(path).roles():
        assert f"\n  {role} " in out


def test_output_into_a_closed_pipe_is_not_a_traceback(placer_cmd: list[str]) -> None:
    """`placer validate ... | head -1`: the reader leaves early; placer exits quietly."""
    reader = subprocess.Popen(["head", "-c", "1"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    tiny = str(ROOT / "examples" / "tiny-cpu.yaml")  # ~600 bytes a copy: 300 overflow the pipe
    proc = subprocess.run([*placer_cmd, "validate", *[tiny] * 300], cwd=ROOT,
                          stdout=reader.stdin, stderr=subprocess.PIPE, text=True, timeout=300)
    reader.stdin.close()
    reader.wait()
    assert "Traceback" not in proc.stderr
    assert proc.returncode in (0, 141)


# ------------------------------------------------------------------ every mistake in one pass
MANY_MISTAKES = """\
name: many
algorithm: grpo
colour: blue
models: {policy: tiny-llama, reward: rule}
batch: {prompts: many, samples_per_prompt: 4}
lengths:
  prompt: {kind: fixed, value: 12}
  response: {kind: lognormal, median: 8}
pipeline: {mode: async}
cluster:
  pools:
    - {name: gpu, device: emu-gpu, devices_per_node: 2, nodes: 0}
"""


def test_every_mistake_is_reported_in_one_pass(tmp_path, capsys) -> None:
    """Five independent mistakes: five lines, each naming its field (and value), exit 2."""
    job = tmp_path / "many.yaml"
    job.write_text(MANY_MISTAKES)
    assert main(["validate", str(job)]) == 2
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert out.out == "" and "more]" not in out.err
    expected = ["colour: unknown key", "batch.prompts: Input should be a valid integer",
                "lengths.response: a lognormal distribution needs", "pipeline: async mode",
                "cluster.pools.0.nodes: Input should be greater than 0 (got 0)"]
    assert len(lines) == len(expected), lines
    for line, want in zip(sorted(lines), sorted(expected)):
        assert line.startswith(f"placer: error: {job}: ") and want in line, (line, want)
    assert any("(got 'many')" in line for line in lines)


# A schema error, an unknown device and an unknown model: three lines in one pass
THREE_MISTAKES = (("batch.prompts", "prompts: 128", "prompts: -5",
                   "batch.prompts: Input should be greater than 0 (got -5)"),
                  ("device", "device: H100-SXM", "device: H100",
                   "cluster.pools.0.device: unknown device type 'H100' (did you mean "
                   "'H100-SXM'?)"),
                  ("model", "policy: Qwen3-30B-A3B", "policy: Qwen3-30B-A3B-Instruct-2507",
                   "models.policy: unknown model 'Qwen3-30B-A3B-Instruct-2507' (did you mean "
                   "'Qwen3-30B-A3B'?)"))


def _three_mistakes(tmp_path: Path) -> Path:
    text = (ROOT / "examples" / "grpo-qwen3-30b-a3b.yaml").read_text()
    for _, good, bad, _ in THREE_MISTAKES:
        assert text.count(good) == 1
        text = text.replace(good, bad)
    job = tmp_path / "three.yaml"
    job.write_text(text)
    return job


def test_unknown_names_are_reported_with_the_schema_errors(tmp_path, placer_cmd) -> None:
    """`placer validate` (a real process: exit 2, no traceback) and `placer plan` print the
    three mistakes together, each naming its field and value, the names with a suggestion."""
    job = _three_mistakes(tmp_path)
    proc = subprocess.run([*placer_cmd, "validate", str(job)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 3, lines
    for line, (_, _, _, want) in zip(lines, THREE_MISTAKES):
        assert line.startswith(f"placer: error: {job}: {want}"), (line, want)
    assert main(["plan", str(job), "-o", str(tmp_path / "plan.json")]) == 2


def test_the_api_raises_the_same_three_lines(tmp_path) -> None:
    from placer import api
    from placer.base.inputs import SpecErrors
    job = _three_mistakes(tmp_path)
    for given in (job, read_structured(job)):
        with pytest.raises(SpecErrors) as e:
            api.validate(given)
        assert len(e.value.lines) == 3, e.value.lines
        for line, (_, _, _, want) in zip(e.value.lines, THREE_MISTAKES):
            assert want in line, (line, want)


def test_names_the_schema_refused_are_not_looked_up_again(tmp_path, capsys) -> None:
    """A device that is not text is the schema's one error; a pool naming the job's own device
    type counts it as known even when that entry has its own mistake. (A guard against false
    lines: before names were looked up beside the schema errors, this passed too.)"""
    text = (ROOT / "examples" / "tiny-cpu.yaml").read_text()
    text = text.replace("device: emu-gpu,", "device: 7,")
    text = text.replace("device: emu-lpu,", "device: my-lpu,")
    text += ("catalog:\n  devices:\n    - {name: my-lpu, kind: lpu, memory_gb: -1, "
             "bf16_tflops: 100, mem_bw_gbs: 1000, intra_link_gbs: 10, nic_gbs: 10, "
             "can_train: false}\n")
    job = tmp_path / "refused.yaml"
    job.write_text(text)
    assert main(["validate", str(job)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2, lines
    assert "cluster.pools.0.device: Input should be a valid string (got 7)" in lines[0]
    assert "catalog.devices.0.memory_gb:" in lines[1]


def test_checks_across_fields_are_reported_together(tmp_path, capsys) -> None:
    """Fields sound, two checks across them fail (a CPU pool in cores, an unknown model)."""
    text = (ROOT / "examples" / "tiny-cpu.yaml").read_text()
    text = text.replace("policy: tiny-llama", "policy: tiny-llama\n  critic: tiny-llama")
    text = text.replace("device: laptop-cpu, devices_per_node: 1",
                        "device: laptop-cpu, cores_per_node: 3")
    job = tmp_path / "two.yaml"
    job.write_text(text)
    assert main(["validate", str(job)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2, lines
    assert "models.critic: only PPO has a critic" in lines[0]
    assert "cluster.pools.2.cores_per_node: not a whole number of laptop-cpu" in lines[1]


def test_a_cpu_pool_in_cores(tmp_path, capsys) -> None:
    """cores_per_node gives a CPU pool's size in cores; devices_per_node is derived from it, and
    both together must agree; a GPU pool takes no cores_per_node."""
    from placer.spec.load import load_job
    base = (ROOT / "examples" / "grpo-qwen7b-h100.yaml").read_text()
    assert "device: cpu-node, devices_per_node: 1" in base
    job = tmp_path / "cores.yaml"
    job.write_text(base.replace("device: cpu-node, devices_per_node: 1",
                                "device: cpu-node, cores_per_node: 128"))
    pool = load_job(job).cluster.pools[-1]
    assert pool.devices_per_node == 2 and pool.cores_per_node == 128  # 2 x 64-core devices
    job.write_text(base.replace("device: cpu-node, devices_per_node: 1",
                                "device: cpu-node, devices_per_node: 1, cores_per_node: 128"))
    assert main(["validate", str(job)]) == 2
    assert "devices_per_node: 1 cpu-node devices of 64 cores are 64 cores, not cores_per_node " \
           "128" in capsys.readouterr().err
    job.write_text(base.replace("devices_per_node: 8", "devices_per_node: 8, cores_per_node: 8", 1))
    assert main(["validate", str(job)]) == 2
    assert "cores_per_node: applies to CPU pools only" in capsys.readouterr().err


def test_offloaded_optimizer_host_memory_per_node(capsys) -> None:
    """A role that only fits its fewest devices with the optimizer offloaded shows the host
    memory that puts on one node beside the node's RAM; a dense model on 1 device keeps all of
    its optimizer state there, 16 B/param with the pinned gradient buffer the host step copies
    into (`placer.cost.offload.HOST_OPTIMIZER_BYTES`; 12 B before that buffer was counted)."""
    path = ROOT / "examples" / "grpo-qwen7b-h100.yaml"
    assert main(["validate", str(path), "--json"]) == 0
    doc = one_document(capsys.readouterr().out)
    res = resolve(load_job(path))
    h = doc["roles"]["actor"]["offload_host_memory"]["h100"]
    assert h["devices"] == doc["roles"]["actor"]["min_devices"]["h100"] == 1
    m = res.model_of("actor")
    assert h["parts_gb"]["optimizer"] == pytest.approx(16 * m.params() / 1e9, abs=0.1)
    assert h["capacity_gb"] == res.device_of(res.cluster.pool("h100")).host_memory_gb
    assert h["total_gb"] == pytest.approx(sum(h["parts_gb"].values()), abs=0.2)
    assert h["fits"] and h["total_gb"] < h["capacity_gb"]
    assert doc["roles"]["rollout"]["offload_host_memory"] == {}  # inference: nothing offloaded
    assert doc["roles"]["actor"]["offload_host_memory"].keys() == {"h100"}  # CPU pool unchecked
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert (f"h100: optimizer offloaded at 1 device needs {h['total_gb']:,.1f} GB of host memory "
            f"per node of {h['capacity_gb']:,.0f}") in out


def test_host_memory_over_the_node_is_flagged(tmp_path, capsys) -> None:
    raw = load_job(ROOT / "examples" / "grpo-qwen7b-h100.yaml").model_dump(mode="json")
    raw["cluster"]["pools"][0]["host_memory_gb"] = 100  # below one device's offloaded state
    path = tmp_path / "small-host.yaml"
    path.write_text(json.dumps(raw))
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "GB of host memory per node of 100 (" in out and ": over, refused" in out
