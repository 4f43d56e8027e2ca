"""Multi-node inference engines: data-parallel attention with wide expert parallelism, TP across
nodes, the serving anchors, the planner's wide-EP candidates and KV admission by blocks in use."""
from __future__ import annotations

from pathlib import Path

import pytest

from placer.cost.batching import kv_budget
from placer.cost.efficiency import Calibration, Efficiency
from placer.cost.estimate import can_host
from placer.cost.generation import kv_capacity_tokens, max_concurrency
from placer.cost.layercomm import NODE_DEVICES, decode_comm, ep_exchange, pp_send, tp_link
from placer.cost.pricer import Pricer
from placer.cost.sharding import Parallel, routed_expert_params
from placer.solve.layouts import layouts
from placer.spec.arch import ModelArch
from placer.spec.catalog import resolve, shipped_devices, shipped_models
from placer.spec.load import load_job
from workflows.published import PublishedReport, fidelity
from workflows.serving import SERVING_ROWS, predict_serving

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
# a small mixture of experts: 16 experts of 512, 2 per token, 4 layers all MoE
SMALL_MOE = ModelArch(name="small-moe", layers=4, hidden=1024, heads=16, kv_heads=4, mlp=2048,
                      vocab=1000, experts=16, experts_per_token=2, expert_mlp=512)
H100 = shipped_devices()["H100-SXM"]
EFF = Efficiency()


def test_ep_exchange_over_two_nodes_matches_the_closed_form() -> None:
    """Independent: EP 16 over 2 nodes of 8, 100 tokens a rank, BF16 weights. Of a token's 2
    copies 2 * 8/16 = 1 leaves the node (the NIC, 50 GB/s x 0.8) and 2 * 7/16 go to its own
    node's other ranks (NVLink, 450 GB/s x 0.8); each call pays a base, one network hop (one
    other node) and the slower side's bytes; dispatch and combine both 2 bytes an element."""
    par = Parallel(tp=16, ep=16, attn_dp=16)
    per_copy = 100 * 1024 * 2
    nic = max(1.0 * per_copy / (50 * 0.8e9), 2 * 7 / 16 * per_copy / (450 * 0.8e9))
    hand = 2 * (6.6e-6 + 2.7e-6 + nic)
    assert ep_exchange(SMALL_MOE, H100, par, 100, EFF) == pytest.approx(hand, rel=1e-12)
    # FP8 weights: the dispatch sends 1 byte an element, the combine still 2
    fp8 = ep_exchange(SMALL_MOE, H100, Parallel(tp=16, ep=16, attn_dp=16, fp8_weights=True),
                      100, EFF)
    assert fp8 == pytest.approx(hand / 2 + (6.6e-6 + 2.7e-6 + nic) / 2
                                + (6.6e-6 + 2.7e-6) / 2, rel=1e-12)
    # DeepEP's normal kernels send once per other node a token's experts sit on: 2 nodes,
    # 2 experts -> 2 (1 - (1/2)^2) - 1 = 0.5 remote sends a token
    dedup = max(0.5 * per_copy / (50 * 0.8e9), 2 * 7 / 16 * per_copy / (450 * 0.8e9))
    assert ep_exchange(SMALL_MOE, H100, par, 100, EFF, node_dedup=True) == pytest.approx(
        2 * (6.6e-6 + 2.7e-6 + dedup), rel=1e-12)


def test_dp_attention_decode_has_no_all_reduce_only_the_exchange() -> None:
    """attention DP over all 16 ranks: no TP all-reduce, one dispatch + combine per MoE layer
    of batch / 16 tokens a rank."""
    par = Parallel(tp=16, ep=16, attn_dp=16)
    assert decode_comm(SMALL_MOE, H100, par, 1600, EFF) == pytest.approx(
        SMALL_MOE.moe_layers * ep_exchange(SMALL_MOE, H100, par, 100, EFF), rel=1e-12)


