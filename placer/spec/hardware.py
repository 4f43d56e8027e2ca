"""Hardware a job runs on: device types and the cluster of pools that holds them.

A *device type* is one accelerator (a GPU, an LPU chip) or one CPU node, with its peak rates,
memory, links, price and whether it can train; the shipped ones are in placer/spec/catalog/devices.yaml
and a job may add its own (`catalog.devices`). A *pool* is a named set of identical nodes of one
device type, a *topology* says how racks and pools are wired, and a *cluster* is the pools, their
topology and the checkpoint storage the job sees. The planner, the simulator and the executor
keep records per node and per device, so a cluster beyond `MAX_CLUSTER_NODES` /
`MAX_CLUSTER_DEVICES` is refused when it is read (`check_cluster_size`).

Part of the job model (`placer.spec.job`, which re-exports every name here).
"""
from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import ConfigDict, Field, ModelWrapValidatorHandler, StrictBool, model_validator

from placer.spec.base import PosFloat, PosInt, Strict

# USD per device-hour, far above any real part. The ILP counts prices in whole milli-dollars in
# 64-bit integers and its tie-breaker multiplies a plan's rate by the cluster's device count, so
# price x devices x devices (at most 1e6 x 1e6 x 1e6 milli-dollars with MAX_CLUSTER_DEVICES) must
# stay below 2**63; every later product of prices is then a finite float too.
MAX_PRICE_PER_HOUR = 1000.0


class DeviceKind(StrEnum):
    gpu = "gpu"
    cpu = "cpu"
    lpu = "lpu"


class Network(StrEnum):
    """The scale-out network a device's node NICs are on, as NCCL sees it (its transport or
    net plugin): what a collective across nodes pays per network step and which of NCCL's
    protocols it may run (placer/cost/fabric.py holds each one's figures and sources)."""

    infiniband = "infiniband"
    roce = "roce"
    efa = "efa"
    tcpxo = "tcpxo"


class DeviceType(Strict):
    """One accelerator (or one CPU node for kind=cpu). Units: GB, TFLOP/s, GB/s, USD/hour."""

    name: str
    kind: DeviceKind
    memory_gb: PosFloat = Field(description="HBM, SRAM (lpu) or host RAM (cpu) per device")
    bf16_tflops: PosFloat = Field(description="peak dense BF16 (FP16 for LPUs)")
    fp8_tflops: PosFloat | None = Field(
        None, description="peak dense FP8 (Hopper and later); none: no FP8 tensor cores, so FP8 "
                          "options of the job do not apply on this device")
    matmul_tflops: PosFloat | None = Field(
        None, description="maximum achievable dense BF16 matmul TFLOP/s as measured (MAMF: the "
                          "best of a sweep of GEMM shapes); where its share of bf16_tflops is "
                          "below that of the devices the efficiency factors were measured on, "
                          "the BF16 GEMM ceilings are lowered in proportion "
                          "(placer/cost/roofline.py `matmul_derate`); none: not measured, no change")
    mem_bw_gbs: PosFloat = Field(description="memory bandwidth per device")
    intra_link_gbs: PosFloat = Field(description="scale-up link per device, one direction")
    nic_gbs: PosFloat = Field(description="network bandwidth per device, one direction")
    nvlink_sharp: StrictBool = Field(
        False, description="the node's NVLink switches reduce in the fabric (NVLink SHARP, "
                           "third-generation NVSwitch and later): NCCL's NVLS all-reduce moves "
                           "each rank's buffer once, not 2 (n-1)/n times as a ring does")
    can_train: StrictBool = False
    network: Network = Field(
        Network.infiniband,
        description="the scale-out network of the device's nodes, as NCCL runs on it (a "
                    "property of the cluster, like nic_gbs): infiniband or roce (NCCL's own IB "
                    "verbs transport), efa (AWS, the aws-ofi-nccl plugin: ~35 us more per "
                    "network step) or tcpxo (Google Cloud A3 Mega's GPUDirect-TCPXO: NCCL's "
                    "LL protocol off). Sets the per-step latency and protocols of a collective "
                    "across nodes (placer/cost/fabric.py)")
    host_devices: PosInt | None = Field(
        None, description="devices of one host (a GB200 compute tray): an engine's custom "
                          "all-reduce (peer-to-peer over IPC) only runs inside one, a wider TP "
                          "group falls back to NCCL even on NVLink. Usually left unset: a pool "
                          "that declares `nvlink_domain` sets it to its devices_per_node; "
                          "unset, `scaleup_devices` (or a node of 8)")
    scaleup_devices: PosInt | None = Field(
        None, description="consecutive devices a collective group may span and stay on the "
                          "scale-up link (NVLink); wider, it crosses the network. Usually left "
                          "unset: a pool that declares `nvlink_domain` sets it, to the domain "
                          "where the whole pool fits in one, else to one node; unset, a node of 8")
    price_per_hour: Annotated[float, Field(strict=True, ge=0, le=MAX_PRICE_PER_HOUR)] = 0.0
    cores: PosInt = Field(1, description="CPU cores per device (cpu kind)")
    sm_count: PosInt | None = Field(
        None, description="streaming multiprocessors of a GPU: an attention kernel's grid fills "
                          "them in waves (placer/cost/flash.py); none: any grid fills the device")
    host_memory_gb: PosFloat | None = Field(
        None, description="host RAM of one node of this device type, GB (placer/solve/hostmem.py "
                          "checks offloaded state against it); none: not checked")
    memory_is_host: StrictBool = Field(
        False, description="its memory is the host's RAM (an emulated device whose work runs on "
                           "the CPU, a unified-memory part; always so for the cpu kind): "
                           "offloading state to the host or switching colocated roles moves "
                           "nothing, so neither is priced nor planned")
    source: str = ""

    @property
    def host_backed(self) -> bool:
        """Whether the device's memory is host RAM (`memory_is_host`, or a CPU)."""
        return self.memory_is_host or self.kind is DeviceKind.cpu

    @model_validator(mode="after")
    def _inference_only_lpu(self) -> DeviceType:
        if self.kind is DeviceKind.lpu and self.can_train:
            raise ValueError("an lpu is inference-only: can_train must be false")
        return self


