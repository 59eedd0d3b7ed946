"""FP8 linear layers on Hopper: the block-scaled and row-wise FP8 GEMMs (activations quantized by
:mod:`.quant`, or already by the kernel before the layer).

* :func:`fp8_block_gemm`: ``C = sum_kb (A_kb @ B_kb^T) * a_scale[m, kb] * b_scale[n // B, kb]`` for
  128x128 block-scaled weights (DeepSeek / Qwen3 FP8 checkpoints), FP8 tensor cores, FP32 accumulation.
* :func:`fp8_rowwise_gemm`: per-token activations x per-channel weights on the same split-K tiles.
* :func:`fp8_linear_rowwise`: the per-channel layer: the Triton GEMM for decode batches, ``torch._scaled_mm``
  for prefill chunks.
* :func:`fp8_linear_block`: the block-scaled layer: the Triton block GEMM for decode batches, cuBLASLt's
  1x128 x 128x128 block-scaled kernel (:mod:`.scaled_mm`, sm_90) for prefill chunks where it passes its check.

Launch configurations (tile, stages, k-splits, swapped MMA) come from :mod:`.tiles`. Launchers only allocate
and launch (no host sync), so CUDA graphs capture them. Twins: ``fp8.reference``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nibblekv.formats.fp8_weights import QuantizedRows
from nibblekv.kernels._common import interpreting
from nibblekv.kernels.fp8.gemm_tma import fp8_tma_gemm, tma_loads
from nibblekv.kernels.fp8.quant import quant_fp8_groups
from nibblekv.kernels.fp8.scaled_mm import (
    block_scaled_mm_available,
    block_scaled_mm_fits,
    fp8_block_scaled_mm,
)
from nibblekv.kernels.fp8.splitk import even_splits, sum_partials
from nibblekv.kernels.fp8.tiles import GemmTile, TmaTile, gemm_tile, tma_tile
from nibblekv.kernels.pdl import pdl_launch, pdl_release, pdl_wait
from nibblekv.kernels.ptx.mma import _prefetch_l2

# K per step of the row-wise GEMM (no scale groups along K: any width that feeds the tensor cores)
ROWWISE_K_STEP = 128
# NOTE: decode batches up to this many tokens take the Triton GEMM, larger ones cuBLASLt's row-wise kernel
# (``torch._scaled_mm``); up to ROWWISE_TRITON_NARROW_M tokens also layers of at most ROWWISE_TRITON_NARROW_N
# outputs. H100, Llama-3.1-8B's qkv / o / gate_up / down, us, Triton (64x64 tiles, 6 stages) vs cuBLASLt: M=64
# 13.5 / 11.5 / 47.2 / 30.3 vs 16.5 / 14.1 / 48.9 / 38.2; M=128 15.5 / 11.9 / 59.7 / 30.9 vs 15.6 / 14.5 /
# 48.8 / 37.0; M=256 18.8 / 15.6 / 97.9 / 44.3 vs 17.3 / 15.0 / 64.5 / 38.5 (bench_fp8 decode_tiles_us)
ROWWISE_TRITON_MAX_M = 64
ROWWISE_TRITON_NARROW_M = 128
ROWWISE_TRITON_NARROW_N = 8192
# NOTE: block-scaled layers with more tokens than this take cuBLASLt's DeepSeek-style block-scaled kernel
# where torch offers it (sm_90, 128 blocks; fewer than MIN_ROWS rows zero-padded to it). H100, GEMM alone, us,
# Llama-3.1-8B's qkv / o / gate_up / down, the Triton block GEMM (scales loaded a step ahead) vs cuBLASLt
# padded to 256 rows: 128 tokens 18.1 / 13.8 / 66.6 / 38.6 vs 24.3 / 22.9 / 67.0 / 50.2; 192 tokens 27.7 /
# 17.3 / 95.7 / 53.5 vs 24.6 / 23.2 / 67.6 / 51.2 (bench_fp8; o_proj's Triton GEMM stays ahead to 256)
BLOCK_TRITON_MAX_M = 128
# NOTE: 128-byte lines of each weight row a PDL launch of the GEMM prefetches into L2 before it waits for its
# input (the start of the program's k range): the weight stream begins during the previous kernel's tail
PDL_PREFETCH_LINES = 4


@triton.jit
def _block_step(
    acc, kb, K, a_ptrs, b_ptrs, as_ptrs, bs_ptrs, offs_k, GROUP: tl.constexpr, ROWWISE: tl.constexpr, sc=None,
    SWAP: tl.constexpr = False, EVEN_K: tl.constexpr = False,
):  # fmt: skip
    """``acc + (A_kb @ B_kb^T) * (a_scale[:, kb] * b_scale[:, kb])`` for k-block ``kb`` (masked past K), that
    product loaded here or given (``sc``); ROWWISE: ``acc + A_kb @ B_kb^T`` (scales after the k loop). EVEN_K:
    K is whole steps (no masks)."""
    if EVEN_K:
        a = tl.load(a_ptrs + kb * GROUP)
        b = tl.load(b_ptrs + kb * GROUP)
    else:
        k_left = K - kb * GROUP
        a = tl.load(a_ptrs + kb * GROUP, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs + kb * GROUP, mask=offs_k[:, None] < k_left, other=0.0)
    if ROWWISE:
        # NOTE: Hopper's FP8 MMAs accumulate in reduced precision: promote into the fp32 acc every GROUP
        # (as cuBLASLt's row-wise kernels and the block path, whose scaling promotes each step, do). Without
        # it the GEMM is 10-15% faster at 128 tokens (H200, docs/results.md "Where the FP8 GEMMs' time goes")
        if SWAP:  # acc^T [BLOCK_N, BLOCK_M]: the weight tile is the MMA's M side
            acc = tl.dot(tl.trans(b), tl.trans(a), acc, max_num_imprecise_acc=GROUP)
        else:
            acc = tl.dot(a, b, acc, max_num_imprecise_acc=GROUP)
    else:
        if sc is None:
            sc = tl.load(as_ptrs + kb)[:, None] * tl.load(bs_ptrs + kb)[None, :]
        if SWAP:
            acc = acc + tl.dot(tl.trans(b), tl.trans(a)) * tl.trans(sc)
        else:
            acc = acc + tl.dot(a, b) * sc
    return acc


@triton.jit
def _block_scales(as_ptrs, bs_ptr, kb):
    """``a_scale[:, kb] * b_scale[kb]`` as ``[BLOCK_M, 1]``: ``bs_ptr`` points at the scale row of the one
    weight block the tile's columns lie in."""
    return (tl.load(as_ptrs + kb) * tl.load(bs_ptr + kb))[:, None]


