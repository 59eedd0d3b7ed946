"""Tiny random Llama / Mistral / Qwen2 / Qwen3 models: ours (loaded from a safetensors folder) vs.
transformers' own implementation with the same weights."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from nibblekv.model import CausalLM, DenseAttention, HFTokenizer, load_model

transformers = pytest.importorskip("transformers")

_BASE: dict[str, Any] = {
    "vocab_size": 300,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    # Qwen3: q/k norm, head_dim (32) != hidden / heads (16), no bias.
    "qwen3": ("Qwen3Config", {"head_dim": 32, "attention_bias": False, "tie_word_embeddings": True}),
    # Qwen2: q/k/v bias, no o_proj bias.
    "qwen2": ("Qwen2Config", {"tie_word_embeddings": False}),
    # Llama 3.x RoPE scaling with a small original context so all three frequency bands occur,
    # plus attention_bias (q/k/v and o_proj).
    "llama3": ("LlamaConfig", {
        "attention_bias": True,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    }),
    "mistral": ("MistralConfig", {"sliding_window": None, "head_dim": 16}),
}


def _word_tokenizer(folder: Path) -> None:
    """Save a tiny word-level HF tokenizer (ids < 300) into ``folder``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(str(folder))


def _hf_model(name: str) -> Any:
    """A seeded random HF model; norms and biases randomized too, so a skipped one would show."""
    cls_name, extra = CASES[name]
    config = getattr(transformers, cls_name)(**{**_BASE, **extra})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif pname.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, CausalLM, Any]:
    """(HF model, our model loaded from its saved safetensors folder, our tokenizer)."""
    name = request.param
    hf = _hf_model(name)
    folder = tmp_path_factory.mktemp(name)
    hf.save_pretrained(str(folder))
    _word_tokenizer(folder)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    ours, tok = load_model(str(folder), dtype=torch.float32)
    return hf, ours, tok


@torch.no_grad()
def test_logits_match_transformers(pair: tuple[Any, CausalLM, Any]) -> None:
    hf, ours, _ = pair
    gen = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 300, (n,), generator=gen) for n in (37, 5, 80)]
    ids = torch.cat(seqs)
    pos = torch.cat([torch.arange(len(s)) for s in seqs])
    cu = [0, 37, 42, 122]
    logits = ours.compute_logits(ours(ids, pos, DenseAttention(cu)))
    ref = torch.cat([hf(s[None]).logits[0] for s in seqs]).float()
    diff = (logits - ref).abs().max().item()
    print(f"{hf.config.model_type}: max |logit diff| {diff:.2e}")
    assert logits.dtype == torch.float32 and logits.shape == ref.shape
    assert diff < 1e-4


