"""A cache-free attention backend: causal SDPA within each sequence of a flattened batch.

For tests (model equivalence with HF) and for fake-quantization evals (``kv_transform`` lets an eval
round-trip K/V through a format before attending, as a cache would store them).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from nibblekv.attention.backend import AttentionBackend

# (layer_id, k [T, kv_heads, D], v [T, kv_heads, D]) -> (k', v') of the same shapes and dtype
KVTransform = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class DenseAttention(AttentionBackend):
    """Full causal attention over whole sequences given in one forward (no KV cache).

    ``cu_seqlens [B + 1]`` (cumulative lengths, ``cu_seqlens[0] == 0``, ``cu_seqlens[-1] == T``)
    says where each sequence of the flattened batch starts; every forward must hold complete
    sequences from their first token. Softmax scale is ``head_dim ** -0.5``.
    """

    def __init__(self, cu_seqlens: torch.Tensor | list[int], kv_transform: KVTransform | None = None) -> None:
        bounds = [int(x) for x in cu_seqlens]
        if not bounds or bounds[0] != 0 or any(b > a for a, b in zip(bounds[1:], bounds)):
            raise ValueError(f"cu_seqlens must start at 0 and be non-decreasing, got {bounds}")
        self.bounds = bounds
        self.kv_transform = kv_transform

    @staticmethod
    def single(num_tokens: int, kv_transform: KVTransform | None = None) -> DenseAttention:
        """Backend for one sequence of ``num_tokens`` tokens."""
        return DenseAttention([0, num_tokens], kv_transform)

    def forward(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``q [T, Hq, D]``, ``k, v [T, Hkv, D]`` -> ``[T, Hq, D]``, causal within each sequence."""
        if q.shape[0] != self.bounds[-1]:
            raise ValueError(f"got {q.shape[0]} tokens, cu_seqlens covers {self.bounds[-1]}")
        if self.kv_transform is not None:
            k, v = self.kv_transform(layer_id, k, v)
        group = q.shape[1] // k.shape[1]
        out = torch.empty_like(q)
        for start, end in zip(self.bounds[:-1], self.bounds[1:]):
            if end == start:
                continue
            # [H, L, D] per sequence; kv heads repeated for GQA as HF's eager/SDPA paths do.
            qs = q[start:end].transpose(0, 1)
            ks = k[start:end].repeat_interleave(group, dim=1).transpose(0, 1)
            vs = v[start:end].repeat_interleave(group, dim=1).transpose(0, 1)
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
            out[start:end] = o.transpose(0, 1)
        return out
