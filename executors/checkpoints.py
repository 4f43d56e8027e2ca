"""Tiny local Hugging Face checkpoints of real architectures, built from their config classes.

Nothing is downloaded: each architecture's transformers config class gives a few-layer,
64-wide model with a seeded random init, saved with `save_pretrained` together with the
project's character-level tokenizer (`executors.model.build_tokenizer`, a local vocabulary of
64 symbols) or a tokenizer of its own (`word_tokenizer`: word-level, other special ids), so that
a job's `models.policy: {path: DIR}` loads it with the Auto classes like any
checkpoint. The shapes keep heads, KV heads and MLP widths even, so tp 2 divides them.

    python -m executors.checkpoints qwen3_moe examples/tiny-moe/model
    python -m executors.checkpoints math-data examples/tiny-moe/math.jsonl

`write_math_data` makes the small generated dataset that ships with the example: single-digit
sums, differences and products as JSONL rows `{"prompt": "3+4=", "answer": "7"}`.
"""
from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from executors.model import BOS, EOS, PAD, build_tokenizer

VOCAB = 64
COMMON: dict[str, Any] = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                              head_dim=16, max_position_embeddings=256, bos_token_id=BOS,
                              eos_token_id=EOS, pad_token_id=PAD, tie_word_embeddings=False)


def _llama() -> Any:
    from transformers import LlamaConfig  # lazy: transformers (~2 s)
    return LlamaConfig(**COMMON)


def _qwen2() -> Any:
    from transformers import Qwen2Config  # lazy
    return Qwen2Config(**COMMON)


def _qwen3() -> Any:
    from transformers import Qwen3Config  # lazy
    return Qwen3Config(**COMMON)


def _qwen3_moe() -> Any:
    from transformers import Qwen3MoeConfig  # lazy
    return Qwen3MoeConfig(**COMMON, num_experts=4, num_experts_per_tok=2,
                          moe_intermediate_size=64, decoder_sparse_step=1, norm_topk_prob=True)


def _mixtral() -> Any:
    from transformers import MixtralConfig  # lazy
    return MixtralConfig(**{k: v for k, v in COMMON.items() if k != "head_dim"},
                         num_local_experts=4, num_experts_per_tok=2)


CONFIGS: dict[str, Callable[[], Any]] = {"llama": _llama, "qwen2": _qwen2, "qwen3": _qwen3,
                                         "qwen3_moe": _qwen3_moe, "mixtral": _mixtral}


WORDS = ["<pad>", "<|endoftext|>", "<unk>", *"0123456789", "+", "-", "*", "/", "(", ")", "=",
         ".", "^", "the", "answer", "is", "boxed", "{", "}", "\\", " "]


def word_tokenizer(extra: int = 0) -> Any:
    """A tokenizer of its own, unlike the character one: word-level over `WORDS` (+ `extra`
    filler tokens), digits and spaces one a token, no BOS, EOS `<|endoftext|>` at id 1 (as Qwen's
    tokenizers have no BOS). Built from the local vocabulary with `tokenizers`; nothing is
    downloaded."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers  # lazy: with transformers
    from transformers import PreTrainedTokenizerFast  # lazy: transformers (~2 s)
    vocab = {w: i for i, w in enumerate(WORDS + [f"w{k}" for k in range(extra)])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # a digit, a word, a space, a symbol: each a token of its own; Fuse joins them back as written
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"\d|[^\W\d]+|\s|[^\w\s]"), "isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                   pad_token="<pad>", unk_token="<unk>")


def build_checkpoint(kind: str, path: str | Path, seed: int = 0, tokenizer: Any = None,
                     vocab: int = VOCAB, **config: Any) -> Path:
    """A random-init `kind` model with an embedding of `vocab` rows and `tokenizer` (default
    the character one over `vocab` symbols), saved to `path` (created); `config` overrides
    fields of the kind's tiny config (e.g. `num_key_value_heads`)."""
    from transformers import AutoModelForCausalLM  # lazy
    from transformers.utils import logging as hf_logging  # lazy
    if kind not in CONFIGS:
        raise ValueError(f"unknown architecture {kind!r}; known: {', '.join(CONFIGS)}")
    hf_logging.disable_progress_bar()
    torch.manual_seed(seed)
    cfg = CONFIGS[kind]()
    cfg.vocab_size = vocab
    for key, value in config.items():
        if not hasattr(cfg, key):
            raise ValueError(f"{kind}: no config field {key!r} to override")
        setattr(cfg, key, value)
    if tokenizer is not None:  # the model's special ids are the tokenizer's
        cfg.bos_token_id, cfg.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
        cfg.pad_token_id = tokenizer.pad_token_id
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(p, safe_serialization=True)
    (build_tokenizer(vocab) if tokenizer is None else tokenizer).save_pretrained(p)
    return p


def write_math_data(path: str | Path, n: int = 256, seed: int = 0) -> Path:
    """`n` arithmetic prompts with their answers (JSONL), drawn from `seed`."""
    g = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b, op = g.randrange(10), g.randrange(10), g.choice("+-*")
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        rows.append({"prompt": f"{a}{op}{b}=", "answer": str(value)})
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


if __name__ == "__main__":
    kinds = [*CONFIGS, "math-data"]
    if len(sys.argv) != 3 or sys.argv[1] not in kinds:
        sys.exit(f"usage: python -m executors.checkpoints {{{'|'.join(kinds)}}} PATH")
    made = (write_math_data(sys.argv[2]) if sys.argv[1] == "math-data"
            else build_checkpoint(sys.argv[1], sys.argv[2]))
    print(made)
