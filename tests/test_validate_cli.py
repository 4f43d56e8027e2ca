"""`placer validate`: every example validates; `--json` prints exactly one JSON document."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from specdata import EXAMPLES, ROOT

from placer.catalog import resolve
from placer.cli import main
from placer.spec import load_job


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
    assert list(doc["roles"]) == job.roles()
    assert set(doc["pools"]) == {p.name for p in job.cluster.pools}
    for role, r in doc["roles"].items():
        m = res.model_of(role)
        if m is None:
            assert r["model"] is None and r["memory_floor_gb"] == 0
        else:
            per_param = 16 if role in ("actor", "critic") else 2
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