@triton.jit
def _ahead_step(
    acc, sc, kb, last, K, a_ptrs, b_ptrs, as_ptrs, bs_tile, offs_k, GROUP: tl.constexpr, SWAP: tl.constexpr,
    EVEN_K: tl.constexpr = False,
):  # fmt: skip
    """k-block ``kb`` of the block-scaled sum on its scale product ``sc``, loaded a step before, and the
    next step's (k-block ``min(kb + 1, last)``: past the split's range a valid one, dropped). NOTE: one
    step ahead; two (a second product held) left Triton's pipeliner unable to stage A / B (no cp.async)."""
    nxt = _block_scales(as_ptrs, bs_tile, tl.minimum(kb + 1, last))
    acc = _block_step(
        acc, kb, K, a_ptrs, b_ptrs, as_ptrs, bs_tile, offs_k, GROUP, False, sc, SWAP, EVEN_K=EVEN_K
    )
    return acc, nxt


@triton.jit
def _prefetch_weights(b_ptr, cols, stride_bn, k0, K, LINES: tl.constexpr):
    """L2 prefetch of ``LINES`` 128-byte lines of each weight row ``cols`` from byte ``k0`` (lines past the
    row's ``K`` bytes skipped). Weights are never written, so this may run before ``pdl_wait``."""
    offs = k0 + 128 * tl.arange(0, LINES)[None, :] + 0 * cols[:, None]
    _prefetch_l2((b_ptr + cols[:, None] * stride_bn + offs).to(tl.int64), offs < K)


