"""Text <-> token ids: the executor's character vocabulary and a checkpoint's own tokenizer.

Nothing is downloaded. The character vocabulary is a fixed alphabet (specials, digits,
arithmetic operators, letters, punctuation); `build_tokenizer` wraps it as a `tokenizers`
WordLevel model in a `PreTrainedTokenizerFast` for saving next to the weights. A job's own
checkpoint folder brings its own tokenizer: `codec_for` gives every part of the executor one
`Codec` (prompt ids with BOS when the tokenizer has one, the EOS id that stops generation,
answer text for the sandbox and the rewards): the character codec for folders saved with
`build_tokenizer` (no tokenizer object on the hot path), else the folder's tokenizer loaded with
`AutoTokenizer` from local files only (`HFCodec`).

Apart from the model (`executors.model`) and free of torch, so that the workers that only read
answers (the rule reward, the environment) start without it.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Protocol

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
PAD, BOS, EOS, UNK = range(4)
DIGITS = list("0123456789")
OPERATORS = list("+-*/%()=. ")
LETTERS = list("abcdefghijklmnopqrstuvwxyz")
PUNCT = list(",:;<>!?[]_'\"#@&|^~{}$\\`")


def alphabet(size: int) -> list[str]:
    """The first `size` symbols: specials, digits, operators, letters, punctuation."""
    syms = SPECIALS + DIGITS + OPERATORS + LETTERS + PUNCT
    if size > len(syms):
        syms = syms + [f"<r{i}>" for i in range(size - len(syms))]
    if size < len(SPECIALS) + len(DIGITS) + len(OPERATORS):
        raise ValueError(f"vocab {size} is too small for digits and operators")
    return syms[:size]


def build_tokenizer(vocab_size: int):
    """A character-level fast tokenizer whose ids match the model's vocabulary exactly."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # lazy: with transformers
    from transformers import PreTrainedTokenizerFast  # lazy: transformers (~2 s) only where used

    vocab = {s: i for i, s in enumerate(alphabet(vocab_size))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>", unk_token="<unk>")


def encode(text: str, vocab_size: int) -> list[int]:
    """Characters to ids without the tokenizer object (hot path in rollouts)."""
    table = {s: i for i, s in enumerate(alphabet(vocab_size)) if len(s) == 1}
    return [table.get(c, UNK) for c in text]


def decode(ids: list[int], vocab_size: int) -> str:
    """Ids to text, stopping at EOS and skipping other specials."""
    syms = alphabet(vocab_size)
    out = []
    for i in ids:
        if i == EOS:
            break
        if i >= len(SPECIALS) and i < len(syms):
            out.append(syms[i])
    return "".join(out)


def tokenizer_mismatch(path: str | Path, vocab_size: int) -> str | None:
    """Why the checkpoint folder's tokenizer is not this module's character vocabulary of
    `vocab_size` symbols (None: it is). Such a folder runs with the fast `CharCodec`; any other
    with its own tokenizer (`HFCodec`, see `codec_for`)."""
    import json  # lazy: only for a job's own checkpoint folder
    f = Path(path) / "tokenizer.json"
    try:
        model = json.loads(f.read_text())["model"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"no readable tokenizer.json in {str(path)!r}"
    try:
        want = {s: i for i, s in enumerate(alphabet(vocab_size))}
    except ValueError as e:  # too few ids for the character vocabulary: not it
        return str(e)
    if model.get("type") != "WordLevel" or model.get("vocab") != want:
        return (f"its tokenizer ({model.get('type')}, {len(model.get('vocab') or {})} entries) "
                f"is not the executor's {vocab_size}-symbol character vocabulary")
    return None


class Codec(Protocol):
    """Text <-> token ids as the policy's tokenizer does it, and the ids the loop needs."""

    bos: int | None  # prepended to every prompt (None: the tokenizer has no BOS, e.g. Qwen)
    eos: int  # stops a sample's generation (and a turn of a multi-turn one)
    size: int  # ids the tokenizer can produce (<= the model's embedding rows)

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class CharCodec:
    """The built-in character vocabulary (`alphabet`): table look-ups, no tokenizer object."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab, self.eos, self.size = vocab_size, EOS, vocab_size
        self.bos: int | None = BOS

    def encode(self, text: str) -> list[int]:
        return encode(text, self.vocab)

    def decode(self, ids: list[int]) -> str:
        return decode(ids, self.vocab)


class HFCodec:
    """A checkpoint folder's own tokenizer (`AutoTokenizer`, local files only)."""

    def __init__(self, path: str | Path) -> None:
        from transformers import AutoTokenizer  # lazy: transformers (~2 s) only where used
        self.tok: Any = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        eos = self.tok.eos_token_id
        if eos is None:  # generation could never stop before its cap, and rewards need an end
            raise ValueError("its tokenizer defines no eos_token")
        bos = self.tok.bos_token_id
        self.eos, self.size = int(eos), len(self.tok)
        self.bos: int | None = None if bos is None else int(bos)

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        """The text up to EOS (as `decode` does for the character vocabulary), specials skipped."""
        ids = ids[:ids.index(self.eos)] if self.eos in ids else ids
        return str(self.tok.decode(ids, skip_special_tokens=True))


def prompt_ids(codec: Codec, text: str) -> list[int]:
    """A prompt's context: BOS (when the tokenizer has one) and the text's ids; never empty
    (generation needs a position to start from: an empty prompt without BOS starts at EOS)."""
    ids = ([codec.bos] if codec.bos is not None else []) + codec.encode(text)
    return ids or [codec.eos]


def load_codec(model_dir: str, vocab_size: int) -> Codec:
    """The codec of the policy saved in `model_dir`: the character one when its tokenizer is."""
    if tokenizer_mismatch(model_dir, vocab_size) is None:
        return CharCodec(vocab_size)
    return HFCodec(model_dir)


# Once per process and folder: a run's version-0 folder does not change while it runs.
codec_for = functools.lru_cache(maxsize=8)(load_codec)


def tokenizer_problem(path: str | Path, vocab_size: int) -> str | None:
    """Why the checkpoint folder's tokenizer cannot drive a model whose embedding has
    `vocab_size` rows (None: it can). Real checkpoints pad the embedding beyond the tokenizer
    (Qwen: 151936 rows, 151665 tokens), so fewer tokens than rows is fine; more is not (an id
    past the embedding)."""
    try:
        codec = load_codec(str(path), vocab_size)  # not cached: the folder may have changed
    except (OSError, ValueError, TypeError, KeyError) as e:  # what from_pretrained raises
        return f"its tokenizer does not load ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
    ids = [codec.eos] + ([codec.bos] if codec.bos is not None else [])
    if codec.size > vocab_size or max(ids) >= vocab_size:
        return (f"its tokenizer has {codec.size} tokens (eos id {codec.eos}) but the model's "
                f"embedding has {vocab_size} rows (config.json vocab_size)")
    return None
