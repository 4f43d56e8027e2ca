"""`placer schema` and the job-format reference (docs/job-format.md) generated from it.

The reference must never drift from the models that check a job: the test regenerates it and
fails when the committed file differs (regenerate with `placer schema --markdown -o
docs/job-format.md`). Every example the reference shows is validated against its model here.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args

import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml
from pydantic import BaseModel

from placer.cli import main
from placer.commands.schema import EXAMPLES, job_schema, markdown, sections
from placer.spec import job as spec

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "job-format.md"


def test_the_reference_is_up_to_date() -> None:
    assert DOC.read_text() == markdown(), (
        "docs/job-format.md is stale: run `placer schema --markdown -o docs/job-format.md`")


def test_every_field_has_type_default_unit_and_example() -> None:
    """Each row of each section: type, default and example cells are filled; every field of
    every model appears once."""
    text = markdown()
    defs = {**job_schema()["$defs"], "Job": job_schema()}
    for section in sections():
        part = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
        rows = [r for r in part.splitlines() if r.startswith("| `")]
        assert [r.split("`")[1] for r in rows] == list(defs[section]["properties"]), section
        for r in rows:
            cells = [c.strip() for c in r.strip("|").split(" | ")]
            assert len(cells) == 6 and all(cells[i] for i in (1, 2, 3, 5)), r
            assert cells[5] != "-", (f"{section}: no example for {cells[0]}: add one to "
                                     "EXAMPLES in placer/commands/schema.py")


def _models(cls: type[BaseModel], out: dict[str, type[BaseModel]]) -> dict[str, type[BaseModel]]:
    """Every pydantic model reachable from `cls` by its fields, by class name (the schema's
    section names)."""
    if cls.__name__ in out:
        return out
    out[cls.__name__] = cls
    for f in cls.model_fields.values():
        for t in (f.annotation, *get_args(f.annotation)):
            for u in (t, *get_args(t)):
                if isinstance(u, type) and issubclass(u, BaseModel):
                    _models(u, out)
    return out


MODELS = _models(spec.Job, {})


def _filled(section: str, inst: dict[str, Any]) -> dict[str, Any]:
    """An example with its sub-sections ({} or [] placeholders) filled from their own
    examples."""
    props = {**job_schema()["$defs"], "Job": job_schema()}[section]["properties"]
    out = dict(inst)
    for key, value in inst.items():
        ref = props[key].get("$ref") or props[key].get("items", {}).get("$ref")
        if ref and value in ({}, []):
            sub = ref.rsplit("/", 1)[-1]
            if sub in EXAMPLES:
                first = _filled(sub, EXAMPLES[sub][0])
                out[key] = [first] if value == [] else first
    return out


def _kept(given: Any, dumped: Any, where: str) -> list[str]:
    """Where a validated model's JSON dump lost or changed a value the example gave (a
    placeholder `{}` or `[]` of a filled sub-section is not compared)."""
    if isinstance(given, dict) and isinstance(dumped, dict):
        return [w for k, v in given.items()
                for w in ([f"{where}.{k}: missing"] if k not in dumped
                          else _kept(v, dumped[k], f"{where}.{k}"))]
    if given in ({}, []):
        return []
    if isinstance(given, list) and isinstance(dumped, list) and len(given) == len(dumped):
        return [w for i, (g, d) in enumerate(zip(given, dumped))
                for w in _kept(g, d, f"{where}[{i}]")]
    return [] if given == dumped else [f"{where}: {given!r} became {dumped!r}"]


@pytest.mark.parametrize("section", [s for s in sections() if s != "Job"])
def test_examples_are_valid(section: str) -> None:
    """Each section has an example, every example validates against the model the schema was
    made from, and the model keeps every value the example shows (the reference would
    otherwise show an input that means something else)."""
    model = MODELS[section]
    examples = EXAMPLES.get(section, [])
    assert examples, f"{section}: no example in placer/commands/schema.py EXAMPLES"
    for inst in examples:
        dumped = model.model_validate(_filled(section, inst)).model_dump(mode="json")
        assert _kept(inst, dumped, section) == []


def test_the_json_schema_accepts_the_examples_and_refuses_a_typo(capsys) -> None:
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    jsonschema.Draft202012Validator.check_schema(schema)
    job = yaml.safe_load((ROOT / "examples" / "tiny-cpu.yaml").read_text())
    jsonschema.validate(job, schema)
    job["batch"]["minibatches"] = 2
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(job, schema)


def test_a_cpu_pool_may_give_cores_only_in_the_schema() -> None:
    pool = job_schema()["$defs"]["Pool"]
    jsonschema.validate({"name": "c", "device": "cpu-node", "cores_per_node": 64, "nodes": 8},
                        pool)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "c", "device": "cpu-node", "nodes": 8}, pool)


def test_markdown_to_a_file_and_response_lengths_per_turn(tmp_path, capsys) -> None:
    out = tmp_path / "ref.md"
    assert main(["schema", "--markdown", "-o", str(out)]) == 0
    text = out.read_text()
    assert text == markdown() and "PER TURN" in text
    assert main(["schema", "--markdown", "-o", str(tmp_path)]) == 2  # a folder: bad output
    assert "--out" in capsys.readouterr().err
