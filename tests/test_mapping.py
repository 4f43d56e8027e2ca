"""Mapping slots to nodes: every device named once, TP groups inside a node, environments spread,
weight-sync routes over the widest links."""
from __future__ import annotations

import pytest
from specdata import EXAMPLES

from placer.base.errors import SpecError
from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.solve.mapping import map_to_nodes, path_bandwidth, topology
from placer.solve.planfile import RolePlacement, SlotPlan
from placer.solve.planner import plan_job
from placer.spec.catalog import resolve
from placer.spec.load import job_from_dict, load_job


def _res(pools: list[dict]):
    return resolve(job_from_dict({
        "algorithm": "grpo", "models": {"policy": "Llama-3-8B", "reward": "rule"},
        "batch": {"prompts": 8, "samples_per_prompt": 2},
        "lengths": {"prompt": {"kind": "fixed", "value": 64}, "response": {"kind": "fixed",
                                                                           "value": 64}},
        "environment": {"kind": "tool", "turns": 2},
        "cluster": {"pools": pools}}))


def _role(pool: str, devices: int, tp: int, slot: str) -> RolePlacement:
    return RolePlacement(pool=pool, devices=devices, tp=tp, dp=devices // tp, slot=slot)


@pytest.fixture(scope="module", params=EXAMPLES, ids=lambda p: p.stem)
def example_plan(request):
    res = resolve(load_job(request.param))
    return res, plan_job(Pricer(res, Calibration()), time_limit_s=30.0)


def test_every_device_named_once(example_plan) -> None:
    res, plan = example_plan
    seen = set()
    per_slot: dict[str, int] = {}
    for b in plan.bundles:
        pool = res.cluster.pool(b.pool)
        assert 0 <= b.node < pool.nodes
        for d in b.devices:
            assert 0 <= d < pool.devices_per_node
            assert (b.pool, b.node, d) not in seen
            seen.add((b.pool, b.node, d))
        per_slot[b.slot] = per_slot.get(b.slot, 0) + len(b.devices)
    assert per_slot == {s.name: s.devices for s in plan.slots}
    assert [b.index for b in plan.bundles] == list(range(len(plan.bundles)))


def test_tp_groups_stay_inside_a_node(example_plan) -> None:
    res, plan = example_plan
    for b in plan.bundles:
        if res.device_of(b.pool).kind.value != "gpu":
            continue
        tp = max(r.tp for r in plan.roles.values() if r.slot == b.slot)
        assert len(b.devices) % min(tp, res.cluster.pool(b.pool).devices_per_node) == 0


def test_a_remainder_splits_only_in_whole_tp_groups() -> None:
    res = _res([{"name": "g", "device": "H100-SXM", "devices_per_node": 8, "nodes": 2},
                {"name": "cpu", "device": "cpu-node", "devices_per_node": 1, "nodes": 1}])
    slots = [SlotPlan(name=n, pool="g", devices=d, roles=[n]) for n, d in
             (("a", 6), ("b", 6), ("c", 4))]
    roles = {"a": _role("g", 6, 2, "a"), "b": _role("g", 6, 2, "b"), "c": _role("g", 4, 2, "c")}
    out, bundles, _ = map_to_nodes(res, slots, roles)
    c = [b for b in bundles if b.slot == "c"]
    assert sorted(len(b.devices) for b in c) == [2, 2]  # two TP-2 groups, one per node
    assert len({b.node for b in c}) == 2
    roles["c"] = _role("g", 4, 4, "c")  # a TP-4 group cannot be split over 2 + 2 free devices
    with pytest.raises(SpecError, match="groups of 4"):
        map_to_nodes(res, slots, roles)


def test_largest_slots_first_so_small_ones_do_not_fragment() -> None:
    res = _res([{"name": "g", "device": "H100-SXM", "devices_per_node": 8, "nodes": 2},
                {"name": "cpu", "device": "cpu-node", "devices_per_node": 1, "nodes": 1}])
    slots = [SlotPlan(name="small", pool="g", devices=2, roles=["small"]),
             SlotPlan(name="big", pool="g", devices=8, roles=["big"]),
             SlotPlan(name="mid", pool="g", devices=4, roles=["mid"])]
    roles = {"small": _role("g", 2, 2, "small"), "big": _role("g", 8, 8, "big"),
             "mid": _role("g", 4, 4, "mid")}
    out, bundles, _ = map_to_nodes(res, slots, roles)
    by = {b.slot: b for b in bundles}
    assert by["big"].devices == list(range(8))  # a whole node for the TP-8 engine
    assert by["mid"].node == by["small"].node != by["big"].node
    assert [s.name for s in out] == ["small", "big", "mid"]  # order of the input kept


def test_environment_workers_spread_over_cpu_nodes() -> None:
    res = _res([{"name": "g", "device": "H100-SXM", "devices_per_node": 8, "nodes": 1},
                {"name": "cpu", "device": "cpu-node", "devices_per_node": 2, "nodes": 4}])
    slots = [SlotPlan(name="environment", pool="cpu", devices=4, roles=["environment"])]
    roles = {"environment": _role("cpu", 4, 1, "environment")}
    _, bundles, _ = map_to_nodes(res, slots, roles)
    assert sorted(b.node for b in bundles) == [0, 1, 2, 3]
    assert all(len(b.devices) == 1 and b.resources["CPU"] == 64 for b in bundles)


def test_sync_routes_prefer_the_same_rack() -> None:
    res = _res([{"name": "g", "device": "H100-SXM", "devices_per_node": 8, "nodes": 4,
                 "nodes_per_rack": 2},
                {"name": "cpu", "device": "cpu-node", "devices_per_node": 1, "nodes": 1}])
    slots = [SlotPlan(name="actor", pool="g", devices=16, roles=["actor"]),
             SlotPlan(name="rollout", pool="g", devices=16, roles=["rollout"])]
    roles = {"actor": _role("g", 16, 8, "actor"), "rollout": _role("g", 16, 8, "rollout")}
    out, _, routes = map_to_nodes(res, slots, roles)
    assert out[0].nodes == [0, 1] and out[1].nodes == [2, 3]
    assert len(routes) == 2
    for r in routes:  # racks of two nodes: actor in rack 0, rollout in rack 1, via the spine
        assert "spine" in r.hops and r.gbs == min(400.0, 8 * 50.0)


def test_path_bandwidth_is_the_narrowest_edge() -> None:
    res = _res([{"name": "g", "device": "H100-SXM", "devices_per_node": 8, "nodes": 2},
                {"name": "cpu", "device": "cpu-node", "devices_per_node": 1, "nodes": 2}])
    g = topology(res)
    bw, hops = path_bandwidth(g, "g:0", "cpu:1")
    assert bw == 12.5 and hops[0] == "g:0" and hops[-1] == "cpu:1"  # the CPU node's NIC
    bw, hops = path_bandwidth(g, "g:0", "g:1")
    assert bw == 400.0 and len(hops) == 3  # same rack: node - rack switch - node
