"""The `placer` command line.

Commands live in a registry (`COMMANDS`: name -> "module:function" pairs) and are imported only when
run, so `placer validate` never pays for Ray or torch. Each command module provides
`add_arguments(parser)` and `run(args) -> int`.

Conventions every command follows:
  * `--json` prints exactly one JSON document on stdout and nothing else there (progress and
    notes go to stderr);
  * bad input exits 2 with one line `placer: error: <field>: <what> (got <value>)` on stderr,
    never a traceback; an infeasible job exits 3 with its diagnosis.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Any, Callable

from placer.errors import EXIT_BAD_INPUT, EXIT_INFEASIBLE, Infeasible, SpecError

COMMANDS: dict[str, tuple[str, str]] = {
    "validate": ("placer.commands.validate", "check a job file and show its roles and memory floors"),
    "plan": ("placer.commands.plan", "place every role with the ILP and write a plan"),
    "compare": ("placer.commands.compare", "the ILP against the baselines on one job"),
    "replan": ("placer.commands.replan", "re-plan after pools lose or gain nodes"),
    "simulate": ("placer.commands.simulate", "simulate a plan's iterations (simpy)"),
    "goodput": ("placer.commands.goodput", "goodput and time to finish under failures, "
                "checkpoints and restarts"),
    "execute": ("placer.commands.execute", "run a plan on Ray"),
    "calibrate": ("placer.commands.calibrate", "fit the cost model's efficiency factors to a trace"),
    "fidelity": ("placer.commands.fidelity", "simulated against measured for a plan and its trace"),
}


def _available(only: str | None = None) -> dict[str, Any]:
    """Importable command modules; `only` imports just that one (a command being run never
    depends on the imports of the others)."""
    out = {}
    for name, (mod, help_) in COMMANDS.items():
        if only is not None and name != only:
            continue
        try:
            out[name] = (importlib.import_module(mod), help_)
        except ModuleNotFoundError as e:
            if e.name != mod:  # the command exists but one of its imports is missing
                raise
    return out


def build_parser(commands: dict[str, Any]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="placer", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_) in commands.items():
        p = sub.add_parser(name, help=help_, description=help_)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def emit_json(doc: Any) -> None:
    """The one JSON document of a `--json` run."""
    sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")


def note(msg: str) -> None:
    """Progress and remarks: stderr, so that `--json` stdout stays one document."""
    print(msg, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    chosen = argv[0] if argv and argv[0] in COMMANDS else None
    parser = build_parser(_available(chosen))
    args = parser.parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args._run
    try:
        return run(args)
    except SpecError as e:
        print(f"placer: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Infeasible as e:
        print(f"placer: infeasible: {e}", file=sys.stderr)
        return EXIT_INFEASIBLE
    except KeyboardInterrupt:
        print("placer: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `placer ... | head`: the reader left; no traceback at exit either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
