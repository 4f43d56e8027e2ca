"""Pydantic validation errors as the lines a user reads: one line per mistake.

Each line names the field path, says what is wrong in one sentence and shows the bad value
(shortened); an unknown key lists the keys that are accepted there, so a typo finds its fix. A job
reports every mistake (`placer.spec.load.job_from_dict`), and so does a trace's plan
(placer/commands/calibrate.py); plan files and simulator configs report the first with a count of
the others (`format_validation_error`).

Part of the job model's surface (`placer.spec.job` re-exports `validation_lines` and
`format_validation_error`).
"""
from __future__ import annotations

from typing import Any, get_args

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from placer.base.inputs import escape


def _shown(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _model_in(ann: object) -> type[BaseModel] | None:
    """The pydantic model inside an annotation such as `X`, `list[X]` or `X | None`."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in get_args(ann):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _keys_at(root: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The keys the model at `loc` (below `root`) accepts; [] when the path leaves the models."""
    cls: type[BaseModel] | None = root
    for part in loc:
        if isinstance(part, int):
            continue  # a list index: the element type is already `cls`
        fields = _by_key(cls) if cls is not None else {}
        field = fields.get(str(part))
        cls = _model_in(field.annotation) if field is not None else None
        if cls is None:
            return []
    return list(_by_key(cls)) if cls is not None else []  # the loop returned on None


def _by_key(cls: type[BaseModel]) -> dict[str, Any]:
    """A model's fields by the key a file writes (the alias where there is one: `kl.in`)."""
    return {f.alias or name: f for name, f in cls.model_fields.items()}


def _error_line(e: ErrorDetails, prefix: str, root: type[BaseModel] | None) -> str:
    """One pydantic error as `field.path: message (got value)`; `root` lists keys for a typo.
    Key names come from the input: each is escaped here (a key holding a newline must not split
    the line for a caller of the Python API), and the CLI escapes each whole line again
    (`placer.base.inputs.error_lines`; escaping is idempotent on printable text)."""
    loc = ".".join(escape(str(x)) for x in e["loc"])
    if not loc:  # a whole-object check: under a field prefix ("cluster."), that field
        prefix, loc = (prefix[:-1], "") if prefix.endswith(".") else (prefix, "(top level)")
    msg = " ".join(e["msg"].removeprefix("Value error, ").split())  # always one line
    got = e.get("input")
    # A missing key or a whole-object check has the enclosing mapping as its input: not a value.
    hide = got is None or (isinstance(got, dict) and e["type"] in ("missing", "value_error"))
    shown = "" if hide else f" (got {_shown(got)})"
    if e["type"] == "extra_forbidden":
        keys = _keys_at(root, e["loc"][:-1]) if root is not None else []
        msg, shown = "unknown key" + (f"; expected one of {', '.join(keys)}" if keys else ""), ""
    return f"{prefix}{loc}: {msg}{shown}"


def validation_lines(err: ValidationError, prefix: str = "",
                     root: type[BaseModel] | None = None) -> list[str]:
    """Every error of `err`, one line each (`_error_line`), in the order pydantic found them."""
    lines = [_error_line(e, prefix, root) for e in err.errors()]
    return list(dict.fromkeys(lines))  # one line per distinct mistake


def format_validation_error(err: ValidationError, prefix: str = "",
                            root: type[BaseModel] | None = None) -> str:
    """The first error as one line, with a count of the others (inputs other than jobs; a job
    reports every error: `job_from_dict`)."""
    lines = validation_lines(err, prefix, root)
    more = f" [+{len(lines) - 1} more]" if len(lines) > 1 else ""
    return lines[0] + more
