"""`placer import verl|openrlhf|nemo-rl|miles|easyr1 SOURCE -o JOB.yaml`: a job spec from a run you have.

    placer import verl CONFIG.yaml|LAUNCH.sh -o JOB.yaml [--device H100-SXM] [--name NAME]
                       [--set VAR=VALUE ...]
    placer import openrlhf "CMDLINE"|FILE -o JOB.yaml [--device ...] [--name ...] [--set ...]
    placer import nemo-rl RECIPE.yaml -o JOB.yaml      (its `defaults:` read beside it)
    placer import miles SCRIPT.sh -o JOB.yaml [--set ...]
    placer import easyr1 CONFIG.yaml|LAUNCH.sh -o JOB.yaml   (`config=` read from its repository)

A launch script's shell variables are expanded as its shell would (assignments earlier in the
script, `${VAR:-default}`, `$((arithmetic))`, bash arrays); `--set VAR=VALUE` gives what the script takes
from its environment. A setting the importer reads that still names an unset variable exits 2
naming it.

The job records the run's placement under `current:`, so `placer compare JOB.yaml` prices it as
the baseline `current` beside the ILP's plan. What the run's configuration does not say (GPU type,
length distributions, a CPU node for rule rewards) is assumed: each assumption is printed on
stderr and written at the top of the job file. (The module is not named `import`: a keyword.)
"""
from __future__ import annotations

import argparse
import re

import yaml

from placer.base.errors import SpecError
from placer.base.fileio import atomic_write_text
from placer.base.inputs import check_output
from placer.cli import emit_json, note
from placer.interop.importers import with_models
from placer.interop.targets import importer_names, importer_of, names_help
from placer.spec.load import job_from_dict


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("framework", help=names_help(importer_names()))
    p.add_argument("source", metavar="SOURCE",
                   help="verl: a config YAML or launch script; openrlhf: the train_ppo_ray "
                        "command line, or a file holding it; nemo-rl: a recipe YAML; miles: a "
                        "launch script")
    p.add_argument("-o", "--output", metavar="JOB.yaml", help="write the job here")
    p.add_argument("--device", default="H100-SXM",
                   help="GPU type of the run's nodes (catalog name; default H100-SXM)")
    p.add_argument("--name", help="job name (default: imported-<framework>)")
    p.add_argument("--set", action="append", default=[], metavar="VAR=VALUE",
                   help="a shell variable the script takes from its environment (repeatable)")
    p.add_argument("--model", action="append", default=[], metavar="PATH=NAME",
                   help="a fine-tuned checkpoint the source names, priced as the catalog model "
                        "NAME it was tuned from (repeatable)")
    p.add_argument("--json", action="store_true", help="print the job as one JSON document")


def _models(given: list[str]) -> dict[str, str]:
    """`--model PATH=NAME` pairs; SpecError (exit 2) naming a malformed one."""
    out = {}
    for pair in given:
        path, eq, name = pair.rpartition("=")
        if not eq or not path or not name:
            raise SpecError(f"--model: expected PATH=NAME, a checkpoint and its catalog model "
                            f"(got {pair!r})")
        out[path] = name
    return out


def _variables(given: list[str]) -> dict[str, str]:
    """`--set VAR=VALUE` pairs; SpecError (exit 2) naming a malformed one."""
    out = {}
    for pair in given:
        name, eq, value = pair.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise SpecError(f"--set: expected VAR=VALUE with a shell variable name (got {pair!r})")
        out[name] = value
    return out


def run(args: argparse.Namespace) -> int:
    target = importer_of(args.framework)
    check_output(args.output, "--output")
    if not args.output and not args.json:
        raise SpecError("--output: give the job file to write (-o JOB.yaml), or --json")
    text, source = target.read_source(args.source)
    text = with_models(text, _models(args.model))
    name = args.name or f"imported-{target.name}"
    data, notes = target.import_run(text, source, device=args.device, name=name,
                                    variables=_variables(args.set))
    job = job_from_dict(data, f"{source} (imported)")  # the job must be valid as written
    for n in notes:
        note(f"placer: assumed: {n}")
    from placer.cost.efficiency import Calibration
    from placer.cost.pricer import Pricer
    from placer.solve.current import current_assignment, unfit_roles
    from placer.solve.planner import build_problem
    from placer.spec.catalog import resolve
    # the recorded placement is checked (and priced) now, as `placer compare` will
    assignment = current_assignment(build_problem(Pricer(resolve(job), Calibration())))
    assert assignment is not None, "an imported job records its placement"
    for role, why in unfit_roles(assignment).items():
        note(f"placer: note: current.roles.{role}: the cost model says it does not fit as "
             f"configured ({why}); `placer compare` prices it anyway")
    if args.output:
        head = (f"# imported from {target.name}: {source} (placer import)\n"
                + "".join(f"# assumed: {n}\n" for n in notes))
        atomic_write_text(args.output, head + yaml.safe_dump(data, sort_keys=False))
        note(f"wrote {args.output}; `placer compare {args.output}` ranks its placement "
             "(`current`) against the ILP's")
    if args.json:
        emit_json(data)
    return 0
