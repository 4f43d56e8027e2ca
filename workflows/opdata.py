"""The measured operators of `python -m workflows.operators` and how the cost model prices each:
the points of workflows/data/operators/ (scripts/extract_operators.py wrote them from Vidur's
profiles, scripts/extract_nccl_tests.py the all-reduces of public nccl-tests logs of one H100
host, scripts/extract_nccl_multinode.py those of two-node runs, scripts/extract_mle_all_reduce.py
the ml-engineering book's H200 and B200 tables; all_reduce_h20_issue.csv is transcribed from
an nccl-tests issue thread (`ALL_REDUCE_FILES`); each file's
header names the source commit, paths, units and licence) and `predict`, which
prices a point with the cost-model function its class names (the classes: workflows/operators.py).
An attention point prices one layer of its shape (`attention_layer`) split over its TP ranks.
"""
from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from placer.cost.efficiency import Efficiency
from placer.cost.flash import prefill_kernel_time
from placer.cost.generation import decode_attention_time, decode_matmul_time
from placer.cost.layercomm import NODE_DEVICES, p2p_link, stage_send, tp_all_reduce
from placer.cost.roofline import BYTES, matmul_time
from placer.cost.sharding import Parallel
from placer.spec.arch import ModelArch
from placer.spec.catalog import shipped_devices
from placer.spec.hardware import DeviceType, Network

DATA = Path(__file__).resolve().parent / "data" / "operators"
HEX40 = re.compile(r"[0-9a-f]{40}")  # a git commit
CLASSES = ("prefill_linear", "decode", "attention", "all_reduce", "send_recv")
LAYER_CLASSES = ("prefill_linear", "decode")
PREFILL_MIN_TOKENS = 128  # a prefill chunk; below it a pass is decode-sized
VIDUR = "vidur"  # github.com/microsoft/vidur's profiles (every class)
NCCL_TESTS = "nccl-tests"  # nccl-tests logs of github.com/waynehacking8/nccl-collectives-bench
OCI = "oci-2node"  # github.com/oracle-quickstart/oci-hpc-oke's README: 2x8 A100-40GB, RoCE
A3MEGA = "a3mega-2node"  # github.com/lessizzmore/create-a3mega-ztan-fork: 2x8 H100, TCPXO
MLE_TORCH = "mle-torch"  # github.com/stas00/ml-engineering's all_reduce_bench: H200, B200 1/4 nodes
MLE_NCCL = "mle-nccl-tests"  # the same book's nccl-tests 8 GiB rank sweeps: H200, B200
H20_ISSUE = "h20-issue"  # an 8x H20 node's nccl-tests sweep in NVIDIA/nccl-tests issue 306
SOURCES = (VIDUR, NCCL_TESTS, OCI, A3MEGA, MLE_TORCH, MLE_NCCL, H20_ISSUE)
# each public all-reduce source's file beyond Vidur's (scripts/extract_nccl_tests.py,
# scripts/extract_nccl_multinode.py, scripts/extract_mle_all_reduce.py)
ALL_REDUCE_FILES = {NCCL_TESTS: "all_reduce_nccl_tests.csv", OCI: "all_reduce_oci.csv",
                    A3MEGA: "all_reduce_a3mega.csv", MLE_TORCH: "all_reduce_mle_torch.csv",
                    MLE_NCCL: "all_reduce_mle_nccl_tests.csv", H20_ISSUE: "all_reduce_h20_issue.csv"}
# A device a source measured that the shipped catalog lacks, declared from its datasheet (as
# workflows/published_rows.py declares GH200): an all-reduce's price reads its NVLink, NIC and
# NVLink SHARP figures alone
DECLARED_DEVICES: dict[str, dict[str, object]] = {
    "A100-40G": {
        "name": "A100-40G", "kind": "gpu", "memory_gb": 40, "bf16_tflops": 312,
        "mem_bw_gbs": 1555, "intra_link_gbs": 300, "nic_gbs": 25, "can_train": True,
        "source": "NVIDIA A100 datasheet (SXM4 40GB: 1,555 GB/s, NVLink 3 600 GB/s both "
                  "directions); NIC: OCI BM.GPU4.8's 1,600 Gb/s RDMA cluster network per node "
                  "of 8 GPUs (OCI compute shapes), 200 Gb/s = 25 GB/s per GPU"}}