def _pool_schema(schema: dict[str, Any]) -> None:
    """JSON Schema of a pool: devices_per_node or cores_per_node (a CPU pool may give either)."""
    schema["required"] = [k for k in schema.get("required", []) if k != "devices_per_node"]
    schema["anyOf"] = [{"required": ["devices_per_node"]}, {"required": ["cores_per_node"]}]


class Pool(Strict):
    """A named set of identical nodes. A GPU or LPU pool counts accelerators per node; a CPU
    pool's device is a whole CPU of the device type's `cores` cores (cpu-node: a 64-core node),
    so it gives `cores_per_node`, or `devices_per_node` in those units (usually 1)."""

    name: str
    device: str = Field(description="device type name (catalog or job's own)")
    devices_per_node: PosInt = Field(
        description="accelerators per node (GPUs, LPU chips); for a CPU pool, devices of the "
                    "device type's `cores` cores each (usually 1), not cores: give cores_per_node "
                    "for those. Required unless a CPU pool gives cores_per_node")
    cores_per_node: PosInt | None = Field(
        None, description="CPU pools only: cores per node, a multiple of the device type's "
                          "`cores` (devices_per_node is derived from it)")
    nodes: PosInt
    nvlink_domain: PosInt | None = Field(
        None, description="devices sharing the scale-up link; default: one node")
    nodes_per_rack: PosInt = 32
    host_memory_gb: PosFloat | None = Field(
        None, description="host RAM per node, GB; default: the device type's host_memory_gb")

    model_config = ConfigDict(**Strict.model_config, json_schema_extra=_pool_schema)

    @model_validator(mode="wrap")
    @classmethod
    def _cores_only(cls, data: Any, handler: ModelWrapValidatorHandler[Pool]) -> Pool:
        """A CPU pool that gives only cores_per_node: devices_per_node is filled in once the
        device's cores are known (`placer.spec.catalog.cpu_pools`); until then 1, not counted as given."""
        derive = (isinstance(data, dict) and "devices_per_node" not in data
                  and data.get("cores_per_node") is not None)
        pool: Pool = handler({**data, "devices_per_node": 1} if derive else data)
        if derive:
            pool.model_fields_set.discard("devices_per_node")
        return pool

    @property
    def devices_given(self) -> bool:
        """Whether the input gave devices_per_node (not derived from cores_per_node)."""
        return "devices_per_node" in self.model_fields_set


class Topology(Strict):
    """How pools are wired: racks under a spine; pools meet at the spine."""

    spine_gbs: PosFloat = Field(400.0, description="bisection per rack uplink, GB/s")
    cross_pool_gbs: PosFloat | None = Field(
        None, description="per-node bandwidth between two pools; default: the slower NIC side")
    latency_us: PosFloat = 5.0


# The planner, the simulator and the executor keep per-node and per-device records (bundles,
# placement groups, engines); a cluster beyond these sizes would not fit in memory, so it is refused
# when the job is read. They are two orders of magnitude above the largest example (1,024 nodes).
MAX_CLUSTER_NODES = 100_000
MAX_CLUSTER_DEVICES = 1_000_000


def check_cluster_size(pools: dict[str, tuple[int, int]]) -> None:
    """ValueError when the pools' (nodes, devices per node) exceed the sizes this tool handles."""
    nodes = sum(n for n, _ in pools.values())
    devices = sum(n * d for n, d in pools.values())
    if nodes > MAX_CLUSTER_NODES or devices > MAX_CLUSTER_DEVICES:
        raise ValueError(f"{nodes:,} nodes with {devices:,} devices in all exceed the "
                         f"{MAX_CLUSTER_NODES:,} nodes and {MAX_CLUSTER_DEVICES:,} devices this "
                         "tool plans, simulates and runs")


# Checkpoint storage as one job sees it: an assumption (a shared parallel filesystem or object
# store reached over the frontend network sustains a few GB/s for one job's writes), stated in
# the job format so that users give their own figure.
DEFAULT_STORAGE_GBS = 5.0


class Cluster(Strict):
    pools: list[Pool] = Field(min_length=1)
    topology: Topology = Topology()
    storage_gbs: PosFloat = Field(
        DEFAULT_STORAGE_GBS, description="checkpoint storage bandwidth (write and read) the job "
                                         "sees in all, GB/s")

    @model_validator(mode="after")
    def _unique_pools(self) -> Cluster:
        names = [p.name for p in self.pools]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"pool names must be unique, repeated: {sorted(dup)}")
        check_cluster_size({p.name: (p.nodes, p.devices_per_node) for p in self.pools})
        return self

    def pool(self, name: str) -> Pool:
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(name)
