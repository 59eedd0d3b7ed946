"""Pure-torch twins of the fused kernels in :mod:`nibblekv.kernels.fused`: the definition.

Each twin is the eager code of :mod:`nibblekv.model.layers` / :mod:`nibblekv.model.rope`, operation for
operation, so it rounds exactly where the eager model rounds:

* ``add_rms_norm_ref``: ``x + residual`` in the activation dtype, then HF's RMSNorm (float32 statistics,
  the normalized value cast back to the activation dtype, then times the weight);
* ``silu_and_mul_ref``: ``F.silu(gate) * up`` (two roundings to the dtype);
* ``rope_qk_ref``: ``x * cos + rotate_half(x) * sin`` on q and k (each product rounded, then the sum);
* ``rotate_quant_fp8_ref``: ``o_h @ R`` per head (rounded to the activation dtype), then the FP8 activation
  quantization of an o_proj.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nibblekv.formats.fp8_weights import quantize_act_groups


def add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x, residual [T, H]`` (same dtype), ``weight [H]`` -> ``(rms_norm(s) * weight, s)``, ``s = x + residual``.

    ``residual=None`` means ``s = x`` (the first layer). ``s`` has ``x``'s dtype; the normed output has
    ``torch.promote_types(weight.dtype, x.dtype)`` (the model's own dtype when both match).
    """
    s = x if residual is None else x + residual
    sf = s.to(torch.float32)
    sf = sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * sf.to(s.dtype), s


def silu_and_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """``gate_up [T, 2I]`` (``[gate | up]``) -> ``silu(gate) * up`` ``[T, I]`` in the same dtype."""
    gate, up = gate_up.split(gate_up.shape[-1] // 2, dim=-1)
    return F.silu(gate) * up


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX rotate-half RoPE, as ``nibblekv.model.rope.apply_rope``."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def rope_qk_ref(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    rotation: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``qkv [T, (Hq + 2 Hkv) * D]`` (rows ``[q | k | v]``), ``cos, sin [T, 1, D]`` in ``qkv``'s dtype
    -> ``q [T, Hq, D]``, ``k [T, Hkv, D]`` rotated and ``v [T, Hkv, D]`` (contiguous); with ``rotation
    [D, D]``, all three times it on the right (as ``PagedAttentionBackend.forward`` rotates them)."""
    t = qkv.shape[0]
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    q, k, v = qkv.split((q_size, kv_size, kv_size), dim=-1)
    q = q.reshape(t, num_heads, head_dim)
    k = k.reshape(t, num_kv_heads, head_dim)
    v = v.reshape(t, num_kv_heads, head_dim)
    q, k, v = _rotate(q, cos, sin), _rotate(k, cos, sin), v.contiguous()
    if rotation is not None:
        q, k, v = q @ rotation, k @ rotation, v @ rotation
    return q, k, v


__all__ = ["add_rms_norm_ref", "rope_qk_ref", "silu_and_mul_ref"]


def rotate_quant_fp8_ref(
    x: torch.Tensor, rotation: torch.Tensor, group: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, H * D]`` -> each head times ``rotation [D, D]`` (float32 sums, rounded to ``x``'s dtype),
    quantized per token (``group=None``) or per ``group`` columns: ``(e4m3 [M, H * D],
    scale [M, groups])``."""
    m, k = x.shape
    d = rotation.shape[0]
    y = (x.float().view(m, k // d, d) @ rotation.float()).to(x.dtype).view(m, k)
    return quantize_act_groups(y, k if group is None else group)
