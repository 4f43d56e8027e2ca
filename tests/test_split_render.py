"""A role split over pools, as every front end shows and exports it: the plan printout, `--explain`,
the placement picture, the exports (KubeRay per pool; verl and OpenRLHF refuse), host memory and
moves. The hetero-split example is planned once for the module (its rollout splits over h100 +
h20); `split_plan` also builds a smaller split by hand through `assemble`."""
from __future__ import annotations

import json
import subprocess
from collections import Counter

import pytest
import yaml
from simplans import example_plan

from placer.base.errors import SpecError
from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.cost.roleestimate import Part
from placer.cost.split import join
from placer.cost.timing import Placed
from placer.interop import target_of
from placer.interop.kuberay import export_kuberay
from placer.plots import part_labels, placement
from placer.solve.assemble import assemble, placed_estimate
from placer.solve.booking import booking
from placer.solve.breakdown import breakdown
from placer.solve.explain import Explanation, render
from placer.solve.hostmem import plan_nodes
from placer.solve.moves import layout, moves, role_counts
from placer.solve.planfile import Plan, RolePart, RolePlacement, SolverInfo, save_plan
from placer.solve.render import render_frontier, render_plan, where
from placer.solve.splitwhy import split
from placer.spec.catalog import Resolved
from placer.spec.hardware import DeviceKind
from workflows.whatif import placement_summary

CALIB = Calibration()


@pytest.fixture(scope="module")
def plan() -> Plan:
    p = example_plan("hetero-split")
    assert p.roles["rollout"].parts, "the example's rollout is expected to split"
    return p


@pytest.fixture(scope="module")
def res(plan: Plan) -> Resolved:
    return plan.resolved()


def test_printout_lists_every_part_with_devices_summing_to_the_role(plan: Plan) -> None:
    r = plan.roles["rollout"]
    text = render_plan(plan)
    rows = [line.split() for line in text.splitlines()]
    head = next(row for row in rows if row[:2] == ["rollout", "split"])
    assert int(head[2]) == r.devices
    parts = [row for row in rows if row[:1] == ["part"]]
    assert [(row[2], int(row[3])) for row in parts] == [(q.pool, q.devices) for q in r.parts]
    assert sum(int(row[3]) for row in parts) == r.devices
    for row, q in zip(parts, r.parts):  # tp pp dp and the share, per part
        assert [int(x) for x in row[4:7]] == [q.tp, q.pp, q.dp]
        assert f"{q.share:.1%}" in row
    # no row claims the first pool holds all of the role's devices
    assert not any(row[:3] == ["rollout", r.pool, str(r.devices)] for row in rows)
    slot = next(s for s in plan.slots if s.name == r.slot)
    on = [row for row in rows if row[:1] == ["on"]]
    assert [(row[1], int(row[3])) for row in on] == [(q.pool, q.devices) for q in slot.parts]
    assert {p.pool for p in r.parts} <= {row[2] for row in on}
    assert where(r) in render_frontier([plan])


def test_plan_json_carries_the_parts(plan: Plan) -> None:
    doc = json.loads(plan.to_json())
    parts = doc["roles"]["rollout"]["parts"]
    assert [p["pool"] for p in parts] == [q.pool for q in plan.roles["rollout"].parts]
    assert sum(p["samples"] for p in parts) == plan.spec.batch.samples
    slot = next(s for s in doc["slots"] if s["name"] == plan.roles["rollout"].slot)
    assert sum(p["devices"] for p in slot["parts"]) == plan.roles["rollout"].devices


def test_explain_names_the_single_pool_alternative_and_its_time(plan: Plan, res: Resolved
                                                                ) -> None:
    px = Pricer(res, CALIB)
    ex = Explanation(roles=breakdown(plan, px), binding=[], marginal_node={},
                     booking=booking(plan, px), host_memory={},
                     split=split(plan, px, time_limit_s=5.0))
    sp = ex.split["rollout"]
    alt = sp.single_pool
    assert alt is not None and "+" not in alt.placement["rollout"].split()[0]
    # the example's split pays: the best plan on single pools is slower
    assert alt.iteration_s > plan.predicted_iteration_s
    parts = ex.roles["rollout"].parts
    assert parts is not None and [q.pool for q in parts] == [
        q.pool for q in plan.roles["rollout"].parts]
    text = render(ex)
    assert "rollout is split over 2 pools" in text
    assert f"{alt.iteration_s:.3f} s per iteration" in text
    assert f"{plan.predicted_iteration_s:.3f} s" in text
    for q in plan.roles["rollout"].parts:
        assert f"{q.share:.1%} of the samples ({q.samples})" in text


def test_placement_picture_labels_each_part_on_its_pool(plan: Plan) -> None:
    labels = part_labels(plan)
    r = plan.roles["rollout"]
    for q in r.parts:
        on = [(devs, text) for (pool, _), found in labels.items() if pool == q.pool
              for devs, text in found]
        assert sum(len(d) for d, _ in on) == q.devices
        assert {text for _, text in on} == {f"rollout {q.share:.0%}"}
    fig = placement(plan)
    shown = {t.get_text() for t in fig.axes[0].texts}
    assert {f"rollout {q.share:.0%}" for q in r.parts} <= shown


