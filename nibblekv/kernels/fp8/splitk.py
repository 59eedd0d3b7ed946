"""Split-K for the FP8 GEMMs: each k-split of an output tile stores an fp32 partial; they are added by
:func:`splitk_sum_kernel` after the GEMM (the default) or by the tile's last split to finish
(:func:`add_splits`, an arrival counter per tile in :func:`split_counters`; ``GemmTile.fused_sum``, an
experiment). Both add the partials in split order, then the bias: the same bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nibblekv.kernels.pdl import pdl_enter

# Split-K arrival counters: one int32 per output tile, zero between launches (a tile's last split re-arms it).
# NOTE: one buffer a device, shared by every fused split-K launch: those run one after another on the
# engine's stream (a PDL launch touches counters only after it waited for the kernel before it)
SPLIT_COUNTERS = 1 << 16
_COUNTERS: dict[torch.device, torch.Tensor] = {}


def split_counters(device: torch.device, tiles: int) -> torch.Tensor | None:
    """The device's zeroed split-K counters, or None (the sum kernel then adds the splits): more output
    tiles than :data:`SPLIT_COUNTERS`, or not yet allocated while a CUDA graph is being captured."""
    if tiles > SPLIT_COUNTERS:
        return None
    buf = _COUNTERS.get(device)
    if buf is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        buf = _COUNTERS[device] = torch.zeros(SPLIT_COUNTERS, dtype=torch.int32, device=device)
    return buf


@triton.jit
def _fence_acq_rel_gpu():
    """``fence.acq_rel.gpu``: this lane's earlier stores ordered before its later accesses, GPU-wide."""
    return tl.inline_asm_elementwise(
        "fence.acq_rel.gpu; mov.b32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def add_splits(
    ws_ptr, c_ptr, bias_ptr, cnt_ptr, tile, M, N, stride_cm, offs_m, offs_n, cols, mask,
    SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    INTERP: tl.constexpr,
):  # fmt: skip
    """Split-K fix-up of output tile ``tile`` (of ``SPLIT`` splits), after this program stored its partial:
    the tile's last split to arrive (counter ``cnt_ptr[tile]``) adds every split's partial in split order,
    then the bias -- the sums of ``splitk_sum_kernel``, bit for bit -- writes C and re-arms the counter to 0
    for the next launch. NOTE: the partials' loads are unrolled (``SPLIT`` a constexpr) so that they are in
    flight together: a loop over a runtime count waited for each from L2 in turn."""
    if not INTERP:
        _fence_acq_rel_gpu()  # NOTE: every lane's partial is visible GPU-wide before the arrival is counted
    tl.debug_barrier()
    arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
    if arrived == SPLIT - 1:
        offs = offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for s in tl.static_range(SPLIT):  # NOTE: L2 reads (.cg): other programs wrote these partials
            part = ws_ptr + tl.cast(M, tl.int64) * N * s + offs  # NOTE: M == 1 arrives as a Python int
            total += tl.load(part, mask=mask, other=0.0, cache_modifier=".cg")
        if HAS_BIAS:
            total += tl.load(bias_ptr + cols).to(tl.float32)[None, :]
        c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
        tl.store(c_ptrs, total.to(c_ptr.dtype.element_ty), mask=mask)
        tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")


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
