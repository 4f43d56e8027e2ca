"""Shared pieces of every spec model: strict pydantic base, bounded number types, SpecError.

Kept apart from `placer.spec.job` so that small spec modules (distributions) can build on them without
importing the whole job model.
"""
from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from placer.base.errors import SpecError

__all__ = ["MAX_CONTEXT_TOKENS", "PosFloat", "PosInt", "SpecError", "Strict"]

# Upper bounds are far beyond any real cluster or model; they keep every later product of sizes a
# finite float, so an absurd file is a clean SpecError here rather than an overflow in an estimate.
# strict: a YAML `true` or `"8"` is a wrong type, not 1 or 8 (lax mode would coerce them).
PosFloat = Annotated[float, Field(strict=True, gt=0, le=1e15)]
PosInt = Annotated[int, Field(strict=True, gt=0, le=1_000_000_000)]
MAX_CONTEXT_TOKENS = 1 << 26  # a sample's longest context (prompt + turns); ~67M tokens




class Strict(BaseModel):
    # allow_inf_nan=False: YAML's `.inf` / `.nan` are numbers to a parser but never a valid size.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