@triton.jit
def _block_gemm_kernel(
    a_ptr, b_ptr, c_ptr, ws_ptr, as_ptr, bs_ptr, bias_ptr, M, N, K, n_kblocks, kb_per_split,
    stride_am, stride_bn, stride_cm, stride_as, stride_bs,
    HAS_BIAS: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    GROUP_M: tl.constexpr, PARTIAL: tl.constexpr, ROWWISE: tl.constexpr, INTERP: tl.constexpr,
    PDL: tl.constexpr = False, PF_LINES: tl.constexpr = PDL_PREFETCH_LINES,
    SCALE_AHEAD: tl.constexpr = True, SWAP: tl.constexpr = False, EVEN_K: tl.constexpr = False,
):  # fmt: skip
    # NOTE: BLOCK_K == GROUP: each k-step has one activation scale per row and one weight scale per column.
    # SCALE_AHEAD (block-scaled, BLOCK_N <= GROUP): each k-step's scale product is loaded the step before
    # (held in registers); else by the step itself, whose scaling then waits on a global load.
    # ROWWISE: as_ptr holds one scale per row, bs_ptr one per column (per-channel weights), for all of K.
    # PARTIAL (split-K): program (tile, s) sums k-blocks [s * kb_per_split, ...) into fp32 ws[s]; a second
    # kernel adds them (splitk). Decode batches need split-K: a few output tiles cannot keep every SM reading
    # weights.
    # PDL (kernels.pdl): released at once; the first weight lines prefetched into L2 before the input's wait.
    pdl_release(PDL)
    pid = tl.program_id(0)
    kb_lo = tl.program_id(1) * kb_per_split
    kb_hi = tl.minimum(kb_lo + kb_per_split, n_kblocks)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    width = GROUP_M * grid_n  # swizzle: GROUP_M row tiles share each weight tile while it is in L2
    first_m = (pid // width) * GROUP_M
    size_m = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % size_m
    pid_n = (pid % width) // size_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = (offs_m % M).to(tl.int64)  # out-of-range rows/columns read valid memory; their results are dropped
    cols = (offs_n % N).to(tl.int64)
    if PDL:
        _prefetch_weights(b_ptr, cols, stride_bn, kb_lo * GROUP, K, PF_LINES)
    pdl_wait(PDL)
    offs_k = tl.arange(0, GROUP)
    a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + cols[None, :] * stride_bn + offs_k[:, None]
    as_ptrs = as_ptr + rows * stride_as
    if ROWWISE:
        bs_ptrs = bs_ptr + cols
    else:
        bs_ptrs = bs_ptr + (cols // GROUP) * stride_bs
    if SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # NOTE: scales ahead only for tiles inside one weight block (BLOCK_N divides GROUP: one weight scale a
    # k-step); a [BLOCK_M, BLOCK_N] product held a step spills (64x256 tiles: 690 bytes)
    ahead: tl.constexpr = SCALE_AHEAD and not ROWWISE and BLOCK_N <= GROUP
    bs_tile = bs_ptr + ((pid_n * BLOCK_N) // GROUP) * stride_bs
    last = n_kblocks - 1
    if ahead:
        sc = _block_scales(as_ptrs, bs_tile, kb_lo)
        if INTERP:  # NOTE: the interpreter cannot run `for` over runtime bounds; GPUs need `for` to pipeline
            kb = kb_lo
            while kb < kb_hi:
                acc, sc = _ahead_step(
                    acc, sc, kb, last, K, a_ptrs, b_ptrs, as_ptrs, bs_tile, offs_k, GROUP, SWAP, EVEN_K
                )
                kb += 1
        else:
            for kb in range(kb_lo, kb_hi):
                acc, sc = _ahead_step(
                    acc, sc, kb, last, K, a_ptrs, b_ptrs, as_ptrs, bs_tile, offs_k, GROUP, SWAP, EVEN_K
                )
    elif INTERP:
        kb = kb_lo
        while kb < kb_hi:
            acc = _block_step(
                acc, kb, K, a_ptrs, b_ptrs, as_ptrs, bs_ptrs, offs_k, GROUP, ROWWISE, None, SWAP,
                EVEN_K=EVEN_K,
            )
            kb += 1
    else:
        for kb in range(kb_lo, kb_hi):
            acc = _block_step(
                acc, kb, K, a_ptrs, b_ptrs, as_ptrs, bs_ptrs, offs_k, GROUP, ROWWISE, None, SWAP,
                EVEN_K=EVEN_K,
            )
    if SWAP:
        acc = tl.trans(acc)
    if ROWWISE:  # linear in the sum: each split-K partial may take the scales on its own
        acc = acc * tl.load(as_ptrs)[:, None] * tl.load(bs_ptrs)[None, :]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if PARTIAL:
        split_base = ws_ptr + tl.program_id(1).to(tl.int64) * M * N
        ws_ptrs = split_base + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
        tl.store(ws_ptrs, acc, mask=mask)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols).to(tl.float32)[None, :]
        c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


def _launch_gemm(
    xq: torch.Tensor, x_scale: torch.Tensor, wq: torch.Tensor, w_scale: torch.Tensor, group: int,
    out_dtype: torch.dtype, bias: torch.Tensor | None, tile: GemmTile | TmaTile | None, rowwise: bool,
    pdl: bool | None = None,
) -> torch.Tensor:  # fmt: skip
    """Allocate ``[M, N]`` and run :func:`_block_gemm_kernel` (+ ``splitk_sum_kernel`` with k-splits), or the
    TMA GEMM (``gemm_tma``) for a :class:`TmaTile` given or by default (:func:`tma_tile`) where TMA can load
    the operands; shapes already checked. ``pdl``: programmatic dependent launch (``kernels.pdl.pdl_launch``;
    default where available)."""
    m, k = xq.shape
    n = wq.shape[0]
    kb = triton.cdiv(k, group)
    block = None if rowwise else group
    tma = tile if isinstance(tile, TmaTile) else None
    if tile is None:
        tma = tma_tile(m, n, kb, not rowwise)
        tma = tma if tma is not None and tma_loads(xq, wq, block) else None
    if tma is not None:
        return fp8_tma_gemm(xq, x_scale, wq, w_scale, block, out_dtype, tma, bias, pdl)
    out = torch.empty((m, n), dtype=out_dtype, device=xq.device)
    if m == 0:
        return out
    t = tile or gemm_tile(m, n, kb, not rowwise)
    split, per_split = even_splits(kb, t.split_k)
    ws = torch.empty((split, m, n), dtype=torch.float32, device=xq.device) if split > 1 else out
    launch = pdl_launch(xq.device, pdl)
    grid = (triton.cdiv(m, t.block_m) * triton.cdiv(n, t.block_n), split)
    _block_gemm_kernel[grid](
        xq, wq, out, ws, x_scale, w_scale, bias if bias is not None else out, m, n, k, kb, per_split,
        xq.stride(0), wq.stride(0), out.stride(0), x_scale.stride(0), 0 if rowwise else w_scale.stride(0),
        HAS_BIAS=bias is not None, GROUP=group, BLOCK_M=t.block_m, BLOCK_N=t.block_n, GROUP_M=8,
        PARTIAL=split > 1, ROWWISE=rowwise, INTERP=interpreting(), SCALE_AHEAD=t.scale_ahead, SWAP=t.swap_ab,
        EVEN_K=k % group == 0,
        num_warps=t.num_warps, num_stages=t.num_stages, **launch,
    )  # fmt: skip
    if split > 1:
        sum_partials(ws, out, bias, launch)
    return out


def _check_operands(name: str, xq: torch.Tensor, wq: torch.Tensor) -> None:
    if xq.dim() != 2 or wq.dim() != 2 or wq.shape[1] != xq.shape[1] or xq.stride(1) != 1 or wq.stride(1) != 1:
        raise ValueError(
            f"{name}: x {tuple(xq.shape)}, w {tuple(wq.shape)} need the same K, unit column stride"
        )


def fp8_block_gemm(
    xq: torch.Tensor,
    x_scale: torch.Tensor,
    wq: torch.Tensor,
    w_scale: torch.Tensor,
    block: int,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
    tile: GemmTile | TmaTile | None = None,
) -> torch.Tensor:
    """``xq [M, K]`` e4m3 with ``x_scale [M, ceil(K/B)]``, ``wq [N, K]`` e4m3 with ``w_scale [ceil(N/B),
    ceil(K/B)]`` (``B = block``) -> ``[M, N]`` in ``out_dtype`` (twin: ``fp8_gemm_ref``). ``tile``: this
    launch config instead of :func:`gemm_tile`'s."""
    _check_operands("fp8_block_gemm", xq, wq)
    m, k = xq.shape
    n = wq.shape[0]
    kb = triton.cdiv(k, block)
    if tuple(x_scale.shape) != (m, kb) or tuple(w_scale.shape) != (triton.cdiv(n, block), kb):
        raise ValueError(
            f"fp8_block_gemm: scales {tuple(x_scale.shape)} / {tuple(w_scale.shape)} do not fit "
            f"x {tuple(xq.shape)}, w {tuple(wq.shape)} with block {block}"
        )
    if x_scale.stride(1) != 1 or w_scale.stride(1) != 1 or block not in (32, 64, 128, 256):
        raise ValueError(
            f"fp8_block_gemm: scales need unit column stride and block in 32/64/128/256, got {block}"
        )
    return _launch_gemm(xq, x_scale, wq, w_scale, block, out_dtype, bias, tile, rowwise=False)


def fp8_rowwise_gemm(
    xq: torch.Tensor,
    x_scale: torch.Tensor,
    wq: torch.Tensor,
    w_scale: torch.Tensor,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
    tile: GemmTile | TmaTile | None = None,
) -> torch.Tensor:
    """``xq [M, K]`` e4m3 with per-token ``x_scale [M, 1]``, ``wq [N, K]`` e4m3 with per-channel ``w_scale``
    (``N`` values, contiguous) -> ``[M, N]`` in ``out_dtype`` (twin: ``fp8_gemm_ref`` with ``block=None``):
    the block GEMM's split-K tiles, scales applied once after the k loop."""
    _check_operands("fp8_rowwise_gemm", xq, wq)
    m, n = xq.shape[0], wq.shape[0]
    if tuple(x_scale.shape) != (m, 1) or w_scale.numel() != n or not w_scale.is_contiguous():
        raise ValueError(
            f"fp8_rowwise_gemm: scales {tuple(x_scale.shape)} / {tuple(w_scale.shape)} do not fit "
            f"x {tuple(xq.shape)}, w {tuple(wq.shape)} (per token [M, 1], per channel [N])"
        )
    return _launch_gemm(xq, x_scale, wq, w_scale, ROWWISE_K_STEP, out_dtype, bias, tile, rowwise=True)


def fp8_linear_block(
    x: torch.Tensor | QuantizedRows, wq: torch.Tensor, w_scale: torch.Tensor, block: int,
    bias: torch.Tensor | None,
) -> torch.Tensor:  # fmt: skip
    """Block-scaled FP8 linear on ``x [..., K]`` (or rows already quantized per ``block`` columns):
    per token-group activation quantization + the GEMM. More than :data:`BLOCK_TRITON_MAX_M` tokens (bf16,
    128 blocks, N whole blocks, K whole fours of blocks) run cuBLASLt's block-scaled kernel where
    :func:`block_scaled_mm_available`; everything else the Triton block GEMM."""
    n, k = wq.shape
    xq, xs, dtype, lead = _quantized(x, block)
    cublas = (
        xq.is_cuda and xq.shape[0] > BLOCK_TRITON_MAX_M and dtype == torch.bfloat16 and block == 128
        and block_scaled_mm_fits(n, k) and block_scaled_mm_available(xq.device)
    )  # fmt: skip
    if cublas:
        y = fp8_block_scaled_mm(xq, xs, wq, w_scale, dtype)
        y = y if bias is None else y + bias
    else:
        y = fp8_block_gemm(xq, xs, wq, w_scale, block, dtype, bias)
    return y.reshape(*lead, n)


def fp8_linear_rowwise(
    x: torch.Tensor | QuantizedRows, wq: torch.Tensor, w_scale_row: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """Per-channel FP8 linear on ``x [..., K]`` (or rows already quantized per row): per-token activation
    scales times ``w_scale_row [1, N]``. More than :data:`ROWWISE_TRITON_MAX_M` tokens (than
    :data:`ROWWISE_TRITON_NARROW_M` for at most :data:`ROWWISE_TRITON_NARROW_N` outputs), bf16, K and N
    multiples of 16 run cuBLASLt's row-wise scaled FP8 GEMM (``torch._scaled_mm``); everything else the
    Triton GEMM."""
    n, k = wq.shape
    xq, xs, dtype, lead = _quantized(x, None)  # NOTE: zero rows pass through both GEMMs' launchers as such
    m = xq.shape[0]
    cublas = (
        xq.is_cuda and m > rowwise_triton_max_m(n) and dtype == torch.bfloat16 and n % 16 == k % 16 == 0
    )
    if cublas:
        y = torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=w_scale_row, out_dtype=dtype)
        y = y if bias is None else y + bias
    else:
        y = fp8_rowwise_gemm(xq, xs, wq, w_scale_row.reshape(-1), dtype, bias)
    return y.reshape(*lead, n)


def rowwise_triton_max_m(n: int) -> int:
    """The most tokens :func:`fp8_linear_rowwise` runs on the Triton GEMM for ``n`` outputs (CUDA)."""
    return ROWWISE_TRITON_NARROW_M if n <= ROWWISE_TRITON_NARROW_N else ROWWISE_TRITON_MAX_M


def _quantized(
    x: torch.Tensor | QuantizedRows, group: int | None
) -> tuple[torch.Tensor, torch.Tensor, torch.dtype, tuple[int, ...]]:
    """(codes [M, K], scales, activation dtype, leading shape) of ``x``: quantized here, or as it came."""
    if isinstance(x, QuantizedRows):
        if x.group != group:
            raise ValueError(f"FP8 layer quantizes activations per {group or 'row'}, the rows came per "
                             f"{x.group or 'row'}")  # fmt: skip
        return x.q, x.scale, x.dtype, tuple(x.q.shape[:-1])
    xq, xs = quant_fp8_groups(x.reshape(-1, x.shape[-1]), group)
    return xq, xs, x.dtype, tuple(x.shape[:-1])
