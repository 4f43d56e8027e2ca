"""A launch script's words as its shell would see them: variables expanded, quotes removed.

Framework launch scripts set their knobs as shell variables and pass them on
(`NNODES=${NNODES:-1}` ... `trainer.nnodes=${NNODES}`). `script_words` reads a script line by
line (continuations joined, comments dropped) as a POSIX shell does for what these scripts use:

  NAME=value / export NAME=value   assignments, in order; later lines see them
  $NAME  ${NAME}                   the variable (an assignment earlier in the script, else the
                                   environment: `env`, what `placer import --set` gives)
  ${NAME:-word} ${NAME-word}       the default when unset (or, with ':', empty); `:=` assigns it
  ${NAME:+word}                    word when set and not empty
  $((expression))                  integer arithmetic (+ - * / % and parentheses; bare names
                                   are variables)
  '...'  "..."  \\x                 quoting: no expansion inside single quotes
  NAME=( words ... )  NAME+=(...)  arrays (bash, over several lines: Miles' scripts gather
                                   their flags in them); "${NAME[@]}" gives one word per element

What a script computes by running commands (`$(...)`, backquotes) or takes from the caller
(`$1`, an environment variable it never sets) stays as its original text; `unresolved` names the
variable in such a value, so the importer can ask for it (`--set NAME=VALUE`) when it reads it.
"""
from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Iterator

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
ARRAY = re.compile(r"^\s*(?:export\s+|local\s+)?([A-Za-z_][A-Za-z0-9_]*)(\+?)=\((.*)$", re.S)
# An array's elements in one variable's value, split into words again when "${NAME[@]}" is
# expanded (a control character no script's word holds)
ELEMENTS = "\x1f"
OPS: dict[type, Callable[[int, int], int]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}


class Unresolved(Exception):
    """An expansion the shell would make from something this reader does not have."""


def unresolved(value: str) -> str | None:
    """The variable (or `$(...)`) a value left unexpanded names, or None when it has none."""
    if "$" not in value:
        return None
    found = re.search(r"\$\{?([A-Za-z_][A-Za-z0-9_]*|[0-9@*#?])", value)
    return found.group(1) if found else value[value.index("$"):][:20]


def _arith(expr: str, env: dict[str, str]) -> int:
    text = expand(expr, env, quoted=True)
    text = NAME.sub(lambda m: env.get(m.group(0), "0"), text).replace("/", "//")

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](ev(node.left), ev(node.right))
        raise Unresolved(expr)

    try:
        return ev(ast.parse(text.strip(), mode="eval"))
    except (SyntaxError, ZeroDivisionError, ValueError):
        raise Unresolved(expr) from None


def _closing(text: str, i: int, open_: str, close: str) -> int:
    """Index of the `close` matching the `open_` at text[i]."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == open_:
            depth += 1
        elif text[j] == close:
            depth -= 1
            if depth == 0:
                return j
    raise Unresolved(text[i:])


def _braced(body: str, env: dict[str, str], quoted: bool = False) -> str:
    whole = re.match(r"([A-Za-z_][A-Za-z0-9_]*)\[[@*]\]$", body)
    if whole:  # an array's elements (ELEMENTS-separated: `script_words` splits them)
        if whole.group(1) not in env:
            raise Unresolved(whole.group(1))
        if quoted:
            return env[whole.group(1)]
        # unquoted, bash splits each element at blanks too
        parts = [w for e in env[whole.group(1)].split(ELEMENTS) for w in e.split()]
        if not parts:
            return ELEMENTS  # no word (see `_assign_array`)
        return parts[0] if len(parts) == 1 else ELEMENTS.join(parts)
    m = re.match(r"([A-Za-z_][A-Za-z0-9_]*)(:?[-=+?])?(.*)$", body, re.S)
    if not m:
        raise Unresolved(body)
    name, op, word = m.group(1), m.group(2), m.group(3)
    value = env.get(name)
    if op is None:
        if word or value is None:
            raise Unresolved(name)
        return value
    empty_counts = op.startswith(":")
    unset = value is None or (empty_counts and value == "")
    if op[-1] in "-=":
        if not unset:
            return value or ""
        out = " ".join(words(word, env))  # the word's own quotes removed, as the shell does
        if op[-1] == "=":
            env[name] = out
        return out
    if op[-1] == "+":
        return "" if unset else " ".join(words(word, env))
    if unset:
        raise Unresolved(name)
    return value or ""


def expand(text: str, env: dict[str, str], quoted: bool = False) -> str:
    """`text` (unquoted, or inside double quotes) with its `$` expansions made; what cannot be
    expanded is kept as written."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            out.append(text[i + 1] if not quoted or text[i + 1] in '$`"\\' else text[i:i + 2])
            i += 2
            continue
        if c != "$" or i + 1 >= len(text):
            out.append(c)
            i += 1
            continue
        nxt = text[i + 1]
        try:
            if text.startswith("$((", i):
                end = _closing(text, i + 1, "(", ")")
                out.append(str(_arith(text[i + 3:end - 1], env)))
                i = end + 1
            elif nxt == "{":
                end = _closing(text, i + 1, "{", "}")
                out.append(_braced(text[i + 2:end], env, quoted))
                i = end + 1
            elif NAME.match(text, i + 1):
                m = NAME.match(text, i + 1)
                assert m is not None
                if m.group(0) not in env:
                    raise Unresolved(m.group(0))
                out.append(env[m.group(0)])
                i = m.end()
            else:  # $(...), $1, $@: what the script's caller or a command gives
                raise Unresolved(text[i:i + 2])
        except Unresolved:
            end = _reference_end(text, i)
            out.append(text[i:end])
            i = end
    return "".join(out)


