"""A launch script's shell variables expanded as its shell would (`placer.interop.shellvars`),
checked against what POSIX sh prints for the same lines."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from placer.interop.shellvars import script_words, unresolved, words

SCRIPT = """set -x
NNODES=${NNODES:-2}
name='run-$NNODES'   # single quotes: no expansion
max_prompt=$((1024 * 2))
total=$(((max_prompt + 1024) * 2))
EP=${EP:-$NNODES}
HOMEDIR=${DATA:-"${ROOT}/verl"}
export TP=4
python3 -m verl.trainer.main_ppo a=$NNODES b="$name" c=${total} d=${EP} \\
    e=$TP f=${UNSET:+x} g=${UNSET-dflt} h=$HOMEDIR i="$(date)" # trailing comment
"""
WANT = ["python3", "-m", "verl.trainer.main_ppo", "a=2", "b=run-$NNODES", "c=6144", "d=2",
        "e=4", "f=", "g=dflt"]


def test_a_script_expands_as_sh_would() -> None:
    argv = script_words(SCRIPT, {"ROOT": "/r"}, "verl.trainer.main_ppo")
    assert argv is not None
    assert argv[:len(WANT)] == WANT
    assert argv[len(WANT)] == "h=/r/verl"
    assert argv[-1] == "i=$(date)" and unresolved(argv[-1]) == "$(date)"[:20]


@pytest.mark.skipif(shutil.which("sh") is None, reason="no POSIX sh")
def test_the_same_words_as_posix_sh_prints() -> None:
    """The reference: sh itself expanding the script (its command replaced by printf)."""
    text = SCRIPT.replace("python3 -m", "printf '%s\\n' python3 -m").replace(
        ' i="$(date)"', "").replace("set -x\n", "")
    out = subprocess.run(["sh", "-c", text], capture_output=True, text=True,
                         env={"ROOT": "/r", "PATH": "/usr/bin:/bin"}, check=True)
    mine = script_words(SCRIPT.replace(' i="$(date)"', ""), {"ROOT": "/r"},
                        "verl.trainer.main_ppo")
    assert mine == out.stdout.split("\n")[:-1]


def test_the_environment_and_what_stays_unexpanded() -> None:
    env = {"NNODES": "8"}
    assert words("x=${NNODES:-1} y=$NNODES z=${MISSING} w=$MISSING v=$1", env) == [
        "x=8", "y=8", "z=${MISSING}", "w=$MISSING", "v=$1"]
    assert unresolved("${MISSING}/a") == "MISSING" and unresolved("plain") is None
    assert words("a=${E:=5} b=$E", env) == ["a=5", "b=5"] and env["E"] == "5"
    assert words("n=$((7 / 2)) m=$((-(3 % 2)))", {}) == ["n=3", "m=-1"]


def test_an_open_quote_is_an_error() -> None:
    with pytest.raises(ValueError, match="No closing quotation"):
        words('a="open', {})


ARRAYS = """ARGS=(
   --tp 2      # comment (with parentheses)
   # --commented-out 1
   --name "a b"
)
ARGS+=(--more)
EMPTY=(
)
JSON='{
  "env": 1
}'
# a comment naming train.py is not the command
ray job submit --runtime-env-json="${JSON}" \\
   -- python3 train.py --x 1 ${ARGS[@]} ${EMPTY[@]} "${MODEL[@]}" --y
"""


def test_bash_arrays_and_quoted_strings_over_several_lines() -> None:
    """Miles' scripts: flags gathered in arrays (`+=` appends, comments inside), a JSON value
    quoted over several lines, and the command found on its line, not in a comment."""
    argv = script_words(ARRAYS, {}, "train.py")
    assert argv is not None
    # unquoted, bash splits the elements at blanks again ("a b" is two words)
    assert argv[argv.index("train.py"):] == ["train.py", "--x", "1", "--tp", "2", "--name", "a",
                                             "b", "--more", "${MODEL[@]}", "--y"]
    assert argv[3] == '--runtime-env-json={\n  "env": 1\n}'


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_the_same_array_words_as_bash_prints() -> None:
    """The reference: bash itself (words NUL-separated, as one holds newlines)."""
    text = ARRAYS.replace("ray job submit", "printf '%s\\0' ray job submit").replace(
        ' "${MODEL[@]}"', "")
    out = subprocess.run(["bash", "-c", text], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin"}, check=True)
    mine = script_words(ARRAYS.replace(' "${MODEL[@]}"', ""), {}, "train.py")
    assert mine == out.stdout.split("\0")[:-1]