# The scale-out network each cross-node testbed ran on, as its source states it (the data
# files' headers): a property of the testbed that a user sets per cluster
# (`DeviceType.network`; its figures, from NCCL's and the vendors' public sources:
# placer/cost/fabric.py). OCI's BM.GPU4.8 cluster network is RoCE; A3 Mega's is
# GPUDirect-TCPXO (its NCCL profile runs Simple alone); the book's 4 P6-B200 nodes are on
# EFA. A source not named runs on the catalog's (InfiniBand); an in-node call reads no
# network.
SOURCE_NETWORK: dict[str, Network] = {OCI: Network.roce, A3MEGA: Network.tcpxo,
                                      MLE_TORCH: Network.efa}
DECODE_MAX_TOKENS = 64  # a decode batch whose weight read still bounds its GEMMs on A100/H100
LAYER_KERNELS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
                 "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")


@dataclass(frozen=True)
class Point:
    """One measured operator: its class, where it ran, its size and its time."""

    cls: str
    device: str
    model: str  # the model (layers) or "" (collectives)
    tp: int  # TP degree (layers) or ranks (collectives)
    size: int  # tokens (layers) or bytes (collectives)
    measured_s: float
    per_node: int = 0  # collectives: ranks per node (send/recv: 1 = two nodes)
    hidden: int = 0
    heads: int = 0
    kv_heads: int = 0
    mlp: int = 0
    vocab: int = 0
    kind: str = ""  # attention: "prefill" (size = chunk tokens) or "decode" (size = batch)
    context: int = 0  # attention: KV tokens before the chunk, or held by each decode sequence
    source: str = VIDUR  # which public source measured it (SOURCES)
    launch: str = "eager"  # collectives: host-launched each call, or replayed from a CUDA graph


@dataclass(frozen=True)
class Provenance:
    """A data file's header: source, commit, paths and units, as written."""

    file: str
    lines: tuple[str, ...]

    @property
    def commit(self) -> str:
        """The source's git commit; "" for a source that is not a repository file (an
        issue thread, cited by its address)."""
        return next((w for ln in self.lines for w in ln.split() if HEX40.fullmatch(w)), "")


def _read(name: str) -> tuple[Provenance, list[dict[str, str]]]:
    path = DATA / name
    lines = path.read_text().splitlines()
    header = tuple(ln[2:] for ln in lines if ln.startswith("# "))
    body = [ln for ln in lines if not ln.startswith("#")]
    return Provenance(name, header), list(csv.DictReader(body))


@cache
def load() -> tuple[tuple[Provenance, ...], tuple[Point, ...]]:
    """Every measured point, with the provenance of the files they came from: Vidur's
    profiles (every class) and the nccl-tests all-reduce logs (`Point.source`), the attention
    file last."""
    points: list[Point] = []
    prov_layers, layers = _read("layers.csv")
    for r in layers:
        tokens = int(r["tokens"])
        cls = ("decode" if tokens <= DECODE_MAX_TOKENS
               else "prefill_linear" if tokens >= PREFILL_MIN_TOKENS else "")
        if not cls:
            continue
        ms = sum(float(r[f"{k}_ms"]) for k in LAYER_KERNELS)
        points.append(Point(cls, r["device"], r["model"], int(r["tp"]), tokens, ms / 1e3,
                            hidden=int(r["n_embd"]), heads=int(r["n_head"]),
                            kv_heads=int(r["n_kv_head"]), mlp=int(r["n_expanded_embd"]),
                            vocab=int(r["vocab_size"])))
    provs = [prov_layers]
    for cls in ("all_reduce", "send_recv"):
        prov, rows = _read(f"{cls}.csv")
        provs.append(prov)
        points += [Point(cls, r["device"], "", int(r["ranks"]), int(r["bytes"]),
                         float(r["ms"]) / 1e3, per_node=int(r["per_node"])) for r in rows]
    for src, name in ALL_REDUCE_FILES.items():
        prov, rows = _read(name)
        provs.append(prov)
        points += [Point("all_reduce", r["device"], "", int(r["ranks"]), int(r["bytes"]),
                         float(r["ms"]) / 1e3, per_node=int(r["per_node"]), source=src,
                         launch=r["launch"]) for r in rows]
    prov, rows = _read("attention.csv")
    provs.append(prov)
    points += [Point("attention", r["device"], "", int(r["tp"]), int(r["size"]),
                     float(r["ms"]) / 1e3, hidden=int(r["n_embd"]), heads=int(r["n_head"]),
                     kv_heads=int(r["n_kv_head"]), kind=r["kind"], context=int(r["kv"]))
               for r in rows]
    return tuple(provs), tuple(points)


