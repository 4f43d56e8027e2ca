"""Typed results with a JSON form: the base of the reports the project prints or writes as JSON
(the simulator's metrics, the plan's explanation, the fidelity and published-runs reports).

A `Record` is a frozen pydantic model whose fields, in the order they are declared, are the keys
of its JSON document. `to_dict()` is that document as plain Python values, the form to hand to
`json.dumps` (or a YAML writer): the front ends print it exactly as they printed the dicts these
records replaced. `to_json()` is the text, and `from_dict()` / `from_json()` read a document back
into an equal record. Readers use the attributes; only writers ask for the dict.

A record that leaves a key out of its document when it has nothing to say there (an optional
section) declares that in its own serializer; this base adds nothing but the four methods.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Self

from pydantic import BaseModel, ConfigDict


class Record(BaseModel):
    """A frozen, typed result whose JSON form is its fields in declaration order."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def to_dict(self) -> dict[str, Any]:
        """The JSON document as plain Python values (dicts, lists, str, int, float, bool, None)."""
        out: dict[str, Any] = self.model_dump(mode="python")
        return out

    def to_json(self, indent: int | None = 2) -> str:
        """The JSON text of `to_dict()` (`json.dumps`: Python's float repr, keys in order)."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """The record a `to_dict()` document describes (pydantic's ValidationError if it is not one)."""
        return cls.model_validate(data)

    @classmethod
    def from_json(cls, text: str) -> Self:
        return cls.from_dict(json.loads(text))
