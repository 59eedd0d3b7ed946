"""FP8 E4M3 weights and activations for the linear layers (the storage math; kernels reproduce it).

Weights ``W [N, K]`` are stored as ``Wq`` (float8_e4m3fn) with FP32 scales, ``W ~= Wq * scale``, either

* per output channel: ``scale [N]`` (a per-tensor checkpoint scale is the same value on every row), or
* per ``B x B`` block (``B = 128`` in DeepSeek / Qwen3 FP8 checkpoints): ``scale [ceil(N/B), ceil(K/B)]``.

Activations are quantized dynamically, per token (one scale per row of ``x [M, K]``) for per-channel
weights and per token-group of ``B`` columns for block weights: ``scale = max(amax, EPS) / 448``,
``xq = e4m3(clamp(x / scale, -448, 448))`` (round to nearest even), as SGLang / vLLM do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from nibblekv.formats.nvfp4 import E4M3_MAX

ACT_EPS: float = 1e-10  # amax floor: an all-zero row gets a tiny scale instead of 0 / 0


@dataclass(frozen=True)
class Fp8Input:
    """How an FP8 layer quantizes its input rows: per ``group`` columns (``None``: one scale per row). A
    kernel before the layer that knows it (the RMSNorm, SiLU * mul) hands over :class:`QuantizedRows`."""

    group: int | None


class QuantizedRows(NamedTuple):
    """Activations already quantized for an FP8 layer (by the kernel before it: the norm or SiLU * mul):
    ``q [M, K]`` e4m3 and ``scale [M, ceil(K / min(group, K))]`` fp32, as :func:`quantize_act_groups` makes
    them; ``group=None``: one scale per row. ``dtype``: the activations' own dtype (the layer's output's)."""

    q: torch.Tensor
    scale: torch.Tensor
    group: int | None
    dtype: torch.dtype

    @property
    def shape(self) -> torch.Size:
        return self.q.shape


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def quantize_act_groups(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` -> ``(xq float8_e4m3fn [M, K], scale float32 [M, ceil(K/group)])``.

    ``group >= K`` gives one scale per token. The last group of a row may be partial.
    """
    m, k = x.shape
    g = min(group, k)
    groups = _cdiv(k, g)
    xf = torch.nn.functional.pad(x.float(), (0, groups * g - k)).view(m, groups, g)
    amax = xf.abs().amax(dim=-1).clamp_min(ACT_EPS)
    # NOTE: a tensor divisor: CUDA torch divides by a Python scalar as a multiply by its reciprocal, which is
    # 1 ulp off the kernels' correctly rounded division for some values (and then flips e4m3 codes)
    scale = amax / torch.full_like(amax, E4M3_MAX)
    q = (xf / scale[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.view(m, groups * g)[:, :k].contiguous(), scale


def dequantize_act_groups(q: torch.Tensor, scale: torch.Tensor, group: int) -> torch.Tensor:
    """Inverse of :func:`quantize_act_groups`: float32 ``[M, K]``."""
    k = q.shape[1]
    g = min(group, k)
    return q.float() * scale.repeat_interleave(g, dim=1)[:, :k]


def quantize_weight_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``W [N, K]`` -> ``(Wq [N, K], scale float32 [N])``: ``scale = amax(row) / 448`` (all-zero rows: 1)."""
    amax = w.float().abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    q = (w.float() / scale[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


def quantize_weight_block(w: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``W [N, K]`` -> ``(Wq [N, K], scale float32 [ceil(N/B), ceil(K/B)])``, a scale per B x B block."""
    n, k = w.shape
    nb, kb = _cdiv(n, block), _cdiv(k, block)
    wf = torch.nn.functional.pad(w.float(), (0, kb * block - k, 0, nb * block - n))
    blocks = wf.view(nb, block, kb, block)
    amax = blocks.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    q = (blocks / scale[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.view(nb * block, kb * block)[:n, :k].contiguous(), scale


def dequantize_weight(q: torch.Tensor, scale: torch.Tensor, block: int | None) -> torch.Tensor:
    """float32 ``W [N, K]`` from ``Wq`` and its per-channel ``[N]`` (``block=None``) or block
    ``[ceil(N/B), ceil(K/B)]`` scales."""
    n, k = q.shape
    if block is None:
        return q.float() * scale.float()[:, None]
    full = scale.float().repeat_interleave(block, dim=0).repeat_interleave(block, dim=1)
    return q.float() * full[:n, :k]