@cache
def load_sweep() -> tuple[Provenance, tuple[Point, ...]]:
    """Vidur's dense all-reduce sweep (all_reduce_sweep.csv: every size up to 8 MiB, a
    stride above), as all-reduce points: what workflows/opmodes.py studies the kernels'
    modes on. The class figures use `load`'s points (the sizes nearest each power of two)."""
    prov, rows = _read("all_reduce_sweep.csv")
    return prov, tuple(Point("all_reduce", r["device"], "", int(r["ranks"]), int(r["bytes"]),
                             float(r["ms"]) / 1e3, per_node=int(r["per_node"])) for r in rows)


@cache
def _device(name: str) -> DeviceType:
    """The catalog's device, or one a source declares (`DECLARED_DEVICES`)."""
    if name in DECLARED_DEVICES:
        return DeviceType(**{k: v for k, v in DECLARED_DEVICES[name].items() if k != "source"})
    return shipped_devices()[name]


@cache
def layer_params(hidden: int, heads: int, kv_heads: int, mlp: int, vocab: int) -> int:
    """Matmul parameters of one decoder layer of this shape: the model with two layers less
    the model with one (`ModelArch.matmul_params`; the LM head and final norm cancel)."""
    one = ModelArch(name="layer", layers=1, hidden=hidden, heads=heads, kv_heads=kv_heads,
                    mlp=mlp, vocab=vocab)
    return one.model_copy(update={"layers": 2}).matmul_params() - one.matmul_params()


@cache
def attention_layer(hidden: int, heads: int, kv_heads: int) -> ModelArch:
    """One decoder layer of this attention shape (its MLP and vocabulary do not enter the
    attention kernel's price)."""
    return ModelArch(name="layer", layers=1, hidden=hidden, heads=heads, kv_heads=kv_heads,
                     mlp=hidden, vocab=1)


def _attention(p: Point, dev: DeviceType, eff: Efficiency) -> float:
    """A prefill chunk of `size` tokens after `context` KV tokens sees context + size / 2 keys
    per token on average: a causal sequence of 2 * context + size in
    `attention_flops_per_token`'s terms; Vidur's kernel is handed the chunk's keys and values
    and writes them into the cache itself (`flash.prefill_kernel_time`'s append). A decode
    batch reads its sequences' KV (`generation.decode_attention_time`). Either kernel adds
    its fixed time (`flash.kernel_floor`)."""
    m, par = attention_layer(p.hidden, p.heads, p.kv_heads), Parallel(tp=p.tp)
    if p.kind == "prefill":
        return prefill_kernel_time(m, dev, par, p.size, 2 * p.context + p.size, eff,
                                   chunk=p.size, append=True)
    return decode_attention_time(m, dev, par, p.size, p.size * p.context, eff)


def _params(p: Point) -> int:
    return layer_params(p.hidden, p.heads, p.kv_heads, p.mlp, p.vocab)


def predict(p: Point, eff: Efficiency) -> float:
    """Seconds the cost model prices point `p` at, with the function its class names, on the
    device as its testbed declares it (`point_device`)."""
    dev = point_device(p)
    if p.cls == "prefill_linear":
        return matmul_time(2 * _params(p) * p.size, p.size, dev, Parallel(tp=p.tp),
                           eff.mfu_prefill, eff, eff.prefill_half_ridge)
    if p.cls == "decode":
        return decode_matmul_time(_params(p) * BYTES, 2 * _params(p) * p.size, p.size, dev,
                                  Parallel(tp=p.tp), eff)
    if p.cls == "attention":
        return _attention(p, dev, eff)
    if p.cls == "all_reduce":
        return tp_all_reduce(p.size, p.tp, dev, eff)
    if p.cls == "send_recv":
        # a pair inside a node is on NVLink; a pair on two nodes on the NIC (a group that
        # spans more than a node)
        ranks = p.tp if p.per_node >= p.tp else 2 * NODE_DEVICES
        return stage_send(p.size, p2p_link(dev, ranks, eff))
    raise ValueError(f"no pricing for class {p.cls!r}")


def point_device(p: Point) -> DeviceType:
    """The device a point ran on, as `predict` prices it (the catalog's, or one a source
    declares), on its testbed's network (`SOURCE_NETWORK`): what a study that re-declares a
    testbed's network starts from."""
    return _on_network(_device(p.device), SOURCE_NETWORK.get(p.source, Network.infiniband))


def catalog_device(p: Point) -> DeviceType:
    """`point_device` on the catalog's network (InfiniBand): the prices before a testbed
    declares its own."""
    return _on_network(_device(p.device), Network.infiniband)


@cache
def _on_network(dev: DeviceType, network: Network) -> DeviceType:
    """`dev` on `network` (one object per pair, so the pricing caches keyed on a device's
    identity keep hitting)."""
    return dev if dev.network == network else dev.model_copy(update={"network": network})
