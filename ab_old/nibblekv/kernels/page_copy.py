"""Gather / scatter whole pages of one layer's segments (K, V data; NVFP4 K, V scales) through one row.

The host tier moves a page of a layer as ONE row of ``sum(widths)`` bytes: the segments side by side.
Why: with a tensor per (layer, segment), a transfer of N pages in R runs of host slots cost
``layers * segments * (R + 1)`` copy and index calls -- twice FP8's for NVFP4 (scales are separate
tensors), and with fragmented host slots R ~ N, so the host spent milliseconds issuing copies per
transfer. With a staging row per page it is ``layers * (R + 1)`` for every dtype: one launch here,
one copy per run.

``gather_pages(segs, idx, out)``: ``out[i] = concat(seg[idx[i]] for seg in segs)``.
``scatter_pages(src, segs, idx)``: the inverse. ``segs`` are ``uint8 [pages, width_s]`` views (a page a
row; 1 to 4 of them), ``idx`` int64 ``[N]`` page ids, ``out/src`` uint8 ``[N, sum width_s]``.
``*_ref`` are the pure-torch twins (CPU).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

_MAX_SEGS = 4


def gather_pages_ref(segs: Sequence[torch.Tensor], idx: torch.Tensor, out: torch.Tensor) -> None:
    col = 0
    for seg in segs:
        out[:, col : col + seg.shape[1]] = seg.index_select(0, idx)
        col += seg.shape[1]


def scatter_pages_ref(src: torch.Tensor, segs: Sequence[torch.Tensor], idx: torch.Tensor) -> None:
    col = 0
    for seg in segs:
        seg.index_copy_(0, idx, src[:, col : col + seg.shape[1]])
        col += seg.shape[1]


@triton.jit
def _copy_segment(row_ptr, seg_ptr, page, s_seg, W: tl.constexpr, BLOCK: tl.constexpr, TO_ROW: tl.constexpr):
    """Bytes ``[0, W)`` of page ``page`` of one segment <-> ``row_ptr[0:W]``."""
    base = seg_ptr + page * s_seg
    for c0 in range(0, W, BLOCK):
        offs = c0 + tl.arange(0, BLOCK)
        m = offs < W
        if TO_ROW:
            tl.store(row_ptr + offs, tl.load(base + offs, mask=m), mask=m)
        else:
            tl.store(base + offs, tl.load(row_ptr + offs, mask=m), mask=m)


@triton.jit
def _page_copy_kernel(rows_ptr, idx_ptr, p0, p1, p2, p3, s0, s1, s2, s3,
                      W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr, W3: tl.constexpr,
                      BLOCK: tl.constexpr, TO_ROW: tl.constexpr):  # fmt: skip
    """Program ``(i, s)``: segment ``s`` of page ``idx[i]`` <-> its columns of staging row ``i``."""
    i = tl.program_id(0)
    s = tl.program_id(1)
    page = tl.load(idx_ptr + i)
    row = rows_ptr + i.to(tl.int64) * (W0 + W1 + W2 + W3)
    if s == 0:
        _copy_segment(row, p0, page, s0, W0, BLOCK, TO_ROW)
    elif s == 1:
        _copy_segment(row + W0, p1, page, s1, W1, BLOCK, TO_ROW)
    elif s == 2:
        _copy_segment(row + W0 + W1, p2, page, s2, W2, BLOCK, TO_ROW)
    else:
        _copy_segment(row + W0 + W1 + W2, p3, page, s3, W3, BLOCK, TO_ROW)


def _launch(rows: torch.Tensor, segs: Sequence[torch.Tensor], idx: torch.Tensor, to_row: bool) -> None:
    if not 1 <= len(segs) <= _MAX_SEGS:
        raise ValueError(f"1 to {_MAX_SEGS} segments, got {len(segs)}")
    widths = [int(s.shape[1]) for s in segs]
    for s in segs:
        if s.dim() != 2 or s.dtype != torch.uint8 or s.stride(1) != 1 or s.device != rows.device:
            raise ValueError("segments must be uint8 [pages, width] with unit last stride, on the rows' device")
    if idx.dim() != 1 or idx.dtype != torch.int64 or idx.device != rows.device:
        raise ValueError("idx must be int64 [N] on the rows' device")
    if rows.dtype != torch.uint8 or not rows.is_contiguous() or tuple(rows.shape) != (idx.numel(), sum(widths)):
        raise ValueError(f"rows must be contiguous uint8 [{idx.numel()}, {sum(widths)}]")
    if idx.numel() == 0:
        return
    ptrs = list(segs) + [segs[0]] * (_MAX_SEGS - len(segs))  # unused slots: never read (width 0)
    strides = [int(s.stride(0)) for s in ptrs]
    w = widths + [0] * (_MAX_SEGS - len(segs))
    _page_copy_kernel[(idx.numel(), len(segs))](
        rows, idx, *ptrs, *strides, W0=w[0], W1=w[1], W2=w[2], W3=w[3],
        BLOCK=min(4096, triton.next_power_of_2(max(widths))), TO_ROW=to_row, num_warps=4,
    )  # fmt: skip


def gather_pages_triton(segs: Sequence[torch.Tensor], idx: torch.Tensor, out: torch.Tensor) -> None:
    """Triton twin of :func:`gather_pages_ref`."""
    _launch(out, segs, idx, True)


def scatter_pages_triton(src: torch.Tensor, segs: Sequence[torch.Tensor], idx: torch.Tensor) -> None:
    """Triton twin of :func:`scatter_pages_ref`."""
    _launch(src, segs, idx, False)


__all__ = ["gather_pages_ref", "gather_pages_triton", "scatter_pages_ref", "scatter_pages_triton"]
