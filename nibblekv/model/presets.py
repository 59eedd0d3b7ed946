"""Built-in model shapes as Hugging Face ``config.json`` contents, plus published checkpoint sizes.

Each entry of :data:`PRESETS` carries the fields of the real ``config.json`` of the named
checkpoint (the instruct variant where there is one), so it can be handed to
``transformers.AutoConfig.for_model(**cfg)`` / ``LlamaConfig(**cfg)`` or written to disk as a
``config.json``. ``head_dim`` appears only where the real file has it. Callers must treat the
dicts as read-only: use :func:`preset_config` for a private copy.

:data:`PUBLISHED_WEIGHTS_GIB` records checkpoint sizes (GiB, 2**30 bytes) of published
quantized checkpoints; the planner prefers them over its parameter-count estimate.
"""

from __future__ import annotations

import copy
from typing import Any

_LLAMA3_ROPE_SCALING: dict[str, Any] = {
    "factor": 8.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}
_LLAMA3_INSTRUCT_EOS: list[int] = [128001, 128008, 128009]


def _llama3(*, hidden: int, inter: int, layers: int, heads: int, head_dim: int | None) -> dict[str, Any]:
    """A Llama 3.1 / 3.3 instruct ``config.json`` (all share vocab, rope and ids)."""
    cfg: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 128000,
        "eos_token_id": list(_LLAMA3_INSTRUCT_EOS),
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": inter,
        "max_position_embeddings": 131072,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": 8,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": dict(_LLAMA3_ROPE_SCALING),
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": 128256,
    }
    if head_dim is not None:
        cfg["head_dim"] = head_dim
    return cfg


def _qwen3(*, hidden: int, inter: int, layers: int, heads: int) -> dict[str, Any]:
    """A Qwen3 dense ``config.json`` (8 KV heads, head_dim 128, full attention)."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": inter,
        "max_position_embeddings": 40960,
        "max_window_layers": layers,
        "model_type": "qwen3",
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 151936,
    }


_QWEN25_7B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 18944,
    "max_position_embeddings": 32768,
    "max_window_layers": 28,
    "model_type": "qwen2",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 131072,  # present but inactive: use_sliding_window is false
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 152064,
}

_MISTRAL_7B_V03: dict[str, Any] = {
    "architectures": ["MistralForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mistral",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 32768,
}

_SMOLLM2_135M_INSTRUCT: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 576,
    "initializer_range": 0.041666666666666664,
    "intermediate_size": 1536,
    "is_llama_config": True,
    "max_position_embeddings": 8192,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 9,
    "num_hidden_layers": 30,
    "num_key_value_heads": 3,
    "pad_token_id": 2,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_interleaved": False,
    "rope_scaling": None,
    "rope_theta": 100000,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 49152,
}

# Qwen/Qwen3.5-27B's config.json (vision-language: the decoder's fields in text_config; the vision tower's
# config left out, a text-only engine never builds it). Numbers as transformers' Qwen3_5TextConfig reads
# them from the published file: 64 layers, every 4th full attention (24 heads, 4 KV heads, head_dim 256,
# a quarter of it rotated), 48 Gated DeltaNet layers (16 key / 48 value heads of 128), dense MLPs.
_QWEN35_27B: dict[str, Any] = {
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "model_type": "qwen3_5",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "text_config": {
        "model_type": "qwen3_5_text",
        "attention_bias": False,
        "attn_output_gate": True,
        "eos_token_id": 248044,
        "full_attention_interval": 4,
        "head_dim": 256,
        "hidden_act": "silu",
        "hidden_size": 5120,
        "intermediate_size": 17408,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 48,
        "linear_value_head_dim": 128,
        "mamba_ssm_dtype": "float32",
        "max_position_embeddings": 262144,
        "num_attention_heads": 24,
        "num_hidden_layers": 64,
        "num_key_value_heads": 4,
        "partial_rotary_factor": 0.25,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25},
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 248320,
    },
}

# name -> config.json contents (Hugging Face repo in the comment)
PRESETS: dict[str, dict[str, Any]] = {
    # meta-llama/Llama-3.1-405B-Instruct (GQA 16: NVFP4 decode through decode_mma16)
    "llama-3.1-405b": _llama3(hidden=16384, inter=53248, layers=126, heads=128, head_dim=None),
    # meta-llama/Llama-3.3-70B-Instruct
    "llama-3.3-70b": _llama3(hidden=8192, inter=28672, layers=80, heads=64, head_dim=128),
    # meta-llama/Llama-3.1-70B-Instruct
    "llama-3.1-70b": _llama3(hidden=8192, inter=28672, layers=80, heads=64, head_dim=None),
    # meta-llama/Llama-3.1-8B-Instruct
    "llama-3.1-8b": _llama3(hidden=4096, inter=14336, layers=32, heads=32, head_dim=None),
    # Qwen/Qwen3-8B
    "qwen3-8b": _qwen3(hidden=4096, inter=12288, layers=36, heads=32),
    # Qwen/Qwen3-32B
    "qwen3-32b": _qwen3(hidden=5120, inter=25600, layers=64, heads=64),
    # Qwen/Qwen2.5-7B-Instruct
    "qwen2.5-7b": _QWEN25_7B,
    # mistralai/Mistral-7B-Instruct-v0.3
    "mistral-7b": _MISTRAL_7B_V03,
    # Qwen/Qwen3.5-27B (hybrid: Gated DeltaNet + gated attention; Qwen3-Next-80B-A3B is MoE: no preset)
    "qwen3.5-27b": _QWEN35_27B,
    # HuggingFaceTB/SmolLM2-135M-Instruct
    "smollm2-135m": _SMOLLM2_135M_INSTRUCT,
}

# (preset name, weight dtype) -> published checkpoint size in GiB. bf16 is left to the
# parameter count (x 2 bytes); add rows only for sizes actually published.
PUBLISHED_WEIGHTS_GIB: dict[tuple[str, str], float] = {
    ("llama-3.3-70b", "fp8"): 67.7,
    ("llama-3.3-70b", "nvfp4"): 39.8,
}


def preset_names() -> tuple[str, ...]:
    """Names of the built-in presets, sorted."""
    return tuple(sorted(PRESETS))


def preset_config(name: str) -> dict[str, Any]:
    """A deep copy of the named preset's ``config.json`` dict (KeyError if unknown)."""
    return copy.deepcopy(PRESETS[name.strip().lower()])


def published_weights_gib(name: str, weights_dtype: str) -> float | None:
    """Published checkpoint size in GiB for ``name`` in ``weights_dtype``, or None if unknown."""
    return PUBLISHED_WEIGHTS_GIB.get((name.strip().lower(), weights_dtype.strip().lower()))
