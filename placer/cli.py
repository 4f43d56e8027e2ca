"""The `placer` command line.

Commands live in a registry (`COMMANDS`: name -> "module:function" pairs) and are imported only when
run, so `placer validate` never pays for Ray or torch. Each command module provides
`add_arguments(parser)` and `run(args) -> int`.

Conventions every command follows:
  * `--json` prints exactly one JSON document on stdout and nothing else there (progress and
    notes go to stderr);
  * bad input exits 2 with one line `placer: error: <field>: <what> (got <value>)` on stderr per
    mistake (a job's are all reported at once), never a traceback; an infeasible job exits 3
    with its diagnosis (only when infeasibility is proven); a search that runs out of time
    before any solution exits 4 saying which limit to raise.
"""
from __future__ import annotations

import argparse
import errno
import importlib
import json
import math
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from placer import __version__
from placer.base.errors import (
    EXIT_BAD_INPUT,
    EXIT_INFEASIBLE,
    EXIT_TIMED_OUT,
    Infeasible,
    SpecError,
    TimedOut,
)
from placer.base.inputs import error_lines, escape

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
    "sweep": ("placer.commands.sweep", "the what-if grid on a job: re-plan at every combination "
              "of --vary values"),
    "export": ("placer.commands.export", "a plan as a verl, OpenRLHF, NeMo-RL, Miles or KubeRay "
               "configuration"),
    "import": ("placer.commands.importrun", "a job spec (with its current placement) from a verl, "
               "OpenRLHF, NeMo-RL or Miles run"),
    "fleet": ("placer.commands.fleet", "many jobs on one cluster: whole nodes to each job under "
              "team quotas"),
    "schema": ("placer.commands.schema", "the job format: JSON Schema, or the Markdown reference"),
}


def _available(only: str | None = None) -> dict[str, Any]:
    """The command modules; `only` imports just that one (a command being run never depends on
    the imports of the others)."""
    return {name: (importlib.import_module(mod), help_) for name, (mod, help_) in COMMANDS.items()
            if only is None or name == only}


class _Parser(argparse.ArgumentParser):
    """argparse with the project's error line: `placer: error: --flag: what (got value)`, one line
    and exit 2 (argparse's own prints the usage first, which breaks the one-line contract)."""

    def error(self, message: str) -> NoReturn:
        if message.startswith("argument "):  # "argument --seed: invalid int value: 'x'"
            flag, _, what = message[len("argument "):].partition(": ")
            flag = flag.split("/")[-1]  # "-o/--output" -> "--output"
            message = f"{flag}: {what}"
        self.exit(EXIT_BAD_INPUT, f"placer: error: {escape(message)}\n")


def build_parser(commands: dict[str, Any]) -> argparse.ArgumentParser:
    parser = _Parser(prog="placer", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"placer {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=_Parser)
    for name, (module, help_) in commands.items():
        p = sub.add_parser(name, help=help_, description=help_)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def emit_json(doc: Any) -> None:
    """The one JSON document of a `--json` run: strict JSON, so an unbounded or undefined number
    (a job that never fails has an infinite MTBF) is `null`, never `Infinity` or `NaN`.
    A stdout that is closed (`>&-`) or cannot take it (a full disk, `>/dev/full`) is one line,
    exit 2; a reader that left (`| head`) is `main`'s BrokenPipeError, exit 141."""
    text = json.dumps(_strict(doc), indent=2, default=str, allow_nan=False) + "\n"
    if sys.stdout is None:
        raise SpecError("stdout: closed; --json writes its document there (got no stdout)")
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as e:
        raise SpecError(f"stdout: cannot write the JSON document: {e.strerror or e} "
                        f"(got {getattr(sys.stdout, 'name', 'stdout')!r})") from None


def _strict(doc: Any) -> Any:
    if isinstance(doc, float) and not math.isfinite(doc):
        return None
    if isinstance(doc, dict):
        return {k: _strict(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [_strict(v) for v in doc]
    return doc


def note(msg: str) -> None:
    """Progress and remarks: stderr, so that `--json` stdout stays one document."""
    print(msg, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    chosen = argv[0] if argv and argv[0] in COMMANDS else None
    parser = build_parser(_available(chosen))
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # a bad flag (exit 2, one line) or --help (exit 0)
        return e.code if isinstance(e.code, int) else EXIT_BAD_INPUT
    run: Callable[[argparse.Namespace], int] = args._run
    try:
        code = run(args)
        if sys.stdout is not None:
            sys.stdout.flush()  # here, not at exit, so a full or closed stdout is reported below
        return code
    except SpecError as e:  # names and paths from the input may hold newlines or escape codes
        for line in error_lines(e):  # one line per mistake (a job reports all of them at once)
            print(f"placer: error: {line}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Infeasible as e:
        diagnosis = "\n".join(escape(line) for line in str(e).split("\n"))  # may span lines
        print(f"placer: infeasible: {diagnosis}", file=sys.stderr)
        return EXIT_INFEASIBLE
    except TimedOut as e:
        print(f"placer: timed out: {escape(str(e))}", file=sys.stderr)
        return EXIT_TIMED_OUT
    except KeyboardInterrupt:
        print("placer: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `placer ... | head`: the reader left; no traceback at exit either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as e:
        if e.errno not in UNWRITABLE:
            raise
        # a full disk or a closed stream under the output (`> /dev/full`, a full quota): one
        # line naming where, not a traceback; what was written before is left as it is
        where = e.filename or getattr(sys.stdout, "name", "stdout")
        print(f"placer: error: cannot write {escape(str(where))}: {e.strerror} (got errno "
              f"{errno.errorcode.get(e.errno or 0, e.errno)})", file=sys.stderr)
        _drop_stdout()
        return EXIT_BAD_INPUT


# the output's medium refused it: nothing the command could do differently
UNWRITABLE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EBADF, errno.EROFS})


def _drop_stdout() -> None:
    """Points stdout at /dev/null so the interpreter's flush at exit does not fail again."""
    if sys.stdout is not None:
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            sys.stdout = None


if __name__ == "__main__":
    sys.exit(main())