def test_dp_attention_kv_capacity_matches_the_closed_form() -> None:
    """Independent: each of 16 ranks keeps the whole dense part and 1/16 of the experts (BF16),
    the rest of 0.9 x 80 GB less 2 GB of engine holds its own sequences' full KV (no TP split):
    16 x free / KV bytes per token."""
    m = SMALL_MOE
    routed = routed_expert_params(m)
    weights_gb = ((m.params() - routed) + routed / 16) * 2 / 1e9
    kv_token = 2 * m.layers * m.kv_heads * (m.hidden // m.heads) * 2  # K and V, BF16
    hand = 16 * (80 * 0.9 - 2.0 - weights_gb) * 1e9 / kv_token
    got = kv_capacity_tokens(m, H100, Parallel(tp=16, ep=16, attn_dp=16), EFF)
    assert got == pytest.approx(hand, rel=1e-9)


def test_mla_kv_grows_with_attention_dp_not_split_by_tp() -> None:
    """DeepSeek-V3's latent KV is replicated on every TP rank, so TP 16 holds one copy's worth
    over 16 devices; data-parallel attention holds 16 independent pools (vLLM blog 2025-12-17:
    "latent projections are duplicated across shards")."""
    m = shipped_models()["DeepSeek-V3"]
    tp = kv_capacity_tokens(m, H100, Parallel(tp=16, ep=16, fp8_weights=True), EFF)
    dp = kv_capacity_tokens(m, H100, Parallel(tp=16, ep=16, attn_dp=16, fp8_weights=True), EFF)
    assert dp > 5 * tp


def test_tp_group_across_nodes_runs_on_the_network() -> None:
    """A TP group inside a node keeps NVLink (450 GB/s x `tp_link_eff`); one of 16 or 32 ranks
    pays network hops and runs at the slower of a node's NICs together (8 x 50 GB/s x
    `link_eff`) and its NVLink ring, both at the collectives' `link_eff` (an inter-node graph,
    not the in-node TP kernel `tp_link_eff` is fitted on), each kept for NCCL's tree."""
    inside, across = tp_link(H100, EFF, NODE_DEVICES), tp_link(H100, EFF, 16)
    assert inside.alpha_s == EFF.tp_hop_s
    assert inside.gbs == pytest.approx(450 * EFF.tp_link_eff)
    assert across.alpha_s == EFF.net_hop_s
    assert across.gbs == pytest.approx(min(450 * EFF.link_eff, 8 * 50 * EFF.link_eff))
    assert (across.intra_gbs, across.net_gbs) == pytest.approx((450 * EFF.link_eff, 400 * EFF.link_eff))
    narrow = EFF.override({"tp_link_eff": 0.2, "link_eff": 0.5})  # the NICs bind
    assert tp_link(H100, narrow, 16).gbs == pytest.approx(8 * 50 * 0.5)
    slow_nvlink = H100.model_copy(update={"intra_link_gbs": 300})  # NVLink binds
    assert tp_link(slow_nvlink, narrow, 16).gbs == pytest.approx(300 * 0.5)


@pytest.mark.parametrize("row", SERVING_ROWS, ids=lambda r: r.name)
def test_serving_anchors_within_their_bound(row) -> None:
    """Published SGLang wide-EP steps (workflows.serving, none of them fitted on). Measured
    when written: decode EP72 -1%, prefill EP32 +19%. The prefill bound is wider: the run
    overlapped compute with the all-to-alls (two-batch overlap, worth 27-35% of prefill
    throughput in the same post), which the model does not price, and its GEMM ceiling
    (`mfu_prefill`) is fitted elsewhere."""
    p = predict_serving(row, Calibration())
    assert p.fits
    err = p.predicted_s / p.published_s - 1
    if row.phase == "decode":
        assert abs(err) < 0.15, err
    else:
        assert abs(err) < 0.4, err


def _rollout_layouts(example: str) -> dict[str, list[Parallel]]:
    res = resolve(load_job(EXAMPLES / example), example)
    px = Pricer(res, Calibration())
    return {p.name: layouts(px, "rollout", p) for p in res.cluster.pools
            if can_host(res, "rollout", p) and res.device_of(p).kind.value == "gpu"}


def test_wide_ep_candidates_for_a_moe_on_multi_node_pools() -> None:
    """Qwen3-30B-A3B (128 experts) on a 2-node and a 4-node pool: data-parallel attention at EP 8
    and at whole nodes, TP = EP across nodes; bounded: at most 2 log2(nodes) + 1 a device count."""
    per_pool = _rollout_layouts("grpo-qwen3-30b-a3b.yaml")
    for name, pars in per_pool.items():
        wide = [p for p in pars if p.attn_dp > 1]
        assert {p.ep for p in wide} >= {8, 16}, name
        assert all(p.tp == p.ep == p.attn_dp and 128 % p.ep == 0 for p in wide)
        counts = {p.devices for p in pars}
        added = [p for p in pars if p.attn_dp > 1 or p.tp > NODE_DEVICES]
        assert len(added) <= len(counts) * (2 * 2 + 1)  # 4 nodes at most here
    assert any(p.tp == 16 and p.attn_dp == 1 for p in per_pool["h100"])  # TP 16 over 2 nodes


def test_no_wide_ep_for_a_dense_model() -> None:
    """Qwen2.5-72B (dense) on 512-node pools: no attention-DP or cross-node TP layouts."""
    for pars in _rollout_layouts("large-1k-nodes.yaml").values():
        assert not [p for p in pars if p.attn_dp > 1 or p.tp > NODE_DEVICES]


def test_kv_admission_counts_blocks_in_use_not_a_longest_context_reservation() -> None:
    """Regression guard (the replica's KvBudget against a reservation count): an engine admits
    as many sequences as their prompts' blocks fit (vLLM's scheduler allocates pages as a
    sequence grows), far more than the KV / longest-context count that `max_concurrency` keeps
    only for feasibility (one longest sequence must fit)."""
    m, dev = shipped_models()["Qwen3-30B-A3B"], shipped_devices()["H20"]
    par = Parallel(tp=4, ep=4)
    kv = kv_budget(m, dev, par, EFF)
    reserved = max_concurrency(m, dev, par, 32768, EFF)
    admitted = kv.first_wave(512, 10**6)
    assert admitted >= min(kv.max_seqs, 32 * reserved)
    # data-parallel attention: every group schedules its own max_num_seqs
    wide = kv_budget(m, dev, Parallel(tp=8, ep=8, attn_dp=8), EFF)
    assert wide.max_seqs == 8 * kv.max_seqs


def test_pipeline_hops_priced_on_their_own_link() -> None:
    """Independent: an engine replica of TP 4 x PP 4 over 2 nodes of 8: stages 0-1 share node 0,
    2-3 node 1, so of 3 hops one crosses the NIC and two stay on NVLink; each a call (base +
    one hop + bytes on NVLink; across nodes a send/recv's own `p2p_net_s` + bytes). Training
    keeps one link for every hop (its rank order is not fixed)."""
    nbytes = 10 * 1024 * 2
    nvl = 6.6e-6 + 0.6e-6 + nbytes / (450 * 0.8e9)
    nic = EFF.p2p_net_s + nbytes / (50 * 0.8e9)
    assert pp_send(SMALL_MOE, H100, Parallel(tp=4, pp=4), 10, EFF, 4) == pytest.approx(
        2 * nvl + nic, rel=1e-12)
    # stages of a whole node each: every hop crosses
    assert pp_send(SMALL_MOE, H100, Parallel(tp=8, pp=3), 10, EFF, 8) == pytest.approx(
        2 * nic, rel=1e-12)
    assert pp_send(SMALL_MOE, H100, Parallel(tp=4, pp=4), 10, EFF) == pytest.approx(
        3 * nic, rel=1e-12)


def test_wide_ep_only_for_the_rollout_engine() -> None:
    """A frozen scorer (the reference) keeps the TP / PP layouts: data-parallel attention and
    TP across nodes are engine layouts (vLLM / SGLang), not a trainer's forward pass."""
    res = resolve(load_job(EXAMPLES / "grpo-qwen3-30b-a3b.yaml"), "grpo-qwen3-30b-a3b.yaml")
    px = Pricer(res, Calibration())
    for pool in res.cluster.pools:
        if can_host(res, "reference", pool) and res.device_of(pool).kind.value == "gpu":
            assert not [p for p in layouts(px, "reference", pool)
                        if p.attn_dp > 1 or p.tp > NODE_DEVICES]


def test_published_report_carries_the_serving_rows() -> None:
    """`python -m workflows.published --json` has a "serving" list, one entry a row, and the
    document reads back (older documents without it read as none)."""
    doc = fidelity()
    assert [s.name for s in doc.serving] == [r.name for r in SERVING_ROWS]
    back = PublishedReport.from_json(doc.to_json())
    assert [s.predicted_s for s in back.serving] == [s.predicted_s for s in doc.serving]
    old = doc.to_dict()
    del old["serving"]
    assert PublishedReport.from_dict(old).serving == []
