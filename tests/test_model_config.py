"""ModelConfig parsing and rejection, RoPE frequencies vs. transformers, GGUF name/permutation helpers."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from nibblekv.model import ModelConfig, RopeScaling
from nibblekv.model.gguf_loader import hf_name, unpermute_qk
from nibblekv.model.presets import PRESETS, preset_config
from nibblekv.model.rope import inverse_frequencies


def test_every_preset_parses() -> None:
    for name in PRESETS:
        cfg = ModelConfig.from_hf(preset_config(name))
        assert cfg.num_heads % cfg.num_kv_heads == 0, name


def test_llama31_preset_fields() -> None:
    cfg = ModelConfig.from_hf(preset_config("llama-3.1-8b"))
    assert (cfg.architecture, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (
        "llama", 32, 32, 8, 128
    )
    assert cfg.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)
    assert cfg.rope_theta == 500000.0 and cfg.max_position_embeddings == 131072
    assert cfg.eos_token_ids == (128001, 128008, 128009) and cfg.dtype == torch.bfloat16
    assert not cfg.tie_word_embeddings and not cfg.attention_bias and not cfg.qk_norm


def test_qwen_preset_fields() -> None:
    q3 = ModelConfig.from_hf(preset_config("qwen3-8b"))
    assert q3.qk_norm and not q3.attention_bias and q3.head_dim == 128
    raw = dict(preset_config("qwen3-8b"), model_type="qwen2")
    q2 = ModelConfig.from_hf(raw)
    assert q2.attention_bias and not q2.o_proj_bias and not q2.qk_norm


@pytest.mark.parametrize("rope", [
    {"rope_type": "default"},
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},
    {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},
])
def test_inverse_frequencies_equal_transformers(rope: dict[str, Any]) -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    raw = dict(preset_config("llama-3.1-8b"), rope_scaling=rope)
    hf_config = LlamaConfig(**raw)
    if rope["rope_type"] == "default":
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        ref = LlamaRotaryEmbedding(hf_config).inv_freq
    else:
        ref, _ = ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf_config, torch.device("cpu"))
    cfg = ModelConfig.from_hf(raw)
    ours = inverse_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    assert ours.dtype == torch.float32
    assert torch.equal(ours, ref.to(torch.float32))
    if rope["rope_type"] == "llama3":  # all three bands present: untouched, divided, blended
        base = inverse_frequencies(cfg.head_dim, cfg.rope_theta, RopeScaling())
        ratio = base / ours
        assert (ratio == 1).any() and (ratio == rope["factor"]).any()
        assert ((ratio > 1) & (ratio < rope["factor"])).any()


def _tiny(**over: Any) -> dict[str, Any]:
    raw = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 96,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300,
           "max_position_embeddings": 4096}
    return {**raw, **over}


@pytest.mark.parametrize("over, message", [
    ({"model_type": "mistral", "sliding_window": 4096, "max_position_embeddings": 32768}, "sliding-window"),
    ({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 1024}, "sliding-window"),
    ({"layer_types": ["full_attention", "sliding_attention"]}, "full attention"),
    ({"model_type": "qwen3_moe"}, "unsupported model_type"),
    ({"model_type": "qwen3", "num_experts": 128}, "mixture-of-experts"),
    ({"kv_lora_rank": 512}, "latent attention"),
    ({"rope_scaling": {"rope_type": "longrope", "factor": 4.0}}, "RoPE"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"hidden_act": "gelu"}, "SiLU"),
    ({"partial_rotary_factor": 0.5}, "partial rotary"),
    ({"num_key_value_heads": 3}, "multiple"),
])
def test_unsupported_hf_configs_rejected(over: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf(_tiny(**over))


def test_window_not_in_use_is_accepted() -> None:
    qwen = ModelConfig.from_hf(_tiny(model_type="qwen2", use_sliding_window=False, sliding_window=1024))
    mistral = ModelConfig.from_hf(_tiny(model_type="mistral", sliding_window=None))
    assert qwen.architecture == "qwen2" and mistral.architecture == "mistral"


def _gguf_meta(arch: str = "llama", **over: Any) -> dict[str, Any]:
    meta = {"general.architecture": arch, "general.name": "test", f"{arch}.block_count": 2,
            f"{arch}.embedding_length": 64, f"{arch}.feed_forward_length": 96,
            f"{arch}.attention.head_count": 4, f"{arch}.attention.head_count_kv": 2,
            f"{arch}.context_length": 1024, f"{arch}.vocab_size": 300}
    return {**meta, **over}


def test_gguf_metadata_qwen3() -> None:
    names = {"token_embd.weight", "output.weight", "blk.0.attn_q_norm.weight"}
    cfg = ModelConfig.from_gguf(_gguf_meta("qwen3", **{"qwen3.attention.key_length": 32}), names)
    assert cfg.qk_norm and cfg.head_dim == 32 and not cfg.tie_word_embeddings and not cfg.attention_bias


@pytest.mark.parametrize("meta, names, message", [
    (_gguf_meta("gemma2"), set(), "architecture"),
    (_gguf_meta(**{"llama.expert_count": 8}), set(), "mixture-of-experts"),
    (_gguf_meta(), {"rope_freqs.weight"}, "rope_freqs"),  # values not passed
    (_gguf_meta(**{"llama.rope.scaling.type": "yarn"}), set(), "RoPE"),
])
def test_unsupported_gguf_rejected(meta: dict[str, Any], names: set[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_gguf(meta, names)


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation (the operation unpermute_qk must undo)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.mark.parametrize("shape, n_head", [((576, 8), 9), ((192, 5), 3), ((192,), 3)])
def test_unpermute_undoes_llama_cpp_permute(shape: tuple[int, ...], n_head: int) -> None:
    w = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    permuted = _llama_cpp_permute(w, n_head)
    assert not np.array_equal(permuted, w)
    assert np.array_equal(unpermute_qk(permuted, n_head), w)


def test_gguf_tensor_names() -> None:
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("output.weight") == "lm_head.weight"
    assert hf_name("blk.12.attn_q.bias") == "model.layers.12.self_attn.q_proj.bias"
    assert hf_name("blk.3.ffn_norm.weight") == "model.layers.3.post_attention_layernorm.weight"
    assert hf_name("blk.3.attn_k_norm.weight") == "model.layers.3.self_attn.k_norm.weight"
    assert hf_name("rope_freqs.weight") is None
