"""workflows/moe_mfu.py: verl's flops counter restated over `ModelArch`, and the MFU it reads
off the cost model's update time."""
from __future__ import annotations

import numpy as np
import pytest

from placer.cost.efficiency import Calibration
from placer.spec.arch import ModelArch
from placer.spec.catalog import shipped_models
from workflows.moe_mfu import CASES, VERL_H20_PEAK, price_case, verl_flops


def _arch(name: str) -> ModelArch:
    return shipped_models()[name]


def test_verl_flops_qwen3_moe_closed_form() -> None:
    # verl/utils/flops_counter.py `_estimate_qwen2_moe_flops` @c711dd741 by hand, Qwen3-30B-A3B:
    # moe 2048*8*768*3 + 2048*128 = 38,010,880; attn 2048*(4096+512+512+4096) = 18,874,368;
    # x 48 layers + 2*151936*2048 = 3,352,821,760 per token; one sequence of 1,000 tokens:
    # 6 * that * 1,000 + 12 * 1,000^2 * 128 * 32 * 48
    want = 6 * 3_352_821_760 * 1000 + 12 * 1000**2 * 128 * 32 * 48
    assert verl_flops(_arch("Qwen3-30B-A3B"), np.array([1000])) == pytest.approx(want, rel=1e-12)


def test_verl_flops_deepseek_v3_closed_form() -> None:
    # `_estimate_deepseek_v3_flops` by hand: MLA attn 187,105,280; moe 7168*256 + 7168*2048*9*3
    # = 398,196,736; dense 7168*18432*3 = 396,361,728; (moe+attn)*58 + (dense+attn)*3 + 2*V*h
    # = 37,551,276,032 per token; the score term per layer over the full s^2 (q_head_dim 192)
    s = np.array([500, 1500])
    want = 6 * 37_551_276_032 * 2000 + 12 * (500**2 + 1500**2) * 192 * 128 * 61
    assert verl_flops(_arch("DeepSeek-V3"), s) == pytest.approx(want, rel=1e-12)


def test_verl_flops_rejects_dense_model() -> None:
    with pytest.raises(AssertionError, match="not an MoE model"):
        verl_flops(_arch("Qwen2.5-7B"), np.array([100]))


def test_price_case_reads_update_through_verl_counter() -> None:
    case = CASES[0]  # Qwen3-30B-A3B on 8 H20
    t, mfu = price_case(case, Calibration(), seed=0)
    assert t > 0
    # the same draw again gives the same figure (lengths from the seed)
    assert price_case(case, Calibration(), seed=0) == (t, mfu)
    # MFU = verl FLOPs / (t * peak * devices): a fraction of peak
    assert 0 < mfu <= 1
    assert VERL_H20_PEAK == 148e12
