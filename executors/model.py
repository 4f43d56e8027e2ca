"""The policy: a Hugging Face `LlamaForCausalLM` built from a catalog shape, with a local tokenizer.

Nothing is downloaded. The architecture comes from `placer/spec/catalog/models.yaml` (tiny-llama: 2
layers, hidden 64, 4 heads, 2 KV heads, MLP 128, vocab 64), the weights are a seeded random init,
and the tokenizer is a character-level `tokenizers` WordLevel model over a fixed 64-symbol
alphabet (specials, digits, arithmetic operators, letters), wrapped as a
`PreTrainedTokenizerFast`. `save_model_dir` writes config, safetensors weights and tokenizer with
`save_pretrained`, so the same directory loads in `transformers` and in vLLM.

The tokenizers and the `Codec` every part of the executor reads text with live in
`executors.codec` (free of torch); their names are re-exported here for the existing callers.

Value models (PPO critic, a model reward) are the same backbone with a scalar head.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from executors.codec import BOS as BOS
from executors.codec import EOS as EOS
from executors.codec import PAD as PAD
from executors.codec import SPECIALS as SPECIALS
from executors.codec import UNK as UNK
from executors.codec import CharCodec as CharCodec
from executors.codec import Codec as Codec
from executors.codec import HFCodec as HFCodec
from executors.codec import alphabet as alphabet
from executors.codec import build_tokenizer
from executors.codec import codec_for as codec_for
from executors.codec import decode as decode
from executors.codec import encode as encode
from executors.codec import load_codec as load_codec
from executors.codec import prompt_ids as prompt_ids
from executors.codec import tokenizer_mismatch as tokenizer_mismatch
from executors.codec import tokenizer_problem as tokenizer_problem
from placer.spec.arch import ModelArch


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

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None, **kw: Any) -> torch.Tensor:
        """Values at every column; `kw` go to the backbone (a context-parallel slice's
        positions and `cp_slice`, `executors.critic`)."""
        h = self.backbone(input_ids=ids, attention_mask=mask, **kw).last_hidden_state
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


def load_policy(path: str | Path) -> nn.Module:
    """A causal LM from a checkpoint folder, whatever its architecture (the Auto classes read
    config.json: Llama, Qwen2, Qwen3, Qwen3-MoE, Mixtral, ...), in float32 on CPU."""
    from transformers import AutoModelForCausalLM  # lazy: transformers (~2 s) only where used
    from transformers.utils import logging as hf_logging  # lazy: transformers (~2 s) only where used
    hf_logging.disable_progress_bar()  # one bar per worker per load is noise in the run's output
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    return model


def state_digest(state: dict[str, torch.Tensor]) -> str:
    """A digest of a set of weights: every tensor's name, shape and FP32 bytes, in name order
    (equal digests: the same weights; a fleet's shared engines are checked against the trainer
    of the job they serve with it, `executors.fleetrun`)."""
    import hashlib
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().to("cpu", torch.float32).contiguous()
        h.update(f"{name}{tuple(t.shape)}".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()

