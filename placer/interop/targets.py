"""Export targets: the one registry that `placer export`, `placer import` and `placer.api` name.

A target is one class here: its export (a plan as the framework's own configuration: an
`Export` of files, warnings and the launch command), the export options it takes beyond the
plan, whether it writes a folder of files, and its import (an existing run's configuration as a
job whose `current` section records the run's placement) where the framework has one:

  verl      `placer.interop.verl`: overrides.yaml + launch.sh; imports a config or launch script
  openrlhf  `placer.interop.openrlhf`: the train_ppo_ray command line; imports one (inline, or
            a file holding it)
  nemo-rl   `placer.interop.nemorl`: a GRPO recipe YAML over a shipped base recipe; imports a
            recipe (its `defaults` read beside it)
  miles     `placer.interop.miles`: the train.py launch script; imports one
  easyr1    `placer.interop.easyr1`: EasyR1's config YAML; imports a config or launch script
  kuberay   `placer.interop.kuberay`: RayCluster, RayJob and the plan's ConfigMap (--image,
            --steps); no import

The rendering modules load when a target exports or imports (they read the planner's types), so
this module stays light: the CLI reads its names for `--help`. Adding a target is one class here
(and its rendering module); nothing outside this module compares a target's name.
"""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from placer.base.errors import SpecError

if TYPE_CHECKING:
    from placer.interop.common import Export
    from placer.solve.planfile import Plan

Imported = tuple[dict[str, Any], list[str]]  # the job (a dict) and the assumptions made


class Target:
    """A framework a plan exports to (and, where it has an importer, a run imports from)."""

    name: ClassVar[str]
    title: ClassVar[str]  # the framework's own spelling, for help texts
    writes_folder: ClassVar[bool] = False  # several files: `-o DIR`; else one launch script
    options: ClassVar[tuple[str, ...]] = ()  # export options beyond the plan (CLI flags too)
    imports: ClassVar[bool] = False

    runs_agents: ClassVar[bool] = False  # a multi-agent plan (`job.agents`): several policies

    def export(self, plan: Plan, **options: Any) -> Export:
        """The plan as the framework's configuration (`render`); SpecError (exit 2) naming
        `agents` for a multi-agent plan the framework cannot express."""
        refuse_agents(plan, self)
        return self.render(plan, **options)

    def render(self, plan: Plan, **options: Any) -> Export:
        raise NotImplementedError

    def check_options(self, given: Iterable[str], flag: str = "") -> None:
        """SpecError (exit 2) naming the first of the `given` options this target does not
        take (`flag`: how the caller spells an option, "--" for the CLI)."""
        for opt in given:
            if opt not in self.options:
                takers = [t.name for t in TARGETS.values() if opt in t.options]
                raise SpecError(f"{flag}{opt}: applies to {names_help(takers) or 'no target'} "
                                f"only (got framework {self.name!r})")

    def import_run(self, text: str, source: str, *, device: str, name: str,
                   variables: dict[str, str] | None = None) -> Imported:
        """The job `text` (read from `source`) describes; SpecError naming what is wrong.
        `variables`: the environment a script's shell variables expand in (`--set`)."""
        raise SpecError(f"framework: {self.name} has no importer (import from one of "
                        f"{', '.join(importer_names())})")

    def read_source(self, source: str) -> tuple[str, str]:
        """(text, where it came from) of what an import was given: a file's contents."""
        from placer.base.inputs import read_text
        return read_text(Path(source)), source


def refuse_agents(plan: Plan, target: Target) -> None:
    """SpecError naming `agents` when a multi-agent plan goes to a target that runs one policy
    per job: exporting the first agent alone would silently drop the others' roles."""
    agents = plan.spec.agents
    if agents is None or target.runs_agents:
        return
    raise SpecError(f"agents: {target.title} runs one policy per job; this plan co-trains "
                    f"{len(agents.members)} agents ({', '.join(agents.members)}) in turns "
                    f"{' -> '.join(agents.turns)} and cannot be exported to it (plan and "
                    "simulate it with placer)")


