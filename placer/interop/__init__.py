"""Plans in and out of the frameworks RL teams already run: verl, OpenRLHF and KubeRay.

Exporters turn a plan into a framework's own configuration (`EXPORTERS`: name -> function of a
`Plan` returning an `Export`: files to write, warnings, the launch command); importers turn a
framework's existing run configuration into a job spec whose `current` section records the run's
placement, so `placer compare` prices it beside the ILP's (`IMPORTERS`). Nothing here writes
files or prints: the front end (`placer.commands.export`, `placer.commands.importrun`) does.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from placer.interop.common import Export
from placer.interop.kuberay import export_kuberay
from placer.interop.openrlhf import export_openrlhf
from placer.interop.verl import export_verl
from placer.solve.planfile import Plan

EXPORTERS: dict[str, Callable[[Plan], Export]] = {
    "verl": export_verl,
    "openrlhf": export_openrlhf,
    "kuberay": export_kuberay,
}


def importer_table() -> dict[str, Callable[..., Any]]:
    """Framework -> importer (`placer.interop.importers`), looked up when an import runs (not
    named `importers`: the submodule of that name would shadow it once imported)."""
    from placer.interop.importers import import_openrlhf, import_verl
    return {"verl": import_verl, "openrlhf": import_openrlhf}


__all__ = ["EXPORTERS", "Export", "importer_table"]
