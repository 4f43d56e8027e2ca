"""The policy: a Hugging Face `LlamaForCausalLM` built from a catalog shape, with a local tokenizer.

Nothing is downloaded. The architecture comes from `placer/catalog/models.yaml` (tiny-llama: 2
layers, hidden 64, 4 heads, 2 KV heads, MLP 128, vocab 64), the weights are a seeded random init,
and the tokenizer is a character-level `tokenizers` WordLevel model over a fixed 64-symbol
alphabet (specials, digits, arithmetic operators, letters), wrapped as a
`PreTrainedTokenizerFast`. `save_model_dir` writes config, safetensors weights and tokenizer with
`save_pretrained`, so the same directory loads in `transformers` and in vLLM.

Value models (PPO critic, a model reward) are the same backbone with a scalar head.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from placer.spec import ModelArch

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


def llama_config(arch: ModelArch, max_positions: int = 128):
    from transformers import LlamaConfig  # lazy: transformers (~2 s) only where used
    return LlamaConfig(vocab_size=arch.vocab, hidden_size=arch.hidden,
                       intermediate_size=arch.mlp, num_hidden_layers=arch.layers,
                       num_attention_heads=arch.heads, num_key_value_heads=arch.kv_heads,
                       head_dim=arch.head_size,
                       max_position_embeddings=max_positions, tie_word_embeddings=arch.tie_embeddings,
                       attention_bias=arch.qkv_bias, bos_token_id=BOS, eos_token_id=EOS,
                       # torch_dtype reaches PretrainedConfig through **kwargs, which the stubs omit
                       pad_token_id=PAD, torch_dtype="float32")  # type: ignore[call-arg]


def build_policy(arch: ModelArch, seed: int) -> nn.Module:
    """A randomly initialised causal LM; the same seed gives the same weights."""
    from transformers import LlamaForCausalLM  # lazy: transformers (~2 s) only where used
    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config(arch))
    model.eval()
    return model


class ValueModel(nn.Module):
    """Llama backbone with a scalar head: per-token values (critic) or a sequence score (reward)."""

    def __init__(self, arch: ModelArch, seed: int) -> None:
        super().__init__()
        from transformers import LlamaModel  # lazy: transformers (~2 s) only where used
        torch.manual_seed(seed)
        self.backbone = LlamaModel(llama_config(arch))
        self.head = nn.Linear(arch.hidden, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.backbone(input_ids=ids, attention_mask=mask).last_hidden_state
        return self.head(h).squeeze(-1)


def save_model_dir(model: nn.Module, arch: ModelArch, path: str | Path) -> Path:
    """Write weights, config and tokenizer so that `transformers` and vLLM both load `path`."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    from transformers.utils import logging as hf_logging  # lazy: transformers (~2 s) only where used
    hf_logging.disable_progress_bar()
    # Typed as nn.Module for the callers; every model built here is a transformers PreTrainedModel.
    model.save_pretrained(p, safe_serialization=True)  # type: ignore[operator]
    build_tokenizer(arch.vocab).save_pretrained(p)
    return p


def tokenizer_mismatch(path: str | Path, vocab_size: int) -> str | None:
    """Why the checkpoint folder's tokenizer is not this module's character vocabulary of
    `vocab_size` symbols (None: it is). The loop encodes prompts, stops at EOS and decodes
    answers with that vocabulary, so a checkpoint with another tokenizer cannot be run yet."""
    import json  # lazy: only for a job's own checkpoint folder
    f = Path(path) / "tokenizer.json"
    try:
        model = json.loads(f.read_text())["model"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"no readable tokenizer.json in {str(path)!r}"
    want = {s: i for i, s in enumerate(alphabet(vocab_size))}
    if model.get("type") != "WordLevel" or model.get("vocab") != want:
        return (f"its tokenizer ({model.get('type')}, {len(model.get('vocab') or {})} entries) "
                f"is not the executor's {vocab_size}-symbol character vocabulary")
    return None


def load_policy(path: str | Path) -> nn.Module:
    """A causal LM from a checkpoint folder, whatever its architecture (the Auto classes read
    config.json: Llama, Qwen2, Qwen3, Qwen3-MoE, Mixtral, ...), in float32 on CPU."""
    from transformers import AutoModelForCausalLM  # lazy: transformers (~2 s) only where used
    from transformers.utils import logging as hf_logging  # lazy: transformers (~2 s) only where used
    hf_logging.disable_progress_bar()  # one bar per worker per load is noise in the run's output
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    return model