def test_kuberay_has_a_worker_group_for_each_parts_pool(plan: Plan) -> None:
    e = export_kuberay(plan, image="example.com/placer:0.1")
    groups = {g["groupName"]: g for g in
              yaml.safe_load(e.files["raycluster.yaml"])["spec"]["workerGroupSpecs"]}
    res = plan.resolved()
    for q in plan.roles["rollout"].parts:
        g = groups[q.pool]
        pool = res.cluster.pool(q.pool)
        assert g["replicas"] == pool.nodes
        assert f"pool_{q.pool}" in g["rayStartParams"]["resources"]
        limits = g["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == str(pool.devices_per_node)
        assert f"{q.share:.0%} of samples" in g["template"]["metadata"]["annotations"][
            "placer.dev/slots"]
    # every split bundle asks for its own part's pool, which that group advertises
    for b in plan.bundles:
        if b.slot == plan.roles["rollout"].slot:
            assert f"pool_{b.pool}" in b.resources


@pytest.mark.parametrize("framework", ["verl", "openrlhf"])
def test_verl_and_openrlhf_refuse_a_split_role(plan: Plan, framework: str) -> None:
    with pytest.raises(SpecError, match=r"roles\.rollout\.parts: .* cannot run one rollout role "
                                        r"over two device types.*pin: \{rollout: \{pool: h100\}"):
        target_of(framework).export(plan)


def test_export_cli_exits_2_with_the_message(plan: Plan, tmp_path, placer_cmd) -> None:
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    out = subprocess.run([*placer_cmd, "export", "verl", str(path), "-o", str(tmp_path / "v")],
                         capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    assert "roles.rollout.parts" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "v").exists()


def test_hostmem_counts_each_parts_devices_on_its_own_pool(plan: Plan, res: Resolved) -> None:
    nodes = plan_nodes(plan, Pricer(res, CALIB))
    rollout = Counter(n.pool for n in nodes if "rollout" in n.roles)
    slot = next(s for s in plan.slots if s.name == plan.roles["rollout"].slot)
    assert set(rollout) == {pool for pool, _ in slot.pool_devices()
                            if res.device_of(pool).kind is DeviceKind.gpu}
    # each node appears once per (pool, node) and the checked pools are the bundles' pools
    assert len({(n.pool, n.node) for n in nodes}) == len(nodes)


def test_moves_see_each_parts_layout(plan: Plan) -> None:
    r = plan.roles["rollout"]
    assert layout(plan, "rollout") == " + ".join(f"{q.pool} tp{q.tp} pp{q.pp} dp{q.dp}"
                                                 for q in r.parts)
    assert role_counts(plan)["rollout"] == sum(q.dp for q in r.parts)
    one = plan.model_copy(update={"roles": {**plan.roles, "rollout": r.model_copy(
        update={"parts": [r.parts[0]], "devices": r.parts[0].devices})}})
    moved = moves(plan, one, colocation=False)
    assert set(moved) == {"rollout"} and "+" in moved["rollout"].before
    assert moves(plan, plan) == {}


def test_a_hand_built_split_shows_the_same(res: Resolved) -> None:
    """A split put together by hand (`assemble` of a joined estimate): printout, summary, nodes."""
    total = res.job.batch.samples
    n = total // 2
    planned = example_plan("hetero-split")
    parts = [Part(placed_estimate(Pricer(res.with_samples(k), CALIB), "rollout", _single(q)), k)
             for q, k in zip(planned.roles["rollout"].parts, (n, total - n))]
    placed = [Placed(r.slot, placed_estimate(Pricer(res, CALIB), role, r))
              for role, r in planned.roles.items() if role != "rollout"]
    placed.append(Placed("rollout", join(parts)))
    info = SolverInfo(status="hand", objective=1.0, bound=1.0, gap=0.0, solve_s=0.0)
    hand = assemble(Pricer(res, CALIB), placed, info)
    r = hand.roles["rollout"]
    assert [q.samples for q in r.parts] == [n, total - n]
    # one "+" in the rollout's entry: its two parts (other slots may hold colocated roles)
    entry = next(e for e in placement_summary(hand).split("; ") if e.startswith(f"{r.slot}@"))
    assert entry.count("+") == 1
    assert f"{r.slot}@" + "+".join(f"{q.pool} x{q.devices}" for q in r.parts) in \
        placement_summary(hand)
    text = render_plan(hand)
    assert "50.0% of samples" in text
    plan_nodes(hand, Pricer(res, CALIB))  # does not raise


def _single(q: RolePart) -> RolePlacement:
    """A part as a one-pool `RolePlacement` to re-price alone."""
    return RolePlacement(pool=q.pool, devices=q.devices, tp=q.tp, pp=q.pp, dp=q.dp, ep=q.ep,
                         fp8_weights=q.fp8_weights, fp8_kv=q.fp8_kv, slot="rollout")
