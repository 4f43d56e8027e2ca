"""Plans in and out of the frameworks RL teams already run: verl, OpenRLHF, NeMo-RL, Miles
and KubeRay.

Each framework is one export target in one registry (`placer.interop.targets`: `TARGETS`,
`target_of`, `importer_of`): its exporter turns a plan into the framework's own configuration
(an `placer.interop.common.Export`: files to write, warnings, the launch command); its importer,
where it has one, turns an existing run configuration into a job spec whose `current` section
records the run's placement, so `placer compare` prices it beside the ILP's. Nothing here writes
files or prints: the front end (`placer.commands.export`, `placer.commands.importrun`,
`placer.api`) does. Importing this package loads no renderer (the CLI lists the names).
"""
from __future__ import annotations

from placer.interop.targets import TARGETS, Target, importer_of, target_of

__all__ = ["TARGETS", "Target", "importer_of", "target_of"]
