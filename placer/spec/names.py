"""Catalog names as people write them: one reading of a model or device name, used both to match
a foreign name to a catalog entry (`placer import`) and to suggest the entry a job file meant.

A Hugging Face repository names a model together with the variant of its weights: a release
(`-Instruct`, `-Chat`, `-Base`, `-it`, `-hf`, `-Thinking`, a date such as `-2507` or `-0528`)
or a quantisation (`-FP8`, `-AWQ`, `-GPTQ-Int4`). A release shares its base model's config.json
shapes, so the importers take `Qwen/Qwen3-30B-A3B-Instruct-2507` as the catalog's
`Qwen3-30B-A3B` (`catalog_model`). A quantised checkpoint shares the shapes but not the bytes per
weight, so it is never matched, only suggested (FP8 with the job's `precision` setting).

A job file names its entries exactly: an unknown name is an error whose message suggests the
closest entries (`suggest_model`, `suggest_device`, `did_you_mean`), never a silent
substitution. Devices are compared without case, vendor, form factor (SXM, PCIe, NVL) or memory
size (80G, 141GB): `H100` and `nvidia-h100-80gb-hbm3` suggest `H100-SXM`, `h20` suggests `H20`.
Other names fall back to difflib's close matches.
"""
from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# a catalog source starting with the repository its numbers were read from: "Qwen/Qwen2.5-7B config.json"
_HF_REPO = re.compile(r"^([A-Za-z0-9][\w.-]*/[\w.-]+) config\.json")
_RELEASES = frozenset({"instruct", "chat", "base", "hf", "it", "thinking"})
_RELEASE_DATE = re.compile(r"^(\d{4}|\d{6}|\d{8})$")  # 2507 (yymm), 240620, 20240620
_QUANTS = frozenset({"fp8", "fp4", "nvfp4", "mxfp4", "int4", "int8", "awq", "gptq", "w8a8",
                     "w4a16", "w8a16", "bnb", "4bit", "8bit", "dynamic", "gguf"})
_DEVICE_NOISE = frozenset({"nvidia", "tesla", "sxm", "sxm4", "sxm5", "pcie", "nvl", "hgx",
                           "hbm2e", "hbm3", "hbm3e"})
_MEMORY = re.compile(r"^\d+(g|gb)$")  # 80g, 141gb
_SEPARATORS = re.compile(r"[-_\s]+")
CLOSE_MATCHES = 3  # suggestions shown at most
CLOSE_CUTOFF = 0.6  # difflib's similarity floor: below it a name suggests nothing


@dataclass(frozen=True)
class ModelName:
    """A model name read as base + variant: `Qwen/Qwen3-8B-Instruct-2507-FP8` is base `qwen3-8b`
    (lower case, last path component), releases ('instruct', '2507'), quantisation ('fp8',)."""

    base: str
    releases: tuple[str, ...]
    quantisation: tuple[str, ...]


def read_model_name(name: str) -> ModelName:
    """Strip trailing release and quantisation tokens (in any order) off the name's last path
    component; the first token always stays (a model named `Base` is its own base)."""
    tokens = name.rstrip("/").split("/")[-1].lower().split("-")
    releases: list[str] = []
    quants: list[str] = []
    while len(tokens) > 1:
        last = tokens[-1]
        if last in _RELEASES or _RELEASE_DATE.match(last):
            releases.insert(0, tokens.pop())
        elif last in _QUANTS:
            quants.insert(0, tokens.pop())
        else:
            break
    return ModelName("-".join(tokens), tuple(releases), tuple(quants))


def hf_repo(source: str) -> str | None:
    """The Hugging Face repository a catalog entry's `source` cites first, or None."""
    found = _HF_REPO.match(source)
    return found.group(1) if found else None


def _model_keys(sources: Mapping[str, str]) -> dict[str, list[str]]:
    """Base name -> catalog entries: each entry under its own name and its repository's."""
    keys: dict[str, list[str]] = {}
    for name, source in sources.items():
        repo = hf_repo(source)
        for spelled in (name, repo) if repo else (name,):
            entries = keys.setdefault(read_model_name(spelled).base, [])
            if name not in entries:
                entries.append(name)
    return keys


def catalog_model(sources: Mapping[str, str], path: str) -> str | None:
    """The catalog entry (name -> source) a Hugging Face path or name runs: its repository or
    name (any case; a local copy `/models/Qwen/Qwen2.5-7B` too), or a release variant of one
    (`-Instruct`, `-2507`). A quantised checkpoint matches nothing (its bytes differ)."""
    want = "/".join(path.rstrip("/").split("/")[-2:]).lower()
    last = want.split("/")[-1]
    for name, source in sources.items():
        repo = hf_repo(source)
        if (repo is not None and repo.lower() == want) or name.lower() == last:
            return name
    read = read_model_name(path)
    if read.quantisation:
        return None
    found = _model_keys(sources).get(read.base)
    return found[0] if found else None


def _closest(key: str, keys: Mapping[str, list[str]]) -> list[str]:
    """The entries whose key equals `key`, else those of difflib's closest keys."""
    if key in keys:
        return keys[key][:CLOSE_MATCHES]
    out: list[str] = []
    for near in difflib.get_close_matches(key, list(keys), n=CLOSE_MATCHES, cutoff=CLOSE_CUTOFF):
        out += [n for n in keys[near] if n not in out]
    return out[:CLOSE_MATCHES]


def suggest_model(name: str, sources: Mapping[str, str]) -> list[str]:
    """The catalog entries (name -> source) an unknown model name most likely means: the base
    architecture of a variant (`Qwen3-30B-A3B-Instruct-2507` -> `Qwen3-30B-A3B`), else the
    closest names; [] when nothing is close."""
    return _closest(read_model_name(name).base, _model_keys(sources))


def device_key(name: str) -> str:
    """A device name without case, vendor, form factor, memory type or size: `H100-SXM`, `h100`
    and `NVIDIA-H100-80GB-HBM3` are all `h100`."""
    tokens = [t for t in _SEPARATORS.split(name.lower())
              if t and t not in _DEVICE_NOISE and not _MEMORY.match(t)]
    return "".join(tokens) or name.lower()


def suggest_device(name: str, devices: Iterable[str]) -> list[str]:
    """The device types an unknown device name most likely means (`H100` -> `H100-SXM`); []
    when nothing is close."""
    keys: dict[str, list[str]] = {}
    for d in devices:
        keys.setdefault(device_key(d), []).append(d)
    return _closest(device_key(name), keys)


def did_you_mean(found: list[str], hint: str = "") -> str:
    """` (did you mean 'A' or 'B'?)` for an error message, '' when nothing was found; `hint`
    follows the names (the setting a quantised name asks for)."""
    if not found:
        return ""
    return f" (did you mean {' or '.join(repr(n) for n in found)}{hint}?)"


def model_hint(name: str) -> str:
    """What a quantised name's base entry needs besides its name: FP8 weights are the job's
    precision setting, not another architecture."""
    if "fp8" in read_model_name(name).quantisation:
        return " with precision.rollout_weights: fp8"
    return ""
