"""`placer export verl|openrlhf|nemo-rl|miles|kuberay PLAN.json`: a plan as a framework's configuration.

    placer export verl PLAN.json -o DIR        overrides.yaml + launch.sh (verl.trainer.main_ppo)
    placer export openrlhf PLAN.json [-o FILE] the openrlhf.cli.train_ppo_ray command line (stdout,
                                               or a launch script at FILE)
    placer export nemo-rl PLAN.json [-o FILE]  a NeMo-RL recipe YAML over a shipped base recipe
                                               (stdout, or FILE; then its run command)
    placer export miles PLAN.json [-o FILE]    the Miles train.py command line (stdout, or a script)
    placer export kuberay PLAN.json -o DIR     raycluster.yaml, rayjob.yaml, plan-configmap.yaml
                       [--image IMAGE] [--steps N]

Every role or layout the framework cannot express is named on stderr as `placer: warning: ...`
(and in `--json` output); nothing is dropped silently. Every export names the framework release
it was written for (in its files, on stderr, and as `version`). `--json` prints {"framework",
"version", "command", "files": {name: text}, "warnings"} and writes the files too when `-o` is
given.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from placer.base.errors import SpecError
from placer.base.fileio import atomic_write_text
from placer.base.inputs import check_output
from placer.cli import emit_json, note
from placer.interop.targets import TARGETS, Target, names_help, target_of

STEPS_DEFAULT = 5


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("framework", help=names_help(list(TARGETS)))
    p.add_argument("plan", metavar="PLAN.json")
    p.add_argument("-o", "--output", metavar="DIR|FILE",
                   help="a folder for the targets that write several files "
                        f"({names_help([t.name for t in TARGETS.values() if t.writes_folder])}); "
                        "a launch script for the others (default: stdout)")
    p.add_argument("--image", help="kuberay: container image with Ray and placer installed")
    p.add_argument("--steps", type=int, default=STEPS_DEFAULT,
                   help="kuberay: RL steps the RayJob runs")
    p.add_argument("--json", action="store_true", help="print one JSON document")


def run(args: argparse.Namespace) -> int:
    from placer.interop.kuberay import check_image
    from placer.solve.planfile import load_plan

    target = target_of(args.framework)
    fw = target.name
    if target.writes_folder and not args.output and not args.json:
        raise SpecError(f"--output: {fw} writes several files: give a folder with -o DIR")
    target.check_options([opt for opt, given in (("image", bool(args.image)),
                                                 ("steps", args.steps != STEPS_DEFAULT))
                          if given], "--")
    if args.steps < 1:
        raise SpecError(f"--steps: must be at least 1 (got {args.steps})")
    check_image(args.image)
    check_output(args.output, "--output", folder=target.writes_folder)
    plan = load_plan(args.plan)
    export = target.export(plan, **{opt: getattr(args, opt) for opt in target.options})
    note(f"placer: written for {target.title} {export.version}" if target.title not in
         export.version else f"placer: written for {export.version}")
    for w in export.warnings:
        note(f"placer: warning: {w}")
    if args.output:
        _write(target, export.files, Path(args.output))
    if args.json:
        emit_json({"framework": fw, "version": export.version, "command": export.command,
                   "files": export.files, "warnings": export.warnings})
    elif not args.output and not target.writes_folder and \
            not next(iter(export.files)).endswith(".sh"):
        print(next(iter(export.files.values())), end="")  # a recipe: the file is the output
    else:
        print(export.command)
    return 0


def _write(target: Target, files: dict[str, str], out: Path) -> None:
    if not target.writes_folder:  # one file: a launch script (executable) or a recipe
        name, text = next(iter(files.items()))
        atomic_write_text(out, text)
        if name.endswith(".sh"):
            out.chmod(0o755)
        note(f"wrote {out}")
        return
    for name, text in files.items():
        atomic_write_text(out / name, text)
        if name.endswith(".sh"):
            (out / name).chmod(0o755)
    note(f"wrote {', '.join(files)} in {out}/")
