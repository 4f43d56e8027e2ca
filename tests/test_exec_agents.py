"""A multi-agent episode as the executor builds it (`executors.agents`): the turn schedule with
each agent's budget, the shared context every turn reads, and each agent's own training
samples (its turns in the loss, the other agents' as context). Pure functions: no workers."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from executors.agents import (
    Episode,
    Turn,
    agent_samples,
    answerer,
    judged_turn,
    literal_result,
    roles_by_agent,
    turn_plan,
    verdict_score,
)
from placer.spec.load import load_job

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "examples" / "multiagent-tiny-cpu.yaml"


def _plan() -> list[Turn]:
    job = load_job(TINY)
    assert job.agents is not None
    return turn_plan(job.agents, job.lengths.response)


def test_turns_follow_the_schedule_with_each_agents_budget() -> None:
    assert _plan() == [Turn(0, "solver", 8), Turn(1, "verifier", 4), Turn(2, "solver", 8)]


def test_each_turn_reads_the_whole_episode_so_far() -> None:
    turns = _plan()
    e = Episode([1, 2])
    assert e.context() == [1, 2]
    e.append(turns[0], [3, 4], [-0.1, -0.2])
    assert e.context() == [1, 2, 3, 4]
    e.append(turns[1], [5], [-0.3])
    e.append(turns[2], [6, 7], [-0.4, -0.5])
    assert e.context() == [1, 2, 3, 4, 5, 6, 7]
    assert e.last_of("solver") == [6, 7] and e.last_of("verifier") == [5]
    assert e.last_of("nobody") == []


def test_turns_run_only_in_schedule_order() -> None:
    turns = _plan()
    e = Episode([1])
    with pytest.raises(ValueError, match="turn 1 .verifier. appended after 0"):
        e.append(turns[1], [5], [-0.3])
    e.append(turns[0], [3], [-0.1])
    with pytest.raises(ValueError, match="turn 0"):
        e.append(turns[0], [3], [-0.1])  # the same turn twice
    with pytest.raises(ValueError, match="2 tokens, 1 log-probs"):
        e.append(turns[1], [5, 6], [-0.3])


def test_each_agent_trains_on_its_own_turns_only() -> None:
    turns = _plan()
    e = Episode([1, 2])
    e.append(turns[0], [3, 4], [-0.1, -0.2])
    e.append(turns[1], [5], [-0.3])
    e.append(turns[2], [6], [-0.4])
    solver = agent_samples([e], ["s0"], ["p0"], "solver", 3)
    verifier = agent_samples([e], ["s0"], ["p0"], "verifier", 2)
    for s in (solver, verifier):  # both read the same episode
        assert s.prompts == [[1, 2]] and s.responses == [[3, 4, 5, 6]] and s.group == ["p0"]
    assert solver.gen_mask == [[1, 1, 0, 1]] and solver.logprobs == [[-0.1, -0.2, 0.0, -0.4]]
    assert verifier.gen_mask == [[0, 0, 1, 0]] and verifier.logprobs == [[0.0, 0.0, -0.3, 0.0]]
    assert (solver.version, verifier.version) == (3, 2)
    assert solver.generated_tokens() == 3 and verifier.generated_tokens() == 1
    assert solver.answer(0) == [6]  # after the last token it did not generate


def test_roles_group_by_agent() -> None:
    got = roles_by_agent(["solver.actor", "solver.rollout", "verifier.actor", "environment"])
    assert got == {"solver": {"actor": "solver.actor", "rollout": "solver.rollout"},
                   "verifier": {"actor": "verifier.actor"}, "": {"environment": "environment"}}


class _Answers:
    """Workers that answer the group-forming calls at once (`executors.runtime.Calls`)."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids

    def call(self, m, method: str, *args: object):
        from executors.runtime import Outcome
        return Outcome(True, {"sync_member": ("cpu", 1, self.pids[m.role] + m.rank),
                              "sync_host": ("127.0.0.1", 29500), "sync_join": True}[method])

    def results(self, handles):
        return list(handles)

    def forget(self, handle) -> None:
        pass


