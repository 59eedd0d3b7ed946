"""A one-warp program's shared-memory ring of bulk copies (inline PTX), for the ``decode_mma`` family's
``DecodeConfig.smem_stages``: whole (page, KV head) runs of the pool go global -> shared by the TMA unit
(``cp.async.bulk``, one instruction a run, no registers and no load slots of the warp), each stage
signalled by its own ``mbarrier``; the lanes then read their fragment bytes with ``ld.shared``.

Why: a warp of ``decode_mma`` holds at most its next step's bytes in registers (~4.6 KB), so 12 warps an SM
keep ~55 KB in flight, where the FP8 kernel keeps ~128 KB in its shared-memory pipeline; a ring of ``S``
stages keeps ``S - 1`` steps in flight and frees the registers that held the next step.

Addresses: the ring is a ``.shared`` array declared inside the asm that returns its address
(``_ring_alloc``; ptxas gives each program its own, static shared memory), addresses are 32-bit shared
addresses. NOTE: call ``_ring_alloc`` once per kernel (each inlined copy is another array).
Under the interpreter (``ptx.reference``) nothing is copied: a stage's "address" is the global address of
the run it would hold (``_ring_src``), and the reads are global loads of the same bytes.
"""

from __future__ import annotations

import triton
import triton.language as tl

from nibblekv.kernels._common import interpreting

# NOTE: one stage is 4,608 bytes at head_dim 128 (two 16-token tiles) and 256 (one): two runs of
# 16 x (D / 2 + D / 16) bytes (K rows and scales, then V's) a tile; the mbarriers follow the stages
STAGE_BYTES = 4608
_RING_PTX = {
    s: tl.constexpr(f"{{ .shared .align 128 .b8 ring[{s * STAGE_BYTES + 8 * s}]; mov.u32 $0, ring; }}")
    for s in (2, 3, 4)
}
_RING2, _RING3, _RING4 = _RING_PTX[2], _RING_PTX[3], _RING_PTX[4]


@triton.jit
def _ring_alloc(like, S: tl.constexpr):
    """The shared address (int32, 128-byte aligned) of this program's ring of ``S`` stages of
    ``STAGE_BYTES`` and then ``S`` 8-byte mbarriers; ``like`` any int32 lane tensor (the result's shape)."""
    tl.static_assert(S >= 2 and S <= 4, "2-4 stages")
    if S == 2:
        asm: tl.constexpr = _RING2
    elif S == 3:
        asm: tl.constexpr = _RING3
    else:
        asm: tl.constexpr = _RING4
    return tl.inline_asm_elementwise(asm, "=r,r", [like], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _mbar_init(bar, lane):
    """Lane 0: ``mbarrier.init`` with one expected arrival at ``bar`` (shared); then the init is fenced and
    the warp synced. Returns 0."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.eq.s32 p, $2, 0; @p mbarrier.init.shared::cta.b64 [$1], 1; "
        "fence.mbarrier_init.release.cluster; bar.warp.sync -1; mov.b32 $0, 0; }",
        "=r,r,r", [bar, lane], dtype=tl.int32, is_pure=False, pack=1,
    )  # fmt: skip


@triton.jit
def _mbar_inval(bar, lane, after):
    """Lane 0: ``mbarrier.inval`` of ``bar`` once ``after`` (a value of the last step) is computed, so the
    next segment may init it again. Returns 0."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.eq.s32 p, $2, 0; bar.warp.sync -1; @p mbarrier.inval.shared::cta.b64 [$1]; "
        "mov.b32 $0, 0; }",
        "=r,r,r,f", [bar, lane, after], dtype=tl.int32, is_pure=False, pack=1,
    )  # fmt: skip


@triton.jit
def _ring_issue(bar, tx, dst, src, run, copy, arm, after):
    """Fill one stage: where ``arm`` (one lane), ``bar`` expects ``tx`` bytes (the stage's copies, all of
    them) and takes its one arrival; then each lane with ``copy`` copies the ``run`` bytes at global ``src``
    (16-byte aligned) to shared ``dst``, completing on ``bar``. ``after``: a value of the step that last read
    this stage (so the copy cannot overtake those reads); the proxy fence orders them for the TMA unit.
    Returns 0."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred a, c; setp.ne.s32 a, $7, 0; setp.ne.s32 c, $6, 0; fence.proxy.async.shared::cta; "
        "@a mbarrier.arrive.expect_tx.shared::cta.b64 _, [$1], $2; "
        "@c cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$3], [$4], $5, [$1]; "
        "mov.b32 $0, 0; }",
        "=r,r,r,r,l,r,r,r,f", [bar, tx, dst, src, run, copy.to(tl.int32), arm.to(tl.int32), after],
        dtype=tl.int32, is_pure=False, pack=1,
    )  # fmt: skip


@triton.jit
def _ring_wait(bar, phase):
    """Every lane waits until ``bar`` completes phase parity ``phase`` (its copies have landed). Returns 0,
    which the reads add to their addresses (so no read moves above the wait)."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; WAIT_RING: mbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2; @!p bra WAIT_RING; "
        "mov.b32 $0, 0; }",
        "=r,r,r", [bar, phase], dtype=tl.int32, is_pure=False, pack=1,
    )  # fmt: skip


@triton.jit
def _lds128(addr):
    """16 bytes at shared ``addr`` (16-byte aligned) -> two uint64."""
    return tl.inline_asm_elementwise(
        "ld.shared.v2.u64 {$0, $1}, [$2];", "=l,=l,r", [addr], dtype=(tl.uint64, tl.uint64), is_pure=True,
        pack=1,
    )  # fmt: skip


@triton.jit
def _lds64(addr):
    """8 bytes at shared ``addr`` (8-byte aligned) -> uint64."""
    return tl.inline_asm_elementwise(
        "ld.shared.u64 $0, [$1];", "=l,r", [addr], dtype=tl.uint64, is_pure=True, pack=1
    )


_LDS_U8 = tl.constexpr("{ .reg .b16 h; ld.shared.u8 h, [$1]; cvt.u32.u16 $0, h; }")
_LDS_U16 = tl.constexpr("{ .reg .b16 h; ld.shared.u16 h, [$1]; cvt.u32.u16 $0, h; }")


@triton.jit
def _lds_narrow(addr, BYTES: tl.constexpr):
    """``BYTES`` (1 or 2, aligned) at shared ``addr`` -> uint32."""
    if BYTES == 1:
        asm: tl.constexpr = _LDS_U8
    else:
        asm: tl.constexpr = _LDS_U16
    return tl.inline_asm_elementwise(asm, "=r,r", [addr], dtype=tl.uint32, is_pure=True, pack=1)


@triton.jit
def _ring_src(stage, run):
    """The address a tile's reads take: its stage's shared address (``run``, the global run, is unused)."""
    return stage


if interpreting():  # NOTE: the interpreter cannot run PTX: the Triton twins (ptx.reference)
    from nibblekv.kernels.ptx import reference as _tw

    _ring_alloc, _mbar_init, _mbar_inval, _ring_issue, _ring_wait = (
        _tw.ring_alloc, _tw.mbar_init, _tw.mbar_inval, _tw.ring_issue, _tw.ring_wait,
    )  # fmt: skip
    _lds128, _lds64, _lds_narrow, _ring_src = _tw.lds128, _tw.lds64, _tw.lds_narrow, _tw.ring_src
