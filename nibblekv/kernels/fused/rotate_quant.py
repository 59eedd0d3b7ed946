"""The attention output back into o_proj's basis and quantized for its FP8 GEMM, in one launch.

A cache that stores K/V rotated by a Hadamard matrix ``R`` along head_dim (nvfp4's default) attends in the
rotated basis; the output goes back by ``o @ R`` per head (``R`` is its own inverse). A bf16 o_proj absorbs
``R`` into its weight; an FP8 one cannot without requantizing, so the eager path runs a batched matmul and
then the activation quantization (two launches a layer). This kernel does both: per ``BM`` tokens and one
token group, each head's ``o_h @ R`` (fp32 sums, rounded to the activation dtype as the matmul's output is),
their amax, then the e4m3 codes of the same products recomputed under the group's scale. Twin:
``reference.rotate_quant_fp8_ref``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nibblekv.formats.fp8_weights import ACT_EPS, QuantizedRows
from nibblekv.formats.nvfp4 import E4M3_MAX
from nibblekv.kernels._common import interpreting
from nibblekv.kernels.fp8.quant import act_codes, act_scale
from nibblekv.kernels.fused.elementwise import _bf16_rtne

BLOCK_M = 16  # tokens a program (tl.dot's smallest M)
# NOTE: a program loops over its group's heads twice (amax, then codes): fine for block-scaled layers
# (128-column groups: one or two heads), but a per-token group of an 8B model (32 heads) would serialize 64
# head products per 16 tokens in one program. Untimed: those keep the matmul + quantization; a two-phase
# kernel for them (heads in parallel, the row's amax across programs) waits for the device to time both.
MAX_HEADS_PER_GROUP = 4


@triton.jit
def _rotated_head(x_ptr, r, rows, stride_x, col0, M, D: tl.constexpr, INTERP: tl.constexpr):
    """Tokens ``rows`` of head columns ``[col0, col0 + D)`` times ``r`` -> fp32 ``[BM, D]``, rounded to
    bf16."""
    offs_d = tl.arange(0, D)
    ptrs = x_ptr + rows[:, None] * stride_x + col0 + offs_d[None, :]
    x = tl.load(ptrs, mask=(rows < M)[:, None], other=0.0)
    if INTERP:  # NOTE: the interpreter's bf16 tl.dot is wrong, and its bf16 cast truncates
        y = tl.dot(x.to(tl.float32), r.to(tl.float32))
        return _bf16_rtne(y).to(tl.float32)
    y = tl.dot(x, r)
    return y.to(tl.bfloat16).to(tl.float32)


@triton.jit
def _rotate_quant_kernel(
    x_ptr, r_ptr, q_ptr, s_ptr, M, stride_x, stride_q, n_groups,
    D: tl.constexpr, HEADS_PER_GROUP: tl.constexpr, BM: tl.constexpr, EPS: tl.constexpr,
    FP8_MAX: tl.constexpr, INTERP: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    g = tl.program_id(1)
    offs_d = tl.arange(0, D)
    r = tl.load(r_ptr + offs_d[:, None] * D + offs_d[None, :])
    amax = tl.zeros([BM], dtype=tl.float32)
    for h in range(HEADS_PER_GROUP):
        y = _rotated_head(x_ptr, r, rows, stride_x, (g * HEADS_PER_GROUP + h) * D, M, D, INTERP)
        amax = tl.maximum(amax, tl.max(tl.abs(y), axis=1))
    scale = act_scale(amax, EPS, FP8_MAX)
    tl.store(s_ptr + rows * n_groups + g, scale, mask=rows < M)
    for h in range(HEADS_PER_GROUP):
        col0 = (g * HEADS_PER_GROUP + h) * D
        y = _rotated_head(x_ptr, r, rows, stride_x, col0, M, D, INTERP)
        codes = act_codes(y, scale[:, None], FP8_MAX)
        q_ptrs = q_ptr + rows[:, None] * stride_q + col0 + offs_d[None, :]
        tl.store(q_ptrs, codes, mask=(rows < M)[:, None])


def rotate_quant_supported(x: torch.Tensor, rotation: torch.Tensor, group: int | None) -> bool:
    """Whether :func:`rotate_quant_fp8` takes these: bf16 ``x [M, H * D]`` with dense rows, a bf16
    ``rotation [D, D]`` (D a power of two >= 16), token groups of whole heads (a multiple of D, or a row), at
    most ``MAX_HEADS_PER_GROUP`` heads a group."""
    d = rotation.shape[0]
    k = x.shape[-1] if x.dim() == 2 else 0
    width = k if group is None else group
    return (
        x.dim() == 2 and x.dtype == torch.bfloat16 and x.stride(1) == 1 and rotation.dtype == torch.bfloat16
        and rotation.shape == (d, d) and rotation.is_contiguous() and d >= 16 and d & (d - 1) == 0
        and k % d == 0 and width % d == 0 and k % width == 0 and width // d <= MAX_HEADS_PER_GROUP
    )  # fmt: skip


def rotate_quant_fp8(x: torch.Tensor, rotation: torch.Tensor, group: int | None) -> QuantizedRows:
    """``x [M, H * D]`` (bf16; head ``h`` in columns ``[h * D, (h + 1) * D)``) -> every head times
    ``rotation [D, D]``, quantized for an FP8 layer: per token (``group=None``) or per ``group`` columns, as
    ``quant_fp8_groups(bf16(x_h @ rotation), group)`` (``reference.rotate_quant_fp8_ref``)."""
    if not rotate_quant_supported(x, rotation, group):
        raise ValueError(
            f"rotate_quant_fp8: x {tuple(x.shape)} {x.dtype}, rotation {tuple(rotation.shape)} "
            f"{rotation.dtype}, group {group}: want bf16 [M, H * D] with dense rows, a bf16 [D, D] rotation "
            f"and whole heads a group (at most {MAX_HEADS_PER_GROUP})"
        )
    m, k = x.shape
    d = rotation.shape[0]
    width = k if group is None else group
    n_groups = k // width
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.full((m, n_groups), float("nan"), dtype=torch.float32, device=x.device)
    if m:
        _rotate_quant_kernel[(triton.cdiv(m, BLOCK_M), n_groups)](
            x, rotation, q, s, m, x.stride(0), q.stride(0), n_groups,
            D=d, HEADS_PER_GROUP=width // d, BM=BLOCK_M, EPS=ACT_EPS, FP8_MAX=E4M3_MAX, INTERP=interpreting(),
            num_warps=4,
        )  # fmt: skip
    return QuantizedRows(q, s, group, x.dtype)