def test_two_agents_refresh_paths_of_one_key_keep_groups_of_their_own() -> None:
    """Both agents' engines take the same path key (bucket size, colocation): under their own
    scopes each keeps its group across refreshes; under one scope they would evict each
    other's group and re-form it every sync."""
    from types import SimpleNamespace

    from executors.weights import GroupRefresh
    ms = {a: ([SimpleNamespace(role=f"{a}.actor", rank=0)],
              [SimpleNamespace(role=f"{a}.rollout", rank=0)]) for a in ("solver", "verifier")}
    rt = _Answers({"solver.actor": 100, "solver.rollout": 200, "verifier.actor": 300,
                   "verifier.rollout": 400})
    scoped = GroupRefresh(rt)  # type: ignore[arg-type]
    specs = {a: [scoped.group(0, *ms[a], scope=a) for _ in range(3)] for a in ms}
    assert scoped.formed == 2 and specs["solver"][0].name != specs["verifier"][0].name
    assert all(len(set(v)) == 1 for v in specs.values())
    shared = GroupRefresh(rt)  # type: ignore[arg-type]
    for _ in range(3):
        for a in ms:
            shared.group(0, *ms[a])
    assert shared.formed == 6


def test_the_last_turns_agent_answers_and_the_others_review_the_turn_before() -> None:
    job = load_job(TINY)
    assert job.agents is not None
    assert answerer(job.agents) == "solver"
    assert judged_turn(job.agents, "verifier") == 0  # the solver's first answer
    with pytest.raises(ValueError, match="nothing to review"):
        judged_turn(job.agents.model_copy(update={"turns": ["verifier", "solver"]}), "verifier")


@pytest.mark.parametrize(("answer", "want"), [
    (" 7 ", {"status": "ok", "value": "7"}), ("3+4", {"status": "error", "value": ""}),
    ("", {"status": "error", "value": ""})])
def test_answers_are_read_as_numbers_not_run(answer: str, want: dict[str, str]) -> None:
    assert literal_result(answer) == want


@pytest.mark.parametrize(("verdict", "exact", "want"), [
    ("yes", True, 1.0), ("no", False, 1.0), ("yes", False, 0.4), ("3/10", True, 0.4),
    ("", True, 0.0), ("ye#!", True, 0.1), ("qqqq", False, 0.0)])
def test_a_verdict_is_rewarded_for_agreeing_with_the_rule(verdict: str, exact: bool,
                                                          want: float) -> None:
    assert verdict_score(verdict, exact) == pytest.approx(want)


# ---------------------------------------------------------------- planned, then executed on Ray
STEPS = 2


def _planned(**agent_changes: object):
    from placer.cost.pricer import Pricer
    from placer.solve.planner import plan_job
    from placer.spec.catalog import resolve
    from placer.spec.load import job_from_dict
    data = yaml.safe_load(TINY.read_text())
    for name, change in agent_changes.items():
        data["agents"]["members"][name].update(change)
    return plan_job(Pricer(resolve(job_from_dict(data))))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from exec_util import run_module  # lazy: Ray and torch only for the run
    plan = _planned()
    out = tmp_path_factory.mktemp("agents")
    return plan, run_module(plan, STEPS, out)


@pytest.mark.ray  # the module's Ray run (`run`)
def test_every_agent_role_runs_where_and_as_the_plan_says(run) -> None:
    from executors.runplan import actor_counts
    plan, result = run
    assert result.ledger_ok, result.ledger_problems
    assert len(result.stats) == STEPS
    rows = result.placement
    assert all(r["in_bundle"] and r["on_plan_node"] for r in rows)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["role"]] = counts.get(r["role"], 0) + 1
        assert r["pool"] == plan.roles[r["role"]].pool
    assert counts == actor_counts(plan)
    executed = result.trace.metadata["executed_layout"]
    assert set(executed) == {f"{a}.{r}" for a in ("solver", "verifier")
                             for r in ("actor", "rollout")}
    for name, got in executed.items():
        want = plan.roles[name]
        assert (got["dp"], got["tp"], got["pp"]) == (want.dp, want.tp, want.pp), name


