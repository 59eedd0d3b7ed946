"""Read a GGUF file: metadata -> :class:`ModelConfig`, tensors -> dequantized HF-named tensors.

NOTE: ``gguf`` is imported inside the functions only: the GPU machine has no ``gguf`` package and
must still import :mod:`nibblekv.model`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch

from nibblekv.model.config import ModelConfig
from nibblekv.model.gguf_fast import dequantize, fast_reader_class

_Array = TypeVar("_Array", np.ndarray, torch.Tensor)

if TYPE_CHECKING:
    from gguf import GGUFReader

# GGUF per-layer tensor stem -> HF module path under ``model.layers.N.``
_LAYER_NAMES: dict[str, str] = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES: dict[str, str] = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
# Large tokenizer arrays; the config does not need them and reading them is slow.
_SKIP_FIELDS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type", "tokenizer.ggml.scores")


def open_gguf(path: str | Path) -> GGUFReader:
    """Memory-map a GGUF file (needs the ``gguf`` package; read with :mod:`gguf_fast`'s reader)."""
    try:
        reader_class = fast_reader_class()
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("reading GGUF files needs the 'gguf' package: pip install gguf") from exc
    return reader_class(str(path))  # type: ignore[no-any-return]


def read_metadata(reader: GGUFReader) -> dict[str, Any]:
    """GGUF key/value metadata as plain Python values (big tokenizer arrays left out)."""
    return {key: field.contents() for key, field in reader.fields.items() if key not in _SKIP_FIELDS}


def gguf_config(reader: GGUFReader) -> ModelConfig:
    """The :class:`ModelConfig` of an opened GGUF file."""
    meta = read_metadata(reader)
    tensors = {t.name: t for t in reader.tensors}
    arch = meta["general.architecture"]
    if f"{arch}.vocab_size" not in meta:
        # GGUF shapes are [ne0=hidden, ne1=vocab]
        meta[f"{arch}.vocab_size"] = int(tensors["token_embd.weight"].shape[-1])
    rope_freqs = None
    if "rope_freqs.weight" in tensors:
        t = tensors["rope_freqs.weight"]
        rope_freqs = dequantize(t.data, t.tensor_type).reshape(-1).tolist()
    return ModelConfig.from_gguf(meta, tensors.keys(), rope_freqs)


def hf_name(gguf_name: str) -> str | None:
    """GGUF tensor name -> HF name (``None`` for tensors we do not use)."""
    m = _LAYER_RE.match(gguf_name)
    if m:
        layer, stem, leaf = m.groups()
        module = _LAYER_NAMES.get(stem)
        return None if module is None else f"model.layers.{layer}.{module}.{leaf}"
    stem, _, leaf = gguf_name.rpartition(".")
    module = _GLOBAL_NAMES.get(stem)
    return None if module is None else f"{module}.{leaf}"


def unpermute_qk(w: _Array, n_head: int) -> _Array:
    """Undo llama.cpp's Q/K row permutation for Llama-family GGUFs (as transformers' loader does).

    llama.cpp reorders each head's rows from NeoX "rotate half" order to interleaved pairs; this maps
    rows ``[head, pair, 2]`` back to ``[head, 2, pair]``. Works for weights and biases.
    """
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def iter_gguf_weights(reader: GGUFReader, config: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, float32 tensor)`` for every tensor the model uses, dequantized."""
    # NOTE: only GGUF arch "llama" (which includes Mistral) stores permuted Q/K; qwen2/qwen3 do not.
    permuted = config.architecture in ("llama", "mistral")
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is None:
            continue
        w = dequantize(t.data, t.tensor_type)
        if permuted and ".self_attn.q_proj." in name:
            w = unpermute_qk(w, config.num_heads)
        elif permuted and ".self_attn.k_proj." in name:
            w = unpermute_qk(w, config.num_kv_heads)
        yield name, w.contiguous()


def chat_template(reader: GGUFReader) -> str | None:
    """The Jinja chat template stored in the GGUF metadata, if any."""
    field = reader.fields.get("tokenizer.chat_template")
    return None if field is None else str(field.contents())
