"""Reading untrusted input files and checking output paths: a leaf module (imports only
`placer.base.errors`).

Every file the CLI reads (jobs, plans, calibration profiles, simulator configs, traces, workload
traces) comes through here, so that a hostile file is one `SpecError` line, never a hang, a
traceback or an exhausted memory:
  * a file is read only up to `MAX_FILE_BYTES`; NUL bytes mean a binary file, and the text must be
    UTF-8;
  * YAML is parsed by the safe loader with two additions: duplicate keys are an error naming the
    key (PyYAML silently keeps the last one), and aliases may not expand the document beyond
    `MAX_YAML_NODES` nodes (a "billion laughs" file is a few lines that expand to 10^9 values,
    which every later walk over the data - validation, `repr` in a message - would take forever
    on) nor refer to themselves;
  * JSON refuses `NaN`, `Infinity` and numbers that overflow to infinity (Python's parser accepts
    all three, and no field of any input means them);
  * output paths are checked before any work starts, so an unwritable `-o` fails in milliseconds,
    not after a long solve or run.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import unicodedata
from pathlib import Path
from typing import Any, NoReturn

import yaml

from placer.base.errors import SpecError

MAX_FILE_BYTES = 64 << 20  # far above any real job, plan, profile or workload trace here
MAX_YAML_NODES = 200_000  # nodes after alias expansion; a 1,000-node cluster file is ~10^4


def escape(text: str) -> str:
    """`text` with control and other invisible characters escaped (`\\n`, `\\x1b`, `\\u202e`), so a
    name or path from a hostile file can neither break the one-line error nor drive a terminal."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch.isprintable() or ch == " ":
            out.append(ch)
        elif unicodedata.category(ch) == "Zs":  # other spaces: visible enough, but say which
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch.encode("unicode_escape").decode("ascii"))
    return "".join(out)


class SpecErrors(SpecError):
    """Several independent mistakes in one input, found in one pass: `lines` holds one message
    per mistake (each naming its field and value); `str()` joins them with newlines. The CLI
    prints each as its own `placer: error:` line, so a user fixes them all in one round."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = list(lines)
        super().__init__("\n".join(self.lines))


def error_lines(err: SpecError) -> list[str]:
    """The lines to print for `err`, each escaped (`escape`): a `SpecErrors` gives one per
    mistake; any other error is one line whatever its text holds (a newline in a hostile path
    stays `\\n`, never a second line)."""
    lines = err.lines if isinstance(err, SpecErrors) else [str(err)]
    return [escape(line) for line in lines]


def read_text(path: str | Path, what: str = "file") -> str:
    """The UTF-8 text of a file no larger than `MAX_FILE_BYTES`; SpecError naming the path when it
    is missing, a folder, unreadable, too large, binary or not UTF-8."""
    p = Path(path)
    try:
        if not p.is_file():
            raise SpecError(f"{p}: no such {what}" if not p.exists() else f"{p}: not a file")
        with p.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)  # never more than the limit, whatever stat says
    except OSError as e:
        raise SpecError(f"{p}: cannot read: {e.strerror or type(e).__name__}") from None
    if len(data) > MAX_FILE_BYTES:
        raise SpecError(f"{p}: larger than {MAX_FILE_BYTES >> 20} MiB (not a {what} this tool "
                        "reads)")
    nul = data.find(b"\x00")
    if nul >= 0:
        raise SpecError(f"{p}: binary data (NUL byte at offset {nul}); expected a text {what}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(f"{p}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
                        f"{e.start})") from None


# ----------------------------------------------------------------------------------------- YAML
# PyYAML ships no type information (its stubs are a separate package): its loader is untyped.
class _Loader(yaml.SafeLoader):  # type: ignore[misc]
    """The safe loader, refusing duplicate keys and alias expansion beyond `MAX_YAML_NODES`."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *base` merges by design: its keys may be overridden
            key = self.construct_object(key_node, deep=True)
            try:
                dup = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the base constructor explains it
                continue
            if dup:
                mark = key_node.start_mark
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", mark)
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


def _expanded_size(root: yaml.Node, limit: int) -> int:
    """Nodes in the document with every alias expanded, counted once per distinct node (memoized,
    so a bomb costs its few lines, not its expansion); ValueError on a self-referring alias."""
    size: dict[int, int] = {}
    active: set[int] = set()

    def walk(node: yaml.Node) -> int:
        key = id(node)
        if key in size:
            return size[key]
        if key in active:
            raise ValueError("an alias refers to the node that contains it (a recursive document)")
        active.add(key)
        n = 1
        if isinstance(node, yaml.SequenceNode):
            for child in node.value:
                n += walk(child)
        elif isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                n += walk(k) + walk(v)
        active.discard(key)
        size[key] = n = min(n, limit + 1)  # saturate: the count itself stays small
        return n

    return walk(root)


