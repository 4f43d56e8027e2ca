"""A device's measured best matmul share of its peak (`DeviceType.matmul_tflops`, the MAMF table of
stas00/ml-engineering @744d01e18b79512572f64a6bbd8b5f4a725203a7) lowers its BF16 GEMM ceilings
where it is below the H100's, the share of the devices the factors were measured on
(`roofline.matmul_derate`): the B200 in the shipped catalog and the GB200 the NeMo-RL rows declare;
the A100, H100 and H200 the factors were measured on (or share its chip) are priced as fitted."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from placer.cost.efficiency import Efficiency
from placer.cost.generation import decode_flops_time, forward_time
from placer.cost.model import score_time, train_time
from placer.cost.roofline import GB, REFERENCE_MATMUL_FRACTION, device_ceiling, matmul_derate
from placer.cost.sharding import Parallel
from placer.spec.catalog import resolve, shipped_devices, shipped_models
from placer.spec.load import load_job

ROOT = Path(__file__).resolve().parents[1]
DEV = shipped_devices()
QWEN7B = shipped_models()["Qwen2.5-7B"]
EFF = Efficiency()
# r19's job file declares the GB200 (NVIDIA's datasheet and the MAMF table's 1,822 of 2,500)
GB200 = resolve(load_job(ROOT / "examples/published/r19-grpo30ba3b-16xgb200-nemorl-colocate.yaml"),
                "r19").devices["GB200"]


def test_the_reference_is_the_h100_share_of_the_mamf_table() -> None:
    # 794.5 of 989 TFLOP/s (BF16, torch 2.7.0+cu126), the catalog's figure for the H100-SXM
    h100 = DEV["H100-SXM"]
    assert REFERENCE_MATMUL_FRACTION == pytest.approx(0.80334, rel=1e-4)
    assert h100.matmul_tflops is not None
    assert h100.matmul_tflops / h100.bf16_tflops == pytest.approx(REFERENCE_MATMUL_FRACTION)


@pytest.mark.parametrize("name", ["A100-80G", "H100-SXM", "H200"])
def test_the_devices_the_factors_were_measured_on_are_not_derated(name: str) -> None:
    # A100 0.869 and H100 0.803 of peak: within the span the fitted factors cover
    assert DEV[name].matmul_tflops is not None
    assert matmul_derate(DEV[name]) == 1.0


@pytest.mark.parametrize("name", ["H20", "L40S", "L4"])
def test_a_device_without_a_measured_figure_is_not_derated(name: str) -> None:
    assert DEV[name].matmul_tflops is None and matmul_derate(DEV[name]) == 1.0


def test_blackwell_by_hand() -> None:
    # B200: 1,745 / 2,250 = 0.7756; GB200: 1,822 / 2,500 = 0.7288; each over 0.80334
    assert matmul_derate(DEV["B200"]) == pytest.approx(0.96543, rel=1e-4)
    assert matmul_derate(GB200) == pytest.approx(0.90720, rel=1e-4)


def test_fp8_gemms_are_not_derated() -> None:
    # the table's FP8 shares put B200 (0.763) and GB200 (0.723) above the H100's (0.709)
    for dev in (DEV["B200"], GB200):
        assert matmul_derate(dev, Parallel(fp8_weights=True)) == 1.0
        assert matmul_derate(dev, Parallel(fp8_train=True)) == 1.0
        assert matmul_derate(dev, Parallel()) < 1.0


def test_the_derate_lowers_the_gemm_term_of_the_ceiling_only() -> None:
    # 1 / (1 / (0.86 x 0.9072) + 0.0045 x 2500e12 / 8000e9): the memory-bound kernels' term
    # keeps its bytes at HBM bandwidth
    ridge = GB200.bf16_tflops * 1e12 / (GB200.mem_bw_gbs * GB)
    want = 1 / (1 / (EFF.mfu_train * 0.90720) + EFF.nongemm_bytes_per_flop * ridge)
    assert device_ceiling(EFF.mfu_train, GB200, EFF) == pytest.approx(want, rel=1e-4)
    plain = GB200.model_copy(update={"matmul_tflops": None})
    assert device_ceiling(EFF.mfu_train, GB200, EFF) < device_ceiling(EFF.mfu_train, plain, EFF)


def test_every_gemm_path_is_slower_by_the_derate_on_the_b200() -> None:
    b200 = DEV["B200"]
    plain = b200.model_copy(update={"matmul_tflops": None})
    par = Parallel(dp=8)
    d = matmul_derate(b200)
    # the decode step's FLOPs term: exactly 1 / derate
    assert decode_flops_time(1e15, 1, b200, par, EFF) == pytest.approx(
        decode_flops_time(1e15, 1, plain, par, EFF) / d)
    # the training pass, the forward-only pass and the engine's forward all slow down, by at
    # most 1 / derate (their collectives, attention kernels and memory-bound kernels are not
    # derated)
    flat = replace(EFF, gemm_half_ridge=0.0, prefill_half_ridge=0.0)
    for slow, fast in (
            (train_time(QWEN7B, b200, par, 1e6, 2048, 4, flat),
             train_time(QWEN7B, plain, par, 1e6, 2048, 4, flat)),
            (score_time(QWEN7B, b200, par, 1e6, 2048, flat),
             score_time(QWEN7B, plain, par, 1e6, 2048, flat)),
            (forward_time(QWEN7B, b200, par, 1e6, 2048, flat),
             forward_time(QWEN7B, plain, par, 1e6, 2048, flat))):
        assert fast < slow <= fast / d * (1 + 1e-9)
