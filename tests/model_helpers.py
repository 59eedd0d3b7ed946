"""Seeded random models for tests (no checkpoint needed)."""

from __future__ import annotations

import torch

from nibblekv.model import CausalLM, ModelConfig

# A tiny Llama config.json (a 320-token byte vocabulary): loads as random weights in well under a second
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "vocab_size": 320, "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "bos_token_id": 256, "eos_token_id": 257,
}  # fmt: skip


def random_causal_lm(config: ModelConfig, std: float, seed: int = 0) -> CausalLM:
    """``CausalLM(config)`` with weights ~ N(0, std) and norm weights ~ 1 + N(0, 0.2): norms randomized too,
    so a path that skipped one would show."""
    torch.manual_seed(seed)
    model = CausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.2 * torch.randn_like(p) if "norm" in name else std * torch.randn_like(p))
    return model.eval()
