"""Seeded random models for tests (no checkpoint needed)."""

from __future__ import annotations

import torch

from nibblekv.model import CausalLM, ModelConfig


def random_causal_lm(config: ModelConfig, std: float, seed: int = 0) -> CausalLM:
    """``CausalLM(config)`` with weights ~ N(0, std) and norm weights ~ 1 + N(0, 0.2): norms randomized too,
    so a path that skipped one would show."""
    torch.manual_seed(seed)
    model = CausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.2 * torch.randn_like(p) if "norm" in name else std * torch.randn_like(p))
    return model.eval()
