"""Job and cluster specs: loading YAML and JSON, derived roles, distributions, dump and reload."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from pydantic import ValidationError
from specdata import EXAMPLES, base

from placer.base.errors import SpecError
from placer.spec.catalog import resolve
from placer.spec.distributions import Distribution
from placer.spec.load import dump_job, job_from_dict, load_job, read_structured, save_job
from placer.spec.sampling import draw, rng


# ------------------------------------------------------------------------------------ loading
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_loads(path: Path) -> None:
    job = load_job(path)
    assert job.name == path.stem
    assert job.batch.samples == job.batch.prompts * job.batch.samples_per_prompt


def test_yaml_and_json_load_the_same_job(tmp_path: Path) -> None:
    data = base()
    (tmp_path / "j.yaml").write_text(yaml.safe_dump(data))
    (tmp_path / "j.json").write_text(json.dumps(data))
    assert load_job(tmp_path / "j.yaml") == load_job(tmp_path / "j.json")


def test_cluster_may_live_in_its_own_file(tmp_path: Path) -> None:
    data = base()
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(data.pop("cluster")))
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({**data, "cluster": "cluster.yaml"}))
    job = load_job(tmp_path / "job.yaml")
    assert [p.name for p in job.cluster.pools] == ["gpu", "cpu"]


def test_json_syntax_error_names_line(tmp_path: Path) -> None:
    (tmp_path / "j.json").write_text('{"algorithm": "grpo",\n "batch": }')
    with pytest.raises(SpecError, match=r"j\.json: not valid JSON: line 2"):
        read_structured(tmp_path / "j.json")


def test_missing_file_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no such file"):
        load_job(tmp_path / "absent.yaml")


# -------------------------------------------------------------------------------------- roles
@pytest.mark.parametrize("algorithm, models, env, roles", [
    ("grpo", {"policy": "tiny-llama"}, "none", ["actor", "rollout", "reference", "reward"]),
    ("rloo", {"policy": "tiny-llama"}, "none", ["actor", "rollout", "reference", "reward"]),
    ("ppo", {"policy": "tiny-llama", "reward": "tiny-llama-rm"}, "none",
     ["actor", "rollout", "reference", "reward", "critic"]),
    ("grpo", {"policy": "tiny-llama", "use_reference": False}, "none",
     ["actor", "rollout", "reward"]),
    ("ppo", {"policy": "tiny-llama"}, "code",
     ["actor", "rollout", "reference", "reward", "critic", "environment"]),
    ("grpo", {"policy": "tiny-llama"}, "tool",
     ["actor", "rollout", "reference", "reward", "environment"]),
])
def test_roles_follow_the_algorithm(algorithm, models, env, roles) -> None:
    job = job_from_dict(base(algorithm=algorithm, models=models,
                             environment={"kind": env, "turns": 2 if env != "none" else 1}))
    assert job.roles() == roles


def test_critic_and_reference_default_to_the_policy_shape() -> None:
    res = resolve(job_from_dict(base(algorithm="ppo", models={"policy": "tiny-llama"})))
    assert res.model_of("critic").name == "tiny-llama"
    assert res.model_of("reference").name == "tiny-llama"
    assert res.model_of("reward") is None  # a rule
    res = resolve(job_from_dict(base(algorithm="ppo",
                                     models={"policy": "tiny-llama", "reward": "tiny-llama-rm"})))
    assert res.model_of("critic").name == "tiny-llama-rm"  # the critic starts from the RM


# ------------------------------------------------------------------------------ distributions
def _monte_carlo_mean(d: Distribution, n: int = 400_000) -> float:
    return float(draw(d, rng(7, 1), n).mean())


@pytest.mark.parametrize("spec", [
    {"kind": "normal", "mean": 256, "std": 64, "min": 32, "cap": 300},
    {"kind": "normal", "mean": 100, "std": 80, "min": 50},
    {"kind": "lognormal", "median": 1024, "sigma": 0.8, "cap": 8192},
    {"kind": "lognormal", "median": 100, "sigma": 1.2, "min": 40, "cap": 500},
    {"kind": "lognormal", "median": 100, "sigma": 0.5},
])
def test_mean_value_is_the_mean_of_clipped_draws(spec) -> None:
    d = Distribution(**spec)
    assert d.mean_value() == pytest.approx(_monte_carlo_mean(d), rel=0.01)


def test_lognormal_mean_closed_form() -> None:
    # uncapped: median * exp(sigma^2 / 2)
    assert Distribution(kind="lognormal", median=100, sigma=1.0).mean_value() == pytest.approx(
        100 * math.exp(0.5))
    # a cap far below the median pins every draw at the cap
    assert Distribution(kind="lognormal", median=1e6, sigma=0.1, cap=10).mean_value() == \
        pytest.approx(10, rel=1e-9)


def test_fixed_and_degenerate_distributions() -> None:
    assert Distribution(kind="fixed", value=7).mean_value() == 7
    assert Distribution(kind="fixed", value=7).max_value() == 7
    assert Distribution(kind="fixed", value=70, cap=50).mean_value() == 50  # draws are clipped
    assert Distribution(kind="normal", mean=5, std=0).mean_value() == 5
    assert Distribution(kind="lognormal", median=5, sigma=0, min=8).mean_value() == 8


def test_max_value_is_the_cap_or_a_far_quantile() -> None:
    assert Distribution(kind="lognormal", median=1024, sigma=0.8, cap=8192).max_value() == 8192
    assert Distribution(kind="normal", mean=100, std=10).max_value() == 140
    assert Distribution(kind="lognormal", median=10, sigma=0.5).max_value() == pytest.approx(
        10 * math.exp(2))
    d = Distribution(kind="normal", mean=100, std=10, cap=120)
    assert draw(d, np.random.default_rng(0), 10_000).max() <= d.max_value()


def test_empirical_distribution_reads_its_trace_next_to_the_job(tmp_path: Path) -> None:
    rows = [{"response_tokens": [10, 30]}, {"response_tokens": [20]}]
    (tmp_path / "w.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = base()
    data["lengths"]["response"] = {"kind": "empirical", "path": "w.jsonl",
                                   "field": "response_tokens", "cap": 25}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(data))
    d = load_job(tmp_path / "job.yaml").lengths.response
    assert Path(d.path).is_absolute()
    assert d.mean_value() == pytest.approx((10 + 25 + 20) / 3)
    assert d.max_value() == 25


def test_max_context_counts_every_turn() -> None:
    job = job_from_dict(base(environment={"kind": "tool", "turns": 3, "tool_output_tokens": 5}))
    assert job.max_context == 10 + 3 * 6 + 2 * 5


# ---------------------------------------------------------------------------------- round trip
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_dump_and_reload_round_trip(path: Path, suffix: str, tmp_path: Path) -> None:
    job = load_job(path)
    out = tmp_path / f"again{suffix}"
    save_job(job, out)
    again = load_job(out)
    assert again == job
    assert dump_job(again) == dump_job(job)
    assert job_from_dict(dump_job(job)) == job


def test_spec_objects_are_frozen() -> None:
    job = job_from_dict(base())
    with pytest.raises(ValidationError, match="frozen"):
        job.batch.prompts = 9  # type: ignore[misc]
    with pytest.raises(ValidationError, match="frozen"):
        job.cluster.pools[0].nodes = 5  # type: ignore[misc]
    # the refused assignments changed nothing: the job still equals a fresh load of its file
    assert (job.batch.prompts, job.cluster.pools[0].nodes, job.batch.samples) == (4, 1, 8)
    assert job == job_from_dict(base())


@pytest.mark.parametrize("catalog,needle", [("x", "catalog: expected a mapping, got 'x'"),
                                            ({"models": "y"}, "catalog.models: expected a list")])
def test_model_dir_with_a_malformed_catalog_names_the_field(catalog, needle) -> None:
    """A `{path: DIR}` model next to a catalog of the wrong shape: one SpecError, no crash (and
    a wrong-shaped catalog without model directories is the schema's to report)."""
    d = yaml.safe_load((Path(__file__).resolve().parent.parent / "examples" / "agentic-code.yaml")
                       .read_text())
    d["models"]["policy"] = {"path": "/nonexistent"}
    d["catalog"] = catalog
    with pytest.raises(SpecError, match=needle):
        job_from_dict(d, "h.yaml")
    d["models"]["policy"] = "Qwen2.5-7B"
    with pytest.raises(SpecError, match="catalog"):
        job_from_dict(d, "h.yaml")
