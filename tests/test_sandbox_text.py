"""What leaves the sandbox is text the driver can always encode.

An answer controls the text of its own result (a batch answer can write any bytes on its result
pipe; a solution chooses its exceptions' messages and its output). A lone surrogate in a tool
result made `HFCodec.encode` raise TypeError (a real tokenizer takes valid Unicode only), which
would end a multi-turn run in the driver. At the sandbox's boundary lone surrogates become U+FFFD,
invalid UTF-8 is replaced and control characters are escaped; checked here through the tool-call
text with the character codec and with a Hugging Face tokenizer (`HFCodec`).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from executors.codetask import CodeJudge, parse_tests
from executors.model import CharCodec, Codec, HFCodec, build_tokenizer
from executors.roles import EnvWorker, RunConfig
from executors.rollouts import tool_text
from executors.sandbox import Limits, Sandbox, clean_text
from placer.spec.localdata import CodeReward

LIMITS = Limits(wall_s=3.0, cpu_s=1, memory_bytes=256 * 2**20, per_item_s=1.0)
GET_OS = ("[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close'][0]"
          ".__init__.__globals__")
NASTY = "\ud800 \x1b[2J\x00 \udfff\x7f\x85 fine\ttext\n"


def _answer(code: str) -> str:
    return f"(lambda b: b['exec']({code!r}, {{'__builtins__': b}}))({GET_OS}['__builtins__'])"


@pytest.fixture(scope="module")
def codecs(tmp_path_factory: pytest.TempPathFactory) -> list[Codec]:
    d = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer(64).save_pretrained(d)
    return [CharCodec(64), HFCodec(Path(d))]


def test_clean_text() -> None:
    assert clean_text(NASTY) == "\ufffd \\x1b[2J\\x00 \ufffd\\x7f\\x85 fine\ttext\n"
    assert clean_text("plain, ünïcode and emoji \U0001f600\r\n") == \
        "plain, ünïcode and emoji \U0001f600\r\n"


def test_a_forged_tool_result_is_text_the_codecs_encode(codecs: list[Codec]) -> None:
    """A batch answer writes its own result: a value with lone surrogates and control
    characters, then invalid UTF-8. The tool-call texts encode with both codecs."""
    forged = json.dumps({"status": "ok", "value": NASTY}).encode()
    write_all = ("import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, {data!r})\n"
                 "    except OSError:\n        pass\nos._exit(0)")
    cfg = RunConfig(algorithm="grpo", arch={}, model_dir="", seed=0, max_new_tokens=4)
    w = EnvWorker(cfg, 0, LIMITS)
    answers = [_answer(write_all.format(data=forged)),
               _answer(write_all.format(data=b'{"status": "ok", "value": "\xff\xfe"}')), "1+2"]
    values, _ = w.execute(["a", "b", "c"], answers)
    texts = [tool_text(v) for v in values]
    assert texts[0] == "=" + clean_text(NASTY), texts
    assert values[1] == {**values[1], "status": "error", "error": "malformed result"}, values[1]
    assert texts[2] == "=3"
    for codec in codecs:
        for text in texts:
            codec.encode(text)  # raises on text a tokenizer cannot take


def test_program_output_and_verdicts_are_text_the_codecs_encode(codecs: list[Codec]) -> None:
    r = Sandbox(LIMITS).run("import os, sys\nos.write(1, b'\\xff\\xfe\\x1b ok')\n"
                            f"print({NASTY!r}, file=sys.stderr)")
    assert r.ok and r.stdout == "\ufffd\ufffd\\x1b ok", r
    tests = parse_tests({"inputs": ["1\n"], "outputs": ["1\n"]})
    v = CodeJudge(CodeReward(wall_s=3.0, cpu_s=1, memory_mb=256)).judge(
        f"raise RuntimeError({NASTY!r})", tests)
    assert v.reward == 0.0 and v.reason.startswith("test 0: RuntimeError: \ufffd \\x1b[2J"), v
    for codec in codecs:
        for text in (r.stdout, r.stderr, v.reason):
            codec.encode(text)