def test_config_read_from_folder(pair: tuple[Any, CausalLM, Any]) -> None:
    hf, ours, tok = pair
    cfg, model_type = ours.config, hf.config.model_type
    assert cfg.architecture == model_type
    assert cfg.qk_norm == (model_type == "qwen3")
    assert cfg.attention_bias == (model_type in ("qwen2", "llama"))
    assert cfg.o_proj_bias == (model_type == "llama")
    assert cfg.rope_scaling.rope_type == ("llama3" if model_type == "llama" else "default")
    assert cfg.head_dim == (getattr(hf.config, "head_dim", None) or 64 // 4)
    assert isinstance(tok, HFTokenizer) and tok.eos_token_ids == [2, 7]
    assert tok.encode("the cat sat", add_special_tokens=False) == [3, 4, 5]


@torch.no_grad()
def test_bf16_close_to_fp32(pair: tuple[Any, CausalLM, Any]) -> None:
    """The same weights in bf16 stay near fp32 (a sanity check of the dtype path)."""
    _, ours, _ = pair
    ids = torch.arange(1, 41)
    pos = torch.arange(40)
    fp32 = ours.compute_logits(ours(ids, pos, DenseAttention.single(40)))
    bf16_model = CausalLM(ours.config).to(torch.bfloat16).eval()
    bf16_model.load_state_dict({k: v.to(torch.bfloat16) for k, v in ours.state_dict().items()})
    bf16 = bf16_model.compute_logits(bf16_model(ids, pos, DenseAttention.single(40)))
    assert bf16.dtype == torch.float32
    assert (bf16 - fp32).abs().max().item() < 0.05 * fp32.abs().max().item()


def _llama_cpp_rope_factors(hf_config: Any, head_dim: int) -> list[float]:
    """Per-frequency divisors as llama.cpp's convert_hf_to_gguf writes them for Llama 3 RoPE."""
    rope = hf_config.rope_parameters
    base, factor = rope["rope_theta"], rope["factor"]
    low, high, old_len = rope["low_freq_factor"], rope["high_freq_factor"], rope["original_max_position_embeddings"]
    freqs = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    factors = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < old_len / high:
            factors.append(1.0)
        elif wavelen > old_len / low:
            factors.append(factor)
        else:
            smooth = (old_len / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return factors


def _write_gguf(hf: Any, path: Path) -> None:
    """Write ``hf`` as an F32 GGUF the way llama.cpp lays it out (names, Q/K permutation, rope_freqs)."""
    gguf = pytest.importorskip("gguf")
    from nibblekv.model.gguf_loader import _GLOBAL_NAMES, _LAYER_NAMES

    cfg, model_type = hf.config, hf.config.model_type
    arch = "llama" if model_type in ("llama", "mistral") else model_type
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny {model_type}")
    for add, value in [(w.add_block_count, cfg.num_hidden_layers), (w.add_context_length, 256),
                       (w.add_embedding_length, cfg.hidden_size), (w.add_feed_forward_length, cfg.intermediate_size),
                       (w.add_head_count, cfg.num_attention_heads), (w.add_head_count_kv, cfg.num_key_value_heads),
                       (w.add_layer_norm_rms_eps, cfg.rms_norm_eps), (w.add_rope_freq_base, 10000.0),
                       (w.add_key_length, head_dim), (w.add_rope_dimension_count, head_dim),
                       (w.add_vocab_size, cfg.vocab_size)]:
        add(value)
    to_gguf = {v: k for k, v in _GLOBAL_NAMES.items()}
    for name, t in hf.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        module, _, leaf = name.rpartition(".")
        parts = module.split(".")
        if parts[:2] == ["model", "layers"]:
            stem = {v: k for k, v in _LAYER_NAMES.items()}[".".join(parts[3:])]
            gname = f"blk.{parts[2]}.{stem}.{leaf}"
        else:
            gname = f"{to_gguf[module]}.{leaf}"
        data = t.detach().numpy().astype(np.float32)
        if arch == "llama" and stem_is(gname, "attn_q"):
            data = _permute(data, cfg.num_attention_heads)
        elif arch == "llama" and stem_is(gname, "attn_k"):
            data = _permute(data, cfg.num_key_value_heads)
        w.add_tensor(gname, data)
    if model_type == "llama":
        w.add_tensor("rope_freqs.weight", np.array(_llama_cpp_rope_factors(cfg, head_dim), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def stem_is(gguf_name: str, stem: str) -> bool:
    return gguf_name.split(".")[2] == stem if gguf_name.startswith("blk.") else False


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's Q/K permutation (convert_hf_to_gguf.LlamaModel.permute)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@torch.no_grad()
def test_gguf_written_like_llama_cpp_matches(pair: tuple[Any, CausalLM, Any], tmp_path: Path) -> None:
    """The same weights through a GGUF file: config, names, Q/K un-permutation and rope_freqs."""
    from nibblekv.model import gguf_loader
    from nibblekv.model.loader import _empty_model
    from nibblekv.model.weights import load_hf_weights

    hf, from_folder, _ = pair
    path = tmp_path / "tiny.gguf"
    _write_gguf(hf, path)
    reader = gguf_loader.open_gguf(path)
    config = gguf_loader.gguf_config(reader)
    expected_rope = "freq_factors" if hf.config.model_type == "llama" else "default"
    assert config.rope_scaling.rope_type == expected_rope
    # GGUF stores eps as float32 and (here) no token ids; everything else must agree with config.json.
    assert config.rms_norm_eps == pytest.approx(1e-6)
    assert replace(config, rope_scaling=from_folder.config.rope_scaling, bos_token_id=1, eos_token_ids=(2,),
                   rms_norm_eps=1e-6) == replace(from_folder.config, max_position_embeddings=256)
    ours = _empty_model(config, torch.float32, torch.device("cpu"))
    load_hf_weights(ours, gguf_loader.iter_gguf_weights(reader, config))
    ids = torch.randint(0, 300, (50,), generator=torch.Generator().manual_seed(2))
    logits = ours.compute_logits(ours(ids, torch.arange(50), DenseAttention.single(50)))
    ref = hf(ids[None]).logits[0].float()
    assert (logits - ref).abs().max().item() < 1e-4