def load_yaml(text: str, source: str) -> Any:
    """`yaml.safe_load` with duplicate keys refused and aliases bounded; SpecError naming the line."""
    try:
        loader = _Loader(text)  # the reader refuses control characters here already
    except yaml.YAMLError as e:
        raise SpecError(f"{source}: not valid YAML: {_yaml_problem(e)}") from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        try:
            n = _expanded_size(node, MAX_YAML_NODES)
        except ValueError as e:
            raise SpecError(f"{source}: not valid YAML: {e}") from None
        if n > MAX_YAML_NODES:
            raise SpecError(f"{source}: not valid YAML: aliases expand the document beyond "
                            f"{MAX_YAML_NODES:,} nodes (an alias bomb?)")
        return loader.construct_document(node)
    except SpecError:
        raise
    except yaml.YAMLError as e:
        raise SpecError(f"{source}: not valid YAML: {_yaml_problem(e)}") from None
    except RecursionError:
        raise SpecError(f"{source}: not valid YAML: nested too deeply") from None
    except ValueError as e:  # an integer of more than 4,300 digits
        raise SpecError(f"{source}: not valid YAML: {str(e).splitlines()[0][:120]}") from None
    finally:
        loader.dispose()


def _yaml_problem(e: yaml.YAMLError) -> str:
    """Where and what, in one line: `line 3, column 9: expected ',' or ']', but got '}'`."""
    if isinstance(e, yaml.MarkedYAMLError) and e.problem_mark is not None:
        mark = e.problem_mark
        what = " ".join(str(e.problem or e.context).split())
        return f"line {mark.line + 1}, column {mark.column + 1}: {what}"
    return (str(e).splitlines() or [type(e).__name__])[0]


# ----------------------------------------------------------------------------------------- JSON
def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a number any field accepts")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} overflows to infinity")
    return value


def load_json(text: str, source: str, line: int | None = None) -> Any:
    """`json.loads` without NaN, Infinity or overflowing numbers; SpecError naming the place."""
    where = f"{source}:{line}" if line is not None else source
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except json.JSONDecodeError as e:
        at = f"line {e.lineno}, column {e.colno}" if line is None else f"column {e.colno}"
        raise SpecError(f"{where}: not valid JSON: {at}: {e.msg}") from None
    except ValueError as e:  # NaN/Infinity, overflow, an integer of more than 4,300 digits
        raise SpecError(f"{where}: not valid JSON: {str(e).splitlines()[0][:120]}") from None
    except RecursionError:
        raise SpecError(f"{where}: not valid JSON: nested too deeply") from None


# -------------------------------------------------------------------------------------- outputs
def check_output(path: str | Path | None, flag: str, *, folder: bool = False) -> None:
    """Fail now, before any work, when `path` (a file, or with `folder` a directory) cannot be
    written: the path must not be a directory (a file) or a file (a folder), and its nearest
    existing ancestor must accept a new entry. That is probed by creating and removing a temporary
    one: permission bits say nothing for root, a read-only mount or /proc."""
    if path is None:
        return
    text = str(path)
    if text == "" or "\x00" in text:
        raise SpecError(f"{flag}: not a usable path (got {text!r})")
    p = Path(path)
    try:
        if p.exists():
            if folder and not p.is_dir():
                raise SpecError(f"{flag}: exists and is not a directory (got {text!r})")
            if not folder and p.is_dir():
                raise SpecError(f"{flag}: is a directory, expected a file path (got {text!r})")
            if not folder and not p.is_file():  # a device or a pipe: the atomic rename replaces it
                raise SpecError(f"{flag}: not a regular file (got {text!r})")
        probe_in = p if folder and p.is_dir() else p.parent
        while not probe_in.exists() and probe_in != probe_in.parent:
            probe_in = probe_in.parent
        if not probe_in.is_dir():
            raise SpecError(f"{flag}: {str(probe_in)!r} is not a directory (got {text!r})")
        os.rmdir(tempfile.mkdtemp(prefix=".placer-probe-", dir=probe_in))
    except OSError as e:
        raise SpecError(f"{flag}: cannot write there: {e.strerror or type(e).__name__} "
                        f"(got {text!r})") from None
