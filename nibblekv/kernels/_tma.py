"""Bulk-copy staging of ``decode_mma``'s 16-token tiles through shared memory (variant option ``tma``).

Why: the register path (``_load_tile``) makes each warp wait a full DRAM round trip per softmax step --
under the 128-register cap ptxas sinks the next step's loads below the math (an H200 profile: long
scoreboard stalls the largest share, 61% of issue slots busy). Here lane 0 of the (one-warp) program hands
whole tiles to the copy engine (``cp.async.bulk``, one instruction per contiguous run: a tile's K and V
bytes are 1 KiB each, its scale bytes 128 each, when pages hold a multiple of 16 rows), ``NS`` tiles ahead,
each stage completing on an ``mbarrier``; the lanes then read their fragments from shared memory. No
registers are held for bytes in flight.

Stage ``s`` of the program's ring (``NS`` stages of ``STAGE_BYTES``): K rows ``[0, 1024)`` (64 bytes a
row), V rows ``[1024, 2048)``, K scale rows ``[2048, 2176)`` (8 bytes a row), V scale rows ``[2176, 2304)``.
Each fragment read returns exactly what ``_mma_tile._load_tile`` returns for the same tile.

The shared memory is declared in PTX (``nkv_tma``, ``nkv_tbar``: one declaration per kernel, emitted by
``tma_init``'s single call site). Under the interpreter the twins copy through ``scratch`` (global memory, the
same offsets per program), so CPU tests run the ring's indexing; the copy engine itself only on a GPU.
One warp per program (head_dim 128 rows of 64 bytes, i.e. ``D`` = 128 or PAIR), sm_90+.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nibblekv.kernels._common import interpreting, scale_tensors
from nibblekv.kernels.types import LayerKV

STAGE_BYTES = 2304  # 16 rows x (64 K + 64 V + 8 K-scale + 8 V-scale bytes)
TMA_STAGES = (2, 3, 4, 5)  # NOTE: 16 programs per SM x 5 stages x 2.3 KB = 184 KB of the H200's 227


def _decl_ptx(ns: int) -> str:
    return (
        f".shared .align 128 .b8 nkv_tma[{ns * STAGE_BYTES}]; .shared .align 8 .b64 nkv_tbar[{ns}];"
        " { .reg .pred p; .reg .u32 a; setp.eq.u32 p, $1, 0; mov.u32 a, nkv_tbar;"
        + "".join(f" @p mbarrier.init.shared::cta.b64 [a+{8 * i}], 1;" for i in range(ns))
        + " fence.mbarrier_init.release.cluster; fence.proxy.async.shared::cta;"
        + " bar.warp.sync -1; mov.u32 $0, 0; }"
    )


_DECL2 = tl.constexpr(_decl_ptx(2))
_DECL3 = tl.constexpr(_decl_ptx(3))
_DECL4 = tl.constexpr(_decl_ptx(4))
_DECL5 = tl.constexpr(_decl_ptx(5))

# $1 = issue (lane 0 of a tile that exists), $2 = stage, $3..$6 = K, V, K-scale, V-scale source rows;
# $7, $8 = values the last step computed from the stage's previous tile (NOTE: data dependences only, so
# the copy cannot start before that tile's fragments were read)
_ISSUE_PTX = tl.constexpr(
    "{ .reg .pred p; .reg .u32 a, d; .reg .b64 st;"
    " setp.ne.s32 p, $1, 0;"
    " mov.u32 a, nkv_tbar; mad.lo.u32 a, $2, 8, a;"
    f" mov.u32 d, nkv_tma; mad.lo.u32 d, $2, {STAGE_BYTES}, d;"
    f" @p mbarrier.arrive.expect_tx.shared::cta.b64 st, [a], {STAGE_BYTES};"
    " @p cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [d], [$3], 1024, [a];"
    " add.u32 d, d, 1024;"
    " @p cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [d], [$4], 1024, [a];"
    " add.u32 d, d, 1024;"
    " @p cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [d], [$5], 128, [a];"
    " add.u32 d, d, 128;"
    " @p cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [d], [$6], 128, [a];"
    " mov.b32 $0, 0; }"
)

# $12 = stage, $13 = parity, $14 = lane -> $0..$11 as _mma_tile._load_tile's tuple
_READ_PTX = tl.constexpr(
    "{ .reg .pred p; .reg .u32 a, b, g, t, x, s0, s1, s2, s3;"
    " mov.u32 a, nkv_tbar; mad.lo.u32 a, $12, 8, a;"
    " TMA_WAIT: mbarrier.try_wait.parity.shared::cta.b64 p, [a], $13; @!p bra TMA_WAIT;"
    f" mov.u32 b, nkv_tma; mad.lo.u32 b, $12, {STAGE_BYTES}, b;"
    " and.b32 t, $14, 3; bfe.u32 g, $14, 2, 3;"
    " shl.b32 x, g, 6; mad.lo.u32 x, t, 16, x; add.u32 x, x, b;"
    " ld.shared.v2.u64 {$0, $1}, [x]; ld.shared.v2.u64 {$2, $3}, [x+512];"
    " shl.b32 x, g, 3; mad.lo.u32 x, t, 2, x; add.u32 x, x, b;"
    " ld.shared.u16 $4, [x+2048]; ld.shared.u16 $5, [x+2112];"
    " shl.b32 x, t, 7; mad.lo.u32 x, g, 8, x; add.u32 x, x, b;"
    " ld.shared.u64 $6, [x+1024]; ld.shared.u64 $7, [x+1088]; ld.shared.u64 $8, [x+1536];"
    " ld.shared.u64 $9, [x+1600];"
    " shl.b32 x, t, 4; add.u32 x, x, g; add.u32 x, x, b;"
    " ld.shared.u8 s0, [x+2176]; ld.shared.u8 s1, [x+2184];"
    " ld.shared.u8 s2, [x+2240]; ld.shared.u8 s3, [x+2248];"
    " bfi.b32 $10, s1, s0, 8, 8; bfi.b32 $11, s3, s2, 8, 8; }"
)


_STAGE = tl.constexpr(STAGE_BYTES)


@triton.jit
def tma_ring(tma_scratch, program, NS: tl.constexpr):
    """This program's ring in ``tma_scratch`` (the interpreter's twins; unused on a GPU): ``NS`` stages of
    ``STAGE_BYTES`` per program, in ``program`` order."""
    return tma_scratch + program.to(tl.int64) * (NS * _STAGE)


@triton.jit
def tma_init(scratch, lane, NS: tl.constexpr):
    """Declare the ring (``NS`` stages) and its barriers; lane 0 initializes them. Call once per segment,
    from ONE call site (the PTX declares the shared arrays)."""
    if NS == 2:
        tl.inline_asm_elementwise(_DECL2, "=r,r", [lane], dtype=tl.int32, is_pure=False, pack=1)
    elif NS == 3:
        tl.inline_asm_elementwise(_DECL3, "=r,r", [lane], dtype=tl.int32, is_pure=False, pack=1)
    elif NS == 4:
        tl.inline_asm_elementwise(_DECL4, "=r,r", [lane], dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.static_assert(NS == 5, "tma stages: 2..5")
        tl.inline_asm_elementwise(_DECL5, "=r,r", [lane], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def tma_issue(scratch, issue, stage, ksrc, vsrc, kssrc, vssrc, dep0, dep1):
    """Lane ``issue`` != 0 starts the copy of one tile into ``stage``: 1 KiB from each of ``ksrc`` / ``vsrc``
    and 128 bytes from each of ``kssrc`` / ``vssrc`` (uint8 pointers, 16-byte aligned)."""
    return tl.inline_asm_elementwise(
        _ISSUE_PTX, "=r,r,r,l,l,l,l,f,f",
        [issue.to(tl.int32), stage.to(tl.int32), ksrc.to(tl.int64), vsrc.to(tl.int64), kssrc.to(tl.int64),
         vssrc.to(tl.int64), dep0, dep1],
        dtype=tl.int32, is_pure=False, pack=1,
    )  # fmt: skip


@triton.jit
def tma_read(scratch, stage, parity, lane):
    """Wait for ``stage``'s copy (phase ``parity``), then this lane's fragment bytes of its tile."""
    return tl.inline_asm_elementwise(
        _READ_PTX, "=l,=l,=l,=l,=r,=r,=l,=l,=l,=l,=r,=r,r,r,r",
        [stage.to(tl.int32), parity.to(tl.int32), lane.to(tl.int32)],
        dtype=(tl.uint64, tl.uint64, tl.uint64, tl.uint64, tl.uint32, tl.uint32,
               tl.uint64, tl.uint64, tl.uint64, tl.uint64, tl.uint32, tl.uint32),
        is_pure=False, pack=1,
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------------
# interpreter twins: the ring in ``scratch`` (global memory, ``NS * STAGE_BYTES`` per program)
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _init_twin(scratch, lane, NS: tl.constexpr):
    pass


@triton.jit
def _copy_rows(dst, src, n_bytes: tl.constexpr, go):
    """``n_bytes`` from ``src`` (a [32] tensor of one pointer) to ``dst`` (same) where ``go``."""
    r = tl.arange(0, 32)[:, None] * (n_bytes // 32) + tl.arange(0, n_bytes // 32)[None, :]
    x = tl.load(src[:, None] + r, mask=go)
    tl.store(dst[:, None] + r, x, mask=go)


@triton.jit
def _issue_twin(scratch, issue, stage, ksrc, vsrc, kssrc, vssrc, dep0, dep1):
    go = tl.max(issue.to(tl.int32), axis=0) != 0
    base = scratch + stage.to(tl.int64) * _STAGE
    _copy_rows(base, ksrc, 1024, go)
    _copy_rows(base + 1024, vsrc, 1024, go)
    _copy_rows(base + 2048, kssrc, 128, go)
    _copy_rows(base + 2176, vssrc, 128, go)
    return tl.zeros_like(issue).to(tl.int32)


@triton.jit
def _read_twin(scratch, stage, parity, lane):
    t = lane % 4
    g = (lane % 32) // 4
    b = stage.to(tl.int64) * _STAGE
    s64 = scratch.to(tl.pointer_type(tl.uint64))
    s16 = scratch.to(tl.pointer_type(tl.uint16))
    k = (b + g * 64 + 16 * t) // 8
    ks = (b + 2048 + g * 8 + 2 * t) // 2
    v = (b + 1024 + 128 * t + 8 * g) // 8
    vs = b + 2176 + 16 * t + g
    return (
        tl.load(s64 + k), tl.load(s64 + k + 1), tl.load(s64 + k + 64), tl.load(s64 + k + 65),
        tl.load(s16 + ks).to(tl.uint32), tl.load(s16 + ks + 32).to(tl.uint32),
        tl.load(s64 + v), tl.load(s64 + v + 8), tl.load(s64 + v + 64), tl.load(s64 + v + 72),
        tl.load(scratch + vs).to(tl.uint32) | (tl.load(scratch + vs + 8).to(tl.uint32) << 8),
        tl.load(scratch + vs + 64).to(tl.uint32) | (tl.load(scratch + vs + 72).to(tl.uint32) << 8),
    )  # fmt: skip


if interpreting():  # NOTE: the interpreter cannot run PTX
    tma_init, tma_issue, tma_read = _init_twin, _issue_twin, _read_twin


def tma_args(cfg: dict[str, int | bool], cache: LayerKV, rows_per_page: int, programs: int,
             device: torch.device) -> dict[str, object]:  # fmt: skip
    """decode_mma's ``TMA`` / ``tma_scratch`` for variant option ``tma`` (stages, 0 = off): bulk copies need
    one warp per program, tiles of 16 whole rows inside a page and 16-byte aligned rows of tiles (``_tma``);
    else off. The interpreter's rings live in ``tma_scratch`` (0xFF-filled: a read of an unwritten byte
    shows); a GPU gets a dummy (the rings are shared memory)."""
    ns = int(cfg.get("tma", 0))
    if not ns:
        return {}
    if ns not in TMA_STAGES:
        raise ValueError(f"decode variant option tma={ns}: stages must be one of {TMA_STAGES}")
    ks, vs, (sp, sh, _) = scale_tensors(cache)
    ptrs = (cache.k_data.data_ptr(), cache.v_data.data_ptr(), ks.data_ptr(), vs.data_ptr())
    strides = (*cache.k_data.stride()[:2], sp, sh)
    if int(cfg["num_warps"]) != 1 or rows_per_page % 16 or any(x % 16 for x in ptrs + strides):
        return {}
    n = programs * ns * STAGE_BYTES if interpreting() else 16
    return {"TMA": ns, "tma_scratch": torch.full((n,), 255, dtype=torch.uint8, device=device)}
