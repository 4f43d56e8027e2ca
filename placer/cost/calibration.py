"""Calibration profiles read and written: fitted efficiency factors that override the cost model's
defaults (`placer.cost.efficiency.Calibration`, the one type of a profile).

A profile is YAML or JSON:

    default: {mfu_train: 0.35, decode_bw_eff: 0.6}
    devices:
      H100-SXM: {mfu_train: 0.45}
    fit: {...}    # how `placer calibrate` fitted them (`FitReport`); optional

`placer calibrate` writes one from a trace; `plan`, `simulate` and `compare` take it with
`--calibration`, and a plan records the profile it was priced with (`CalibrationField`). Unknown
factor names are errors, so a typo never silently keeps a default, and values the cost model
cannot divide by are refused. Every `Efficiency` field may be set here; which ones `placer
calibrate` fits, and why the others keep their defaults: docs/cost-model.md, "Calibration".
A profile written back (`write_calibration`, or inside a plan) is the text it was read from.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import PlainSerializer, PlainValidator, ValidationError

from placer.base.errors import SpecError
from placer.base.fileio import atomic_write_text
from placer.cost.efficiency import SECTIONS, Calibration, FitReport, Overrides
from placer.spec.errorlines import format_validation_error
from placer.spec.load import read_structured


def calibration_from_dict(data: Mapping[str, Any], source: str = "calibration") -> Calibration:
    """The profile a document describes; SpecError naming the field and the value otherwise."""
    bad = sorted(set(data) - set(SECTIONS))
    if bad:
        raise SpecError(f"{source}: {bad[0]}: unknown key (expected default, devices, fit)")
    default = data.get("default")
    devices = data.get("devices")
    _check_factors(default, f"{source}: default")
    if devices is not None and not isinstance(devices, dict):
        raise SpecError(f"{source}: devices: expected a mapping of device type: factors "
                        f"(got {devices!r:.60})")
    for name, v in (devices or {}).items():
        _check_factors(v, f"{source}: devices.{name}")
    fit = None
    if data.get("fit") is not None:
        try:
            fit = FitReport.from_dict(data["fit"])
        except ValidationError as e:
            raise SpecError(format_validation_error(e, f"{source}: fit.")) from None
    written = Overrides(default, devices, tuple(data))
    try:
        return Calibration.of(written, fit)
    except KeyError as e:
        raise SpecError(f"{source}: {e.args[0]}") from None


# Factors the cost model divides by (achieved fractions, bandwidths): 0 would be a division by zero.
POSITIVE = frozenset({"mfu_train", "mfu_prefill", "mfu_score", "mfu_attention", "decode_bw_eff",
                      "decode_flops_eff",
                      "link_eff", "tp_link_eff", "offload_gbs", "kv_mem_fraction", "sync_sender_gbs",
                      "sync_local_gbs", "dispatch_gbs"})
FRACTIONS = {"kv_mem_fraction": (0.0, 1.0), "lpu_kv_reserve": (0.0, 0.99)}  # shares of memory
COUNTS = frozenset({"max_num_seqs", "kv_block_tokens"})  # an engine's whole-number settings
MAX_FACTOR = 1e6  # beyond any real factor, overhead or bandwidth; keeps every product finite
MIN_DIVISOR = 1e-12  # a divisor below it (1e-320, say) makes times overflow to inf, then NaN


def _check_factors(values: Any, where: str) -> None:
    """`values` (None, or a mapping of factor: value) checked: SpecError naming the first bad
    value."""
    if values is None:
        return
    if not isinstance(values, dict):
        raise SpecError(f"{where}: expected a mapping of factor: value, got {values!r:.60}")
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


def load_calibration(path: str | Path | None) -> Calibration:
    """The profile in a YAML or JSON file; no path: the shipped defaults (`Calibration()`)."""
    if path is None:
        return Calibration()
    return calibration_from_dict(read_structured(path), str(path))


def write_calibration(calib: Calibration, path: str | Path) -> None:
    """The profile's document to `path`, atomically: JSON for a `.json` suffix, else YAML."""
    p = Path(path)
    doc = calib.to_dict()
    text = json.dumps(doc, indent=2) if p.suffix == ".json" else yaml.safe_dump(doc, sort_keys=False)
    atomic_write_text(p, text)


def _read_field(value: Any) -> Calibration | None:
    if value is None or isinstance(value, Calibration):
        return value
    if not isinstance(value, dict):
        raise ValueError(f"expected a calibration profile (a mapping), got {value!r:.60}")
    try:
        return calibration_from_dict(value)
    except SpecError as e:  # pydantic names the field: the message without our prefix
        raise ValueError(str(e).removeprefix("calibration: ")) from None


def _write_field(value: Calibration | None) -> dict[str, Any] | None:
    return None if value is None else value.to_dict()


# A profile as a field of a pydantic model (a plan's `calibration`): read from, and written as,
# its document.
CalibrationField = Annotated[Calibration | None, PlainValidator(_read_field),
                             PlainSerializer(_write_field)]
