"""The cross-node all-reduce study (workflows/opnet.py): a testbed's network calibrated on its
own points recovers the network that priced them, a held-out point is priced by a network
calibrated without it, and the study reports the catalog and held-out figures side by side."""
from __future__ import annotations

from dataclasses import replace

import pytest

from placer.cost.efficiency import Efficiency
from workflows.opdata import Point, load
from workflows.opnet import bench_of, calibrate_fabric, cross_node, fabric_price, held_out

EFF = Efficiency()
SIZES = [2**k for k in range(10, 34, 3)]


def _synthetic(hop_s: float, nic_gbs: float) -> list[Point]:
    """An H100 x16 two-node sweep priced by the model itself on a network of its own."""
    proto = Point("all_reduce", "H100-SXM", "", 16, 1, 1.0, per_node=8, source="synthetic")
    return [replace(proto, size=b, measured_s=fabric_price(replace(proto, size=b), EFF, hop_s,
                                                           nic_gbs)) for b in SIZES]


@pytest.mark.parametrize(("hop_s", "nic_gbs"), [(40e-6, 15.0), (4e-6, 22.0)])
def test_calibration_recovers_the_network_that_priced_the_points(hop_s: float,
                                                                 nic_gbs: float) -> None:
    """Where the NICs bind (below 450 / 16 = 28.1 GB/s a device on H100 the two-node tree's
    NICs, at twice their rate, outrun its NVLink chain, and every rate above prices alike)."""
    hop, nic = calibrate_fabric(_synthetic(hop_s, nic_gbs), EFF)
    assert hop == pytest.approx(hop_s, rel=0.03)
    assert nic == pytest.approx(nic_gbs, rel=0.03)


def test_a_held_out_point_is_priced_by_a_network_calibrated_without_it() -> None:
    """Scaling one point's measured time moves its own error by exactly that scale (its price
    is the other fold's network) and leaves the network its own fold is priced on, hence the
    fold's other errors, as they were."""
    ps = [replace(p, measured_s=p.measured_s * (1.1 if i % 3 else 0.9))
          for i, p in enumerate(_synthetic(20e-6, 25.0))]
    errs, fabrics = held_out(ps, EFF)
    moved = [replace(p, measured_s=p.measured_s * 2) if i == 2 else p for i, p in enumerate(ps)]
    errs2, fabrics2 = held_out(moved, EFF)
    assert (errs2[2] + 1) == pytest.approx((errs[2] + 1) / 2)
    assert fabrics2[0] == fabrics[0]  # fold 0 (point 2's) was calibrated on fold 1 alone
    assert [e for i, e in enumerate(errs2) if i % 2 == 0 and i != 2] == pytest.approx(
        [e for i, e in enumerate(errs) if i % 2 == 0 and i != 2])


def test_calibration_takes_one_testbed_at_a_time() -> None:
    mixed = _synthetic(20e-6, 25.0)[:2] + [replace(_synthetic(20e-6, 25.0)[0], tp=32)]
    with pytest.raises(ValueError, match="one testbed"):
        calibrate_fabric(mixed, EFF)


def test_the_cross_node_points_are_the_groups_that_leave_a_node() -> None:
    """The public sources' groups of more than a node: OCI's and A3 Mega's 16 ranks on two
    nodes and the 32 B200 ranks on four; every other all-reduce stays in one node."""
    points = load()[1]
    spanning = cross_node(points)
    assert {bench_of(p) for p in spanning} == {"oci-2node A100-40G x16",
                                             "a3mega-2node H100-SXM x16", "mle-torch B200 x32"}
    assert all(p.tp <= p.per_node or p.per_node == 0
               for p in points if p.cls == "all_reduce" and p not in spanning)