def _reference_end(text: str, i: int) -> int:
    """The end of the `$` reference at text[i], to keep it as written."""
    try:
        if text.startswith("$(", i):
            return _closing(text, i + 1, "(", ")") + 1
        if text.startswith("${", i):
            return _closing(text, i + 1, "{", "}") + 1
    except Unresolved:
        return len(text)
    m = NAME.match(text, i + 1)
    return m.end() if m else min(i + 2, len(text))


def words(line: str, env: dict[str, str]) -> list[str]:
    """One command line's words, expanded and unquoted (no word splitting of expansions).
    ValueError on a quote that is not closed (as shlex says it)."""
    out: list[str] = []
    cur: list[str] | None = None
    i = 0
    while i < len(line):
        c = line[i]
        if c in " \t\n":
            if cur is not None:
                out.append("".join(cur))
                cur = None
            i += 1
            continue
        if c == "#" and cur is None:
            break
        cur = cur if cur is not None else []
        if c == "'":
            end = line.find("'", i + 1)
            if end < 0:
                raise ValueError("No closing quotation")
            cur.append(line[i + 1:end])
            i = end + 1
        elif c == '"':
            j = i + 1
            while j < len(line) and line[j] != '"':
                j += 2 if line[j] == "\\" else 1
            if j >= len(line):
                raise ValueError("No closing quotation")
            cur.append(expand(line[i + 1:j], env, quoted=True))
            i = j + 1
        else:
            j = i
            while j < len(line) and line[j] not in " \t\n'\"":
                if line[j] == "$" and line.startswith(("$(", "${"), j):
                    j = _reference_end(line, j)
                else:
                    j += 2 if line[j] == "\\" else 1
            cur.append(expand(line[i:j], env))
            i = j
    if cur is not None:
        out.append("".join(cur))
    return out


def logical_lines(text: str) -> list[str]:
    """The script's lines with backslash-newline continuations joined."""
    return re.sub(r"\\\r?\n", " ", text).splitlines()


def script_words(text: str, env: dict[str, str], marker: str | None) -> list[str] | None:
    """The expanded words of the script's first command line that contains `marker` (a module
    name: `verl.trainer.main_ppo`), after running every assignment before it; None without one.
    `marker` None: the words of every line that is not an assignment, in order (a command line
    given inline, over several lines). `env` (the environment) gets the script's assignments."""
    found: list[str] = []
    lines = iter(logical_lines(text))
    for line in lines:
        array = ARRAY.match(line)
        if array:
            _assign_array(array, lines, env)
            continue
        line = _complete(line, lines, env)
        if marker is not None and marker in _uncommented(line):  # not one a comment names
            return _split_elements(words(line, env))
        ws = _split_elements(words(line, env))
        names = ws[1:] if ws and ws[0] in ("export", "local", "readonly", "declare") else ws
        assigns = [ASSIGNMENT.match(w) for w in names]
        if names and all(assigns):
            for m in assigns:
                assert m is not None
                env[m.group(1)] = m.group(2)
        else:
            found += ws
    return None if marker is not None else found


def _uncommented(line: str) -> str:
    """`line` without its comment: from a `#` that starts a word outside quotes."""
    quote = ""
    for i, c in enumerate(line):
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i]
    return line


def _complete(line: str, lines: Iterator[str], env: dict[str, str]) -> str:
    """`line` and, when a quoted string in it goes on over the next lines (a JSON value in
    quotes), those lines up to the one that closes it, as the shell reads them. The line as it
    is when the script ends first (`words` then says which quote is open)."""
    while True:
        try:
            words(line, dict(env))  # a copy: `${X:=y}` assigns when the line runs, not here
            return line
        except ValueError:
            nxt = next(lines, None)
            if nxt is None:
                return line
            line += "\n" + nxt


def _split_elements(ws: list[str]) -> list[str]:
    """Words with expanded arrays split into their elements (an empty array gives none)."""
    return [e for w in ws for e in (w.split(ELEMENTS) if ELEMENTS in w else [w]) if e or
            ELEMENTS not in w]


def _assign_array(m: re.Match[str], lines: Iterator[str], env: dict[str, str]) -> None:
    """`NAME=(` ... `)`: the elements up to the closing parenthesis, one line at a time (each
    line's comment dropped), stored ELEMENTS-separated; `+=(` appends."""
    name, append, rest = m.group(1), m.group(2), m.group(3)
    elements: list[str] = []
    line = rest
    while True:
        body = _uncommented(line)
        closing = body.rstrip().endswith(")")
        if closing:
            body = body.rstrip()[:-1]
        elements += _split_elements(words(body, env))
        if closing:
            break
        nxt = next(lines, None)
        if nxt is None:
            break
        line = nxt
    old = env.get(name, "") if append else ""
    # an empty array is a lone separator, so that its expansion gives no word
    env[name] = ELEMENTS.join(([old] if old else []) + elements) or ELEMENTS
