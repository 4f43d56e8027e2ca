"""Calibration profiles: fitted efficiency factors that override the cost model's defaults.

A profile is YAML or JSON:

    default: {mfu_train: 0.35, decode_bw_eff: 0.6}
    devices:
      H100-SXM: {mfu_train: 0.45}

`placer calibrate` writes one from an executed trace; `plan`, `simulate` and `compare` take it with
`--calibration`. Unknown factor names are errors, so a typo never silently keeps a default.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from placer.costmodel import Calibration, Efficiency
from placer.spec import SpecError, read_structured


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


def _floats(values: dict[str, Any], where: str) -> dict[str, float]:
    if not isinstance(values, dict):
        raise SpecError(f"{where}: expected a mapping of factor: value, got {values!r}")
    out = {}
    for k, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf:
            raise SpecError(f"{where}.{k}: expected a non-negative number (got {v!r})")
        out[k] = float(v)
    return out


def load_calibration(path: str | Path | None) -> Calibration:
    if path is None:
        return Calibration()
    return calibration_from_dict(read_structured(path), str(path))