class Verl(Target):
    name = "verl"
    title = "verl"
    writes_folder = True
    imports = True

    def render(self, plan: Plan, **options: Any) -> Export:
        from placer.interop.verl import export_verl
        return export_verl(plan, **options)

    def import_run(self, text: str, source: str, *, device: str, name: str,
                   variables: dict[str, str] | None = None) -> Imported:
        from placer.interop.importers import import_verl
        return import_verl(text, source, device=device, name=name, variables=variables)


class OpenRLHF(Target):
    name = "openrlhf"
    title = "OpenRLHF"
    imports = True

    def render(self, plan: Plan, **options: Any) -> Export:
        from placer.interop.openrlhf import export_openrlhf
        return export_openrlhf(plan, **options)

    def import_run(self, text: str, source: str, *, device: str, name: str,
                   variables: dict[str, str] | None = None) -> Imported:
        from placer.interop.importers import import_openrlhf
        return import_openrlhf(text, source, device=device, name=name, variables=variables)

    def read_source(self, source: str) -> tuple[str, str]:
        """The command line itself when `source` is one (it has flags and names no file)."""
        from placer.interop.common import names_a_file
        if "--" in source and not names_a_file(source):
            return source, "command line"
        return super().read_source(source)


class NemoRL(Target):
    name = "nemo-rl"
    title = "NeMo-RL"
    imports = True

    def render(self, plan: Plan, **options: Any) -> Export:
        from placer.interop.nemorl import export_nemo_rl
        return export_nemo_rl(plan, **options)

    def import_run(self, text: str, source: str, *, device: str, name: str,
                   variables: dict[str, str] | None = None) -> Imported:
        from placer.interop.nemorl import import_nemo_rl
        return import_nemo_rl(text, source, device=device, name=name, variables=variables)


class Miles(Target):
    name = "miles"
    title = "Miles"
    imports = True

    def render(self, plan: Plan, **options: Any) -> Export:
        from placer.interop.miles import export_miles
        return export_miles(plan, **options)

    def import_run(self, text: str, source: str, *, device: str, name: str,
                   variables: dict[str, str] | None = None) -> Imported:
        from placer.interop.miles import import_miles
        return import_miles(text, source, device=device, name=name, variables=variables)


class EasyR1(Target):
    name = "easyr1"
    title = "EasyR1"
    imports = True

    def render(self, plan: Plan, **options: Any) -> Export:
        from placer.interop.easyr1 import export_easyr1
        return export_easyr1(plan, **options)

    def import_run(self, text: str, source: str, *, device: str, name: str,
                   variables: dict[str, str] | None = None) -> Imported:
        from placer.interop.easyr1 import import_easyr1
        return import_easyr1(text, source, device=device, name=name, variables=variables)


class KubeRay(Target):
    name = "kuberay"
    title = "KubeRay"
    writes_folder = True
    options = ("image", "steps")

    def render(self, plan: Plan, **options: Any) -> Export:
        """`image`: the container image (None: Ray's own, with a warning); `steps`: the RL
        steps the RayJob runs."""
        from placer.interop.kuberay import DEFAULT_IMAGE, export_kuberay
        image = options.pop("image", None) or DEFAULT_IMAGE
        return export_kuberay(plan, image=image, **options)


TARGETS: dict[str, Target] = {t.name: t for t in (Verl(), OpenRLHF(), NemoRL(), Miles(), EasyR1(),
                                                       KubeRay())}


def target_of(name: str) -> Target:
    """The export target `name`; SpecError (exit 2) naming the field and the known ones."""
    t = TARGETS.get(name)
    if t is None:
        raise SpecError(f"framework: unknown export target {name!r} (expected one of "
                        f"{', '.join(TARGETS)})")
    return t


def importer_names() -> list[str]:
    return [t.name for t in TARGETS.values() if t.imports]


def importer_of(name: str) -> Target:
    """The target `name` runs are imported from; SpecError (exit 2) naming the field and the
    frameworks that have an importer."""
    t = TARGETS.get(name)
    if t is None or not t.imports:
        why = "unknown framework" if t is None else "no importer for"
        raise SpecError(f"framework: {why} {name!r} (expected one of "
                        f"{', '.join(importer_names())})")
    return t


def names_help(names: list[str]) -> str:
    """The names as a help text lists them: "a, b or c"."""
    if not names:
        return ""
    return ", ".join(names[:-1]) + (" or " if len(names) > 1 else "") + names[-1]
