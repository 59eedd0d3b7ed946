"""A persistent FP8 GEMM on Hopper's TMA: operands loaded by tensor descriptors (``TensorDescriptor``: bulk
copies, zero-filled past the edges), one to a few programs an SM walking their share of the (output tile,
k-split) units with the k loop flattened across units, so the pipeline keeps loading from one unit into the
next instead of refilling per program as :mod:`.gemm`'s grid of short programs does. The FP8 GEMMs take it
at one token (``tiles.tma_tile``); at 2-256 tokens it measured no faster than the grid GEMM or cuBLASLt.

``C = (A @ B^T) * a_scale[m] * b_scale[n]`` (row-wise: per-token activations, per-channel weights) or
``C = sum_kb (A_kb @ B_kb^T) * a_scale[m, kb] * b_scale[n // 128, kb]`` (128x128 block-scaled weights). Twin:
``fp8.reference.fp8_gemm_ref``. Split-K partials go to an fp32 workspace that :mod:`.splitk` sums.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from nibblekv.kernels._common import interpreting, num_sms
from nibblekv.kernels.fp8.splitk import even_splits, sum_partials
from nibblekv.kernels.fp8.tiles import TmaTile
from nibblekv.kernels.pdl import pdl_enter, pdl_launch

# K per step: one weight block of the block-scaled format, and the row-wise GEMM's promotion interval
K_STEP = 128


@triton.jit
def _unit(
    u, a_desc, b_desc, c_ptr, ws_ptr, as_ptr, bs_ptr, bias_ptr, M, N, grid_m, grid_n, k_steps, stride_cm,
    stride_as, stride_bs, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT: tl.constexpr, PER_SPLIT: tl.constexpr, ROWWISE: tl.constexpr, HAS_BIAS: tl.constexpr,
    SWAP: tl.constexpr,
):  # fmt: skip
    """Unit ``u``: ``PER_SPLIT`` k-steps of one output tile, stored (or its fp32 partial, split-K)."""
    pid_m = u % grid_m
    pid_n = (u // grid_m) % grid_n
    s = u // (grid_m * grid_n)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = offs_m % M
    if SWAP:  # acc^T [BLOCK_N, BLOCK_M]: the weight tile is the MMA's M side (wgmma's 64 rows)
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for i in range(PER_SPLIT):
        kb = s * PER_SPLIT + i
        a = a_desc.load([pid_m * BLOCK_M, kb * BLOCK_K])
        b = b_desc.load([pid_n * BLOCK_N, kb * BLOCK_K])
        if ROWWISE:
            # NOTE: Hopper's FP8 MMAs accumulate in reduced precision: promoted every k-step
            if SWAP:
                acc = tl.dot(b, a.T, acc, max_num_imprecise_acc=BLOCK_K)
            else:
                acc = tl.dot(a, b.T, acc, max_num_imprecise_acc=BLOCK_K)
        else:
            kq = tl.minimum(kb, k_steps - 1)  # a step past K adds zeros: any valid scale
            sa = tl.load(as_ptr + rows * stride_as + kq)
            sb = tl.load(bs_ptr + ((pid_n * BLOCK_N) // BLOCK_K) * stride_bs + kq)
            if SWAP:
                acc += tl.dot(b, a.T) * (sa * sb)[None, :]
            else:
                acc += tl.dot(a, b.T) * (sa * sb)[:, None]
    if SWAP:
        acc = tl.trans(acc)
    if ROWWISE:  # linear in the sum: each partial takes the scales on its own
        cols = offs_n % N
        acc = acc * tl.load(as_ptr + rows * stride_as)[:, None] * tl.load(bs_ptr + cols)[None, :]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if SPLIT > 1:
        ws = ws_ptr + s.to(tl.int64) * M * N + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
        tl.store(ws, acc, mask=mask)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n % N).to(tl.float32)[None, :]
        c = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
        tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _tma_gemm_kernel(
    a_desc, b_desc, c_ptr, ws_ptr, as_ptr, bs_ptr, bias_ptr, M, N, K, stride_cm, stride_as, stride_bs,
    programs,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr,
    PER_SPLIT: tl.constexpr, ROWWISE: tl.constexpr, HAS_BIAS: tl.constexpr, SWAP: tl.constexpr,
    WARP_SPEC: tl.constexpr, INTERP: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    # NOTE: unit u = (split s, n tile, m tile), m fastest: the programs running at once on neighbouring units
    # share each weight tile while it is in L2. Every unit runs the same number of k-steps (splits even,
    # steps past K load zeros), which lets Triton flatten the two loops into one pipeline.
    # PDL (kernels.pdl): released, then waits for the input, at once.
    pdl_enter(PDL)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    k_steps = tl.cdiv(K, BLOCK_K)
    units = grid_m * grid_n * SPLIT
    if INTERP:  # NOTE: the interpreter cannot run `for` over a program id; GPUs need `for` to pipeline
        u = tl.program_id(0)
        while u < units:
            _unit(
                u, a_desc, b_desc, c_ptr, ws_ptr, as_ptr, bs_ptr, bias_ptr, M, N, grid_m, grid_n, k_steps,
                stride_cm, stride_as, stride_bs, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT, PER_SPLIT, ROWWISE,
                HAS_BIAS, SWAP,
            )  # fmt: skip
            u += programs
    else:
        for u in tl.range(tl.program_id(0), units, programs, flatten=True, warp_specialize=WARP_SPEC):
            _unit(
                u, a_desc, b_desc, c_ptr, ws_ptr, as_ptr, bs_ptr, bias_ptr, M, N, grid_m, grid_n, k_steps,
                stride_cm, stride_as, stride_bs, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT, PER_SPLIT, ROWWISE,
                HAS_BIAS, SWAP,
            )  # fmt: skip


@functools.cache
def _sm90(index: int) -> bool:
    return torch.cuda.get_device_capability(index) == (9, 0)


def tma_loads(xq: torch.Tensor, wq: torch.Tensor, block: int | None = None) -> bool:
    """Whether :func:`fp8_tma_gemm` can run on ``xq [M, K]`` and ``wq [N, K]`` with ``block`` (None: row-wise;
    block-scaled: :data:`K_STEP` only): an sm_90 GPU (or the interpreter) and operands TMA can load."""
    gpu = interpreting() or (xq.is_cuda and _sm90(xq.device.index or 0))
    return gpu and block in (None, K_STEP) and _loadable(xq, wq)


def _loadable(xq: torch.Tensor, wq: torch.Tensor) -> bool:
    """Same K, a multiple of 16; unit column strides; rows and bases 16-byte aligned (TMA's bulk copies)."""
    same_k = wq.shape[1] == xq.shape[1] and xq.shape[1] % 16 == 0
    aligned = all(t.stride(1) == 1 and t.stride(0) % 16 == 0 and t.data_ptr() % 16 == 0 for t in (xq, wq))
    return same_k and aligned


def fp8_tma_gemm(
    xq: torch.Tensor, x_scale: torch.Tensor, wq: torch.Tensor, w_scale: torch.Tensor, block: int | None,
    out_dtype: torch.dtype, tile: TmaTile, bias: torch.Tensor | None = None, pdl: bool | None = None,
) -> torch.Tensor:  # fmt: skip
    """``xq [M, K]`` e4m3 and ``wq [N, K]`` e4m3 -> ``[M, N]`` in ``out_dtype``. ``block`` None: per-token
    ``x_scale [M, 1]`` and per-channel ``w_scale`` (``N`` values); 128: ``x_scale [M, K/128]``, ``w_scale
    [N/128, K/128]`` (``block_n`` at most 128); ``bias [N]`` added. Rows 16-byte aligned (TMA): K a multiple
    of 16. ``pdl``: programmatic dependent launch (``kernels.pdl.pdl_launch``; default where available)."""
    m, k = xq.shape
    n = wq.shape[0]
    if not _loadable(xq, wq):
        raise ValueError(f"fp8_tma_gemm: x {tuple(xq.shape)}, w {tuple(wq.shape)} need the same K, a "
                         "multiple of 16, unit column stride and 16-byte aligned rows and bases")  # fmt: skip
    if block not in (None, K_STEP) or (block and tile.block_n > K_STEP):
        raise ValueError(f"fp8_tma_gemm: block None or {K_STEP} (block_n <= {K_STEP}), got {block}")
    out = torch.empty((m, n), dtype=out_dtype, device=xq.device)
    if m == 0:
        return out
    split, per_split = even_splits(triton.cdiv(k, K_STEP), tile.split_k)
    ws = torch.empty((split, m, n), dtype=torch.float32, device=xq.device) if split > 1 else out
    a_desc = TensorDescriptor.from_tensor(xq, [tile.block_m, K_STEP])
    b_desc = TensorDescriptor.from_tensor(wq, [tile.block_n, K_STEP])
    units = triton.cdiv(m, tile.block_m) * triton.cdiv(n, tile.block_n) * split
    programs = min(units, tile.programs_per_sm * num_sms())
    launch = pdl_launch(xq.device, pdl)
    _tma_gemm_kernel[(programs,)](
        a_desc, b_desc, out, ws, x_scale, w_scale, out if bias is None else bias, m, n, k, out.stride(0),
        x_scale.stride(0), 0 if block is None else w_scale.stride(0), programs,
        BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=K_STEP, SPLIT=split, PER_SPLIT=per_split,
        ROWWISE=block is None, HAS_BIAS=bias is not None, SWAP=tile.swap_ab,
        WARP_SPEC=tile.warp_specialize, INTERP=interpreting(),
        num_warps=tile.num_warps, num_stages=tile.num_stages, **launch,
    )  # fmt: skip
    if split > 1:
        sum_partials(ws, out, bias, launch)
    return out
