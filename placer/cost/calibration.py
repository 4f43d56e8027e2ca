"""Calibration profiles: fitted efficiency factors that override the cost model's defaults.

A profile is YAML or JSON:

    default: {mfu_train: 0.35, decode_bw_eff: 0.6}
    devices:
      H100-SXM: {mfu_train: 0.45}

`placer calibrate` writes one from a trace; `plan`, `simulate` and `compare` take it with
`--calibration`. Unknown factor names are errors, so a typo never silently keeps a default, and
values the cost model cannot divide by are refused. Every `Efficiency` field may be set here;
which ones `placer calibrate` fits, and why the others keep their defaults:
docs/cost-model.md, "Calibration".
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from placer.base.errors import SpecError
from placer.cost.efficiency import Calibration, Efficiency
from placer.spec.load import read_structured


def calibration_from_dict(data: dict[str, Any], source: str = "calibration") -> Calibration:
    bad = sorted(set(data) - {"default", "devices", "fit"})
    if bad:
        raise SpecError(f"{source}: {bad[0]}: unknown key (expected default, devices, fit)")
    try:
        default = Efficiency().override(_floats(data.get("default") or {}, f"{source}: default"))
        devices = data.get("devices") or {}
        if not isinstance(devices, dict):
            raise SpecError(f"{source}: devices: expected a mapping of device type: factors "
                            f"(got {devices!r:.60})")
        per = {name: default.override(_floats(v or {}, f"{source}: devices.{name}"))
               for name, v in devices.items()}
    except KeyError as e:
        raise SpecError(f"{source}: {e.args[0]}") from None
    return Calibration(default=default, per_device=per)


# Factors the cost model divides by (achieved fractions, bandwidths): 0 would be a division by zero.
POSITIVE = frozenset({"mfu_train", "mfu_prefill", "mfu_score", "decode_bw_eff", "decode_flops_eff",
                      "link_eff", "offload_gbs", "kv_mem_fraction", "sync_sender_gbs", "sync_local_gbs",
                      "dispatch_gbs"})
FRACTIONS = {"kv_mem_fraction": (0.0, 1.0), "lpu_kv_reserve": (0.0, 0.99)}  # shares of memory
COUNTS = frozenset({"max_num_seqs", "kv_block_tokens"})  # an engine's whole-number settings
MAX_FACTOR = 1e6  # beyond any real factor, overhead or bandwidth; keeps every product finite
MIN_DIVISOR = 1e-12  # a divisor below it (1e-320, say) makes times overflow to inf, then NaN


def _floats(values: dict[str, Any], where: str) -> dict[str, float]:
    if not isinstance(values, dict):
        raise SpecError(f"{where}: expected a mapping of factor: value, got {values!r:.60}")
    out = {}
    for k, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= MAX_FACTOR:
            raise SpecError(f"{where}.{k}: expected a non-negative number up to {MAX_FACTOR:g} "
                            f"(got {v!r:.60})")
        if k in POSITIVE and v < MIN_DIVISOR:
            raise SpecError(f"{where}.{k}: must be at least {MIN_DIVISOR:g} (the cost model "
                            f"divides by it) (got {v!r})")
        lo, hi = FRACTIONS.get(k, (0.0, MAX_FACTOR))
        if not lo <= v <= hi:
            raise SpecError(f"{where}.{k}: a share of memory, expected {lo:g} to {hi:g} "
                            f"(got {v!r})")
        if k in COUNTS and (v < 1 or v != int(v)):
            raise SpecError(f"{where}.{k}: a count, expected a whole number of at least 1 "
                            f"(got {v!r})")
        out[k] = float(v)
    return out


def load_calibration(path: str | Path | None) -> Calibration:
    if path is None:
        return Calibration()
    return calibration_from_dict(read_structured(path), str(path))
