"""docs/architecture.md lists the layers exactly as pyproject.toml's import-linter contracts define
them, and its picture's script draws from those contracts."""
from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def _normal(layer: str) -> str:
    """One layer as text with single spaces around its ":" and "|" separators."""
    return re.sub(r"\s*([:|])\s*", r" \1 ", layer.strip())


def doc_layers(text: str) -> list[str]:
    """The layers in the first code block under '## Layers', top to bottom."""
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```", 2)[1]
    return [_normal(line) for line in block.splitlines() if line.strip()]


def contract(kind: str) -> dict:
    return next(c for c in CONTRACTS if c["type"] == kind)


def test_the_documented_layers_are_the_contracts() -> None:
    assert doc_layers(DOC.read_text()) == [_normal(x) for x in contract("layers")["layers"]]


def test_the_independent_pair_is_documented_as_one_layer() -> None:
    independent = sorted(contract("independence")["modules"])
    split = [sorted(m.strip() for m in layer.split("|"))
             for layer in doc_layers(DOC.read_text()) if "|" in layer]
    assert split == [independent]


def test_a_changed_contract_would_be_caught() -> None:
    """The comparison is not vacuous: a layer moved in the text no longer matches."""
    text = DOC.read_text().replace("placer.solve\nplacer.cost\n", "placer.cost\nplacer.solve\n")
    assert doc_layers(text) != [_normal(x) for x in contract("layers")["layers"]]


def _script() -> ModuleType:
    path = ROOT / "scripts" / "draw_architecture.py"
    spec = importlib.util.spec_from_file_location("draw_architecture", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_picture_is_drawn_from_the_contracts(tmp_path: Path) -> None:
    draw = _script()
    layers = draw.contract_layers(ROOT / "pyproject.toml")  # bottom up
    flat = [" | ".join(" : ".join(g) for g in layer) for layer in reversed(layers)]
    assert flat == [_normal(x) for x in contract("layers")["layers"]]
    out = draw.draw(layers, tmp_path / "arch.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "](architecture.png)" in DOC.read_text() and (ROOT / "docs" / "architecture.png").is_file()
