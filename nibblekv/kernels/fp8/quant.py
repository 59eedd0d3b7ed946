"""Dynamic FP8 activation quantization: ``x [M, K]`` -> e4m3 codes + one FP32 scale per token-group (or per
token), the math of :func:`nibblekv.formats.fp8_weights.quantize_act_groups` bit for bit.

* :func:`quant_fp8_groups`: the launcher (power-of-two groups and rows up to :data:`ROW_TILE_MAX`, longer
  ones at decode batches, as tiles read once; others one group a program);
* :func:`act_scale` / :func:`act_codes`: the per-group math, shared with the fused kernels that quantize
  their output for the FP8 layer after them (``kernels.fused``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nibblekv.formats.fp8_weights import ACT_EPS
from nibblekv.formats.nvfp4 import E4M3_MAX
from nibblekv.kernels.pdl import pdl_enter, pdl_launch
from nibblekv.kernels.write import _round_to_e4m3


@triton.jit
def act_scale(amax, EPS: tl.constexpr, FP8_MAX: tl.constexpr):
    """A token group's activation scale from its amax (``quantize_act_groups``' math)."""
    return tl.math.div_rn(tl.maximum(amax, EPS), FP8_MAX)


@triton.jit
def act_codes(x, scale, FP8_MAX: tl.constexpr):
    """fp32 activations -> e4m3 under ``scale``, rounded first: the cast is then exact on the GPU and under
    the interpreter alike."""
    return _round_to_e4m3(tl.clamp(tl.math.div_rn(x, scale), -FP8_MAX, FP8_MAX)).to(tl.float8e4nv)


@triton.jit
def _group_chunk(x_ptr, row, stride_x, start, k0, GROUP, K, BLOCK: tl.constexpr):
    """Elements ``k0 + [0, BLOCK)`` of the token group at ``start`` of row ``row``: (their offsets, mask,
    values in fp32, 0 past the group or past ``K``)."""
    within = k0 + tl.arange(0, BLOCK)
    offs = start + within
    mask = (within < GROUP) & (offs < K)
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    return offs, mask, x


@triton.jit
def _quant_kernel(
    x_ptr, q_ptr, s_ptr, K, GROUP, n_groups, stride_x, stride_q,
    BLOCK: tl.constexpr, EPS: tl.constexpr, FP8_MAX: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    start = g * GROUP
    amax = tl.zeros([BLOCK], dtype=tl.float32)
    # NOTE: `while`, not `for`: triton 3.6's interpreter cannot run `for` over runtime bounds
    k0 = 0
    while k0 < GROUP:
        _, _, x = _group_chunk(x_ptr, row, stride_x, start, k0, GROUP, K, BLOCK)
        amax = tl.maximum(amax, tl.abs(x))
        k0 += BLOCK
    scale = act_scale(tl.max(amax, axis=0), EPS, FP8_MAX)
    tl.store(s_ptr + row * n_groups + g, scale)
    k0 = 0
    while k0 < GROUP:
        offs, mask, x = _group_chunk(x_ptr, row, stride_x, start, k0, GROUP, K, BLOCK)
        tl.store(q_ptr + row * stride_q + offs, act_codes(x, scale, FP8_MAX), mask=mask)
        k0 += BLOCK


@triton.jit
def _quant_groups_kernel(
    x_ptr, q_ptr, s_ptr, K, n_groups, stride_x, stride_q,
    GROUP: tl.constexpr, GROUPS: tl.constexpr, EPS: tl.constexpr, FP8_MAX: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """``GROUPS`` whole token groups of one row as one ``[GROUPS, GROUP]`` tile (a power-of-two group): one
    read of ``x``, the same math as ``_quant_kernel``."""
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    offs = g[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    mask = (g[:, None] < n_groups) & (offs < K)
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    scale = act_scale(tl.max(tl.abs(x), axis=1), EPS, FP8_MAX)
    tl.store(s_ptr + row * n_groups + g, scale, mask=g < n_groups)
    tl.store(q_ptr + row * stride_q + offs, act_codes(x, scale[:, None], FP8_MAX), mask=mask)


# NOTE: elements a program of _quant_groups_kernel quantizes. One 1-warp program per 128-group (262K of them
# at an 8K x 4,096 chunk) took 148-539 us for Llama-3.1-8B's layers at 8K tokens on the H100, these tiles
# 11-97 us
GROUPS_TILE = 2048
# NOTE: per-token scales up to this K read the row once (one [1, 2^n] tile a program); longer rows loop twice
# over it in _quant_kernel. H100, 8K tokens: o (K 4,096) 44 -> 33 us as a tile; down (K 14,336) 161 -> 181 us
# as a 16K tile of 16 warps, so it keeps the loop -- at prefill sizes (LONG_ROW_TILE_MAX_M)
ROW_TILE_MAX = 8192
# NOTE: up to this many tokens longer rows (K <= LONG_ROW_TILE_MAX_K) take the tile too: the loop's
# 2 x K / 1024 dependent loads a program are its time at decode batches. H100, tile / loop us at 1 / 16 / 256
# / 1,024 / 8,192 tokens: K 14,336 (8B down_proj) 5.8 / 6.0 / 11.1 / 31.4 / 184 vs 11.0 / 11.5 / 13.7 / 32.4 /
# 201; K 28,672 (70B) 8.0 / 8.4 / 21.3 / 67.3 / 459 vs 20.0 / 20.6 / 25.5 / 62.4 / 403
# (benchmarks/tools/fp8_quant_rows.py; results.md, FP8 weights)
LONG_ROW_TILE_MAX_M = 256
LONG_ROW_TILE_MAX_K = 32768


def quant_fp8_groups(x: torch.Tensor, group: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` (unit stride along K) -> ``(xq float8_e4m3fn [M, K], scale float32 [M, groups])``;
    ``group=None``: one scale per token."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"quant_fp8_groups needs a 2-D x with unit column stride, got {tuple(x.shape)}")
    m, k = x.shape
    g = k if group is None else min(group, k)
    n_groups = triton.cdiv(k, g)
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((m, n_groups), dtype=torch.float32, device=x.device)
    if m == 0:
        return q, s
    launch = pdl_launch(x.device)
    tile = k <= ROW_TILE_MAX or (m <= LONG_ROW_TILE_MAX_M and k <= LONG_ROW_TILE_MAX_K)
    if group is None and tile:  # one token a program, read once: a group padded to 2^n
        row = triton.next_power_of_2(k)
        _quant_groups_kernel[(m, 1)](
            x, q, s, k, 1, x.stride(0), q.stride(0), GROUP=row, GROUPS=1, EPS=ACT_EPS, FP8_MAX=E4M3_MAX,
            num_warps=min(16, max(4, row // 1024)), **launch,  # NOTE: warps a power of two (Triton's rule)
        )
        return q, s
    if group is not None and g & (g - 1) == 0:
        groups = max(1, min(GROUPS_TILE // g, triton.next_power_of_2(n_groups)))
        _quant_groups_kernel[(m, triton.cdiv(n_groups, groups))](
            x, q, s, k, n_groups, x.stride(0), q.stride(0), GROUP=g, GROUPS=groups, EPS=ACT_EPS,
            FP8_MAX=E4M3_MAX, num_warps=4, **launch,
        )
        return q, s
    block = min(triton.next_power_of_2(g), 1024)
    _quant_kernel[(m, n_groups)](
        x, q, s, k, g, n_groups, x.stride(0), q.stride(0), BLOCK=block, EPS=ACT_EPS, FP8_MAX=E4M3_MAX,
        num_warps=4 if block >= 512 else 1, **launch,
    )
    return q, s
