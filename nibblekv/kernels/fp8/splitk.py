"""Split-K for the FP8 GEMMs: :func:`even_splits` divides the k-steps; each k-split of an output tile stores
an fp32 partial; :func:`splitk_sum_kernel` (launched by :func:`sum_partials`) adds them after the GEMM, in
split order, then the bias.

NOTE: the fix-up inside the GEMM instead (each tile's last split to arrive, by an arrival counter, adds the
partials) was measured slower in the engine's decode step: docs/results.md, What we tried.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nibblekv.kernels.pdl import pdl_enter


@triton.jit
def splitk_sum_kernel(ws_ptr, c_ptr, bias_ptr, M, N, stride_cm, SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr,
                       BLOCK: tl.constexpr, PDL: tl.constexpr = False):  # fmt: skip
    """``c[m, :] = sum_s ws[s, m, :] (+ bias)`` for one row ``m`` and ``BLOCK`` columns."""
    pdl_enter(PDL)
    m = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in tl.static_range(SPLIT):
        acc += tl.load(ws_ptr + (s * M + m) * N + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(c_ptr + m * stride_cm + offs, acc.to(c_ptr.dtype.element_ty), mask=mask)


def even_splits(steps: int, want: int) -> tuple[int, int]:
    """(splits, k-steps a split) for ``steps`` k-steps in at most ``want`` splits, none of them empty."""
    per_split = triton.cdiv(steps, max(1, min(want, steps)))
    return triton.cdiv(steps, per_split), per_split


def sum_partials(
    ws: torch.Tensor, out: torch.Tensor, bias: torch.Tensor | None, launch: dict[str, bool]
) -> None:
    """``out = ws.sum(0) (+ bias)``: fp32 partials ``ws [S, M, N]`` into ``out [M, N]`` by
    :func:`splitk_sum_kernel` (``launch``: the GEMM's PDL launch arguments)."""
    split, m, n = ws.shape
    block = min(1024, triton.next_power_of_2(n))
    splitk_sum_kernel[(m, triton.cdiv(n, block))](
        ws, out, out if bias is None else bias, m, n, out.stride(0), SPLIT=split, HAS_BIAS=bias is not None,
        BLOCK=block, num_warps=4, **launch,
    )  # fmt: skip