@pytest.mark.ray  # the module's Ray run (`run`)
def test_each_turn_runs_on_its_agents_engines_in_schedule_order(run) -> None:
    plan, result = run
    engines = {r["role"]: {(f"{r['pool']}:{r['node']}", f"{r['role']}{r['rank']}")
                           for r in result.placement if r["role"].endswith(".rollout")}
               for r in result.placement}
    for step in range(STEPS):
        gens = sorted((e for e in result.trace.of("generate") if e.args["step"] == step),
                      key=lambda e: e.ts_s)
        assert [(e.args["turn"], e.args["role"]) for e in gens] == [
            (0, "solver.rollout"), (1, "verifier.rollout"), (2, "solver.rollout")]
        for a, b in zip(gens, gens[1:]):  # a turn reads the one before: it starts after it
            assert b.ts_s >= a.ts_s + a.dur_s
        for e in gens:
            assert (e.pid, e.tid) in engines[e.args["role"]]
            assert e.args["policy_version"] == step  # synced from step 1 on
            assert len(e.args["sample_ids"]) == 16


@pytest.mark.ray  # the module's Ray run (`run`)
def test_both_agents_weights_were_trained(run) -> None:
    import torch
    from safetensors.torch import load_file
    _, result = run
    out = Path(result.out_dir)
    for agent in ("solver", "verifier"):
        before = load_file(str(out / agent / "model-v0" / "model.safetensors"))
        after = torch.load(out / agent / "final.pt", weights_only=False)["model"]
        shared = [k for k in after if k in before]
        assert shared, agent
        assert any(not torch.equal(before[k], after[k].to(before[k].dtype)) for k in shared), agent
        trains = [e for e in result.trace.of("train") if e.args["role"] == f"{agent}.actor"]
        assert len(trains) == STEPS
    assert {k.split(".")[0] for c in result.trace.counters for k in c.values} == {
        "solver", "verifier"}


@pytest.mark.ray  # the module's Ray run (`run`)
def test_each_agents_engines_take_its_own_trainers_weights_by_the_sync_group(run) -> None:
    """Each agent's engines are refreshed from its own trainer by the single-policy machinery
    (`executors.weights.refresh_paths`): every sync carries exactly that agent's weight bytes
    (the two policies differ in size), from its own trainer ranks, over a weight-sync group or
    the colocated hand-over; Ray carried only control messages, a small fraction of them."""
    import torch
    _, result = run
    out = Path(result.out_dir)
    for agent in ("solver", "verifier"):
        model = torch.load(out / agent / "final.pt", weights_only=False)["model"]
        syncs = [e for e in result.trace.of("sync") if e.args.get("role") == f"{agent}.rollout"]
        engines = sum(1 for r in result.placement if r["role"] == f"{agent}.rollout")
        assert len(syncs) == engines * (STEPS - 1), agent  # from step 1 on, every engine
        for e in syncs:
            assert e.args["backend"] in ("gloo", "shm"), e.args
            assert set(e.args["src"].split(",")) <= {
                f"{agent}.actor{r['rank']}" for r in result.placement
                if r["role"] == f"{agent}.actor"}, e.args
            # the final weights are FP32 masters; a BF16 job's refresh carries them in BF16
            assert e.args["bytes"] == sum(v.numel() * 2 for v in model.values()
                                          ), (agent, e.args["bytes"])
            # the manifests (names, dtypes, shapes) a fraction of the weights: a fifth at most
            # (the verifier's 13k parameters in BF16 are 27 kB, its manifests ~2.8 kB; the
            # bound was a tenth while refreshes carried FP32, twice the bytes)
            assert 0 < e.args["control_bytes"] * 5 < e.args["bytes"], e.args


def test_what_the_driver_does_not_run_is_refused_before_ray(tmp_path: Path) -> None:
    from executors.run import execute
    from placer.base.errors import SpecError
    plan = _planned(verifier={"use_reference": True})
    with pytest.raises(SpecError, match=r"job.agents.members.verifier.use_reference: true"):
        execute(plan, 1, tmp_path)


def test_resuming_a_multi_agent_run_is_refused_before_ray(tmp_path: Path, capsys) -> None:
    """Its driver keeps no per-step checkpoint: `--resume` is bad input, one line, exit 2."""
    from placer.cli import main
    from placer.solve.planfile import save_plan
    plan = tmp_path / "plan.json"
    save_plan(_planned(), plan)
    assert main(["execute", str(plan), "--out", str(tmp_path / "out"), "--steps", "3",
                 "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--resume: a multi-agent plan (job.agents)" in err[0], err
    assert not (tmp_path / "out").exists()
