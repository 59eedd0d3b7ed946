"""What the fused row kernels share: their inputs' checks (a ``[T, W]`` tensor, or an FP8 GEMM's unsummed
split-K :class:`PartialSums`), the load that adds those partials (``_load_out``) and the roundings to the
activation dtype (``_round``; the interpreter's bf16 rounding redone with integer ops, see ``elementwise``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from nibblekv.formats.fp8_weights import PartialSums
from nibblekv.kernels._common import interpreting

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def _bf16_rtne(x):
    """float32 -> bfloat16, round to nearest even with integer ops (NaN -> 0x7FC0, as torch)."""
    b = x.to(tl.uint32, bitcast=True)
    r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    r = tl.where((b & 0x7FFFFFFF) > 0x7F800000, 0x7FC0, r)  # NaN
    return r.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _round(x, like_ptr, BF16_BITS: tl.constexpr):
    """float32 ``x`` rounded to the element type of ``like_ptr`` (nearest even)."""
    if BF16_BITS:
        y = _bf16_rtne(x)
    else:
        y = x.to(like_ptr.dtype.element_ty)
    return y


@triton.jit
def _load_out(x_ptr, b_ptr, dt_ptr, row, cols, mask, stride_x, n_rows, SPLIT: tl.constexpr,
              HAS_BIAS: tl.constexpr):  # fmt: skip
    """Columns ``cols`` (any shape) of row ``row`` of a layer's output: loaded (``SPLIT == 0``, x's dtype),
    or the sum of a split-K GEMM's ``SPLIT`` fp32 partials ``x[s, row, cols]`` (``n_rows`` rows of
    ``stride_x`` a split) + ``b[cols]``, rounded to ``dt_ptr``'s dtype: ``splitk_sum_kernel``'s math, bit for
    bit."""
    if SPLIT == 0:
        return tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    acc = tl.zeros_like(cols).to(tl.float32)
    for s in tl.static_range(SPLIT):
        acc += tl.load(x_ptr + (s * n_rows + row) * stride_x + cols, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    return acc.to(dt_ptr.dtype.element_ty)


class _Rows(NamedTuple):
    """A fused kernel's input rows: a ``[T, W]`` tensor, or a split-K GEMM's unsummed partials (``split`` of
    them, ``bias`` added after)."""

    src: torch.Tensor  # [T, W] rows, or the partials [S, T, W] (contiguous fp32)
    split: int  # 0: src is the rows
    bias: torch.Tensor | None
    dtype: torch.dtype  # the rows' dtype (the partials' output dtype)
    rows: int
    width: int

    @property
    def row_stride(self) -> int:
        return self.src.stride(-2)


def _rows(x: torch.Tensor | PartialSums, name: str) -> _Rows:
    """``x`` checked as a fused kernel's ``[T, W]`` input (a tensor, or a GEMM's :class:`PartialSums`)."""
    if isinstance(x, PartialSums):
        p = x.parts
        if p.dim() != 3 or not p.is_contiguous() or p.dtype != torch.float32 or x.dtype not in _FLOATS:
            raise ValueError(f"{name}: partial sums must be contiguous float32 [S, T, W] of a float dtype, "
                             f"got {tuple(p.shape)} {p.dtype} -> {x.dtype}")  # fmt: skip
        b = x.bias
        if b is not None and (b.shape != (p.shape[2],) or not b.is_contiguous()):
            raise ValueError(f"{name}: bias must be contiguous [{p.shape[2]}], got {tuple(b.shape)}")
        return _Rows(p, p.shape[0], b, x.dtype, p.shape[1], p.shape[2])
    _check_rows(x, name)
    return _Rows(x, 0, None, x.dtype, x.shape[0], x.shape[1])


def _bf16_bits(dtype: torch.dtype) -> bool:
    """Whether kernels must round to bf16 with integer ops (the interpreter truncates)."""
    return dtype == torch.bfloat16 and interpreting()


def _check_rows(t: torch.Tensor, name: str) -> None:
    if t.dim() != 2 or t.stride(-1) != 1:
        raise ValueError(f"{name} must be 2-D [T, width] with unit last stride, got shape {tuple(t.shape)}")
    if t.dtype not in _FLOATS:
        raise ValueError(f"{name} must be float32, bfloat16 or float16, got {t.dtype}")
