"""``decode_mma``'s per-lane PTX helpers (inline asm, each elementwise for Triton; the warp-collective ones
need all 32 lanes of a warp), and their Triton twins under the interpreter (``ptx.reference``).

Every helper works on one lane's fragment registers: uint32 = two fp16 (or bf16) / four bytes, fp32 = one
accumulator; see ``decode_mma`` for the fragment layouts they serve.
"""

from __future__ import annotations

import triton
import triton.language as tl

from nibblekv.kernels._common import interpreting


# ----------------------------------------------------------------------------------------------------
# per-lane PTX helpers (each is elementwise for Triton; the warp-collective ones need all 32 lanes)
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _split64(x):
    """uint64 -> (low, high) uint32."""
    return tl.inline_asm_elementwise(
        "mov.b64 {$0, $1}, $2;", "=r,=r,l", [x], dtype=(tl.uint32, tl.uint32), is_pure=True, pack=1
    )


@triton.jit
def _scale_h2(s):
    """Low 16 bits = two E4M3 bytes -> half2 (byte 0 low, byte 1 high)."""
    return tl.inline_asm_elementwise(
        "{ .reg .b16 a; cvt.u16.u32 a, $1; cvt.rn.f16x2.e4m3x2 $0, a; }",
        "=r,r", [s], dtype=tl.uint32, is_pure=True, pack=1,
    )  # fmt: skip


@triton.jit
def _bcast_h2(s):
    """half2 (a, b) -> ((a, a), (b, b))."""
    return tl.inline_asm_elementwise(
        "prmt.b32 $0, $2, 0, 0x1010; prmt.b32 $1, $2, 0, 0x3232;",
        "=r,=r,r", [s], dtype=(tl.uint32, tl.uint32), is_pure=True, pack=1,
    )  # fmt: skip


# $4 = 4 bytes in sm order (nibblekv.formats.sm_words), $5 = half2 multiplier -> 4 half2 value * 2**-14 * s:
# 6 masks (ALU pipe), one left shift and two multiplies (ptxas: IMAD, FMA pipe), no conversion instruction.
# NOTE: the standard order through E4M3 bytes + cvt.rn.f16x2.e4m3x2 spends 9 ALU-pipe ops a word (5
# integer + 4 cvt), and Hopper's ALU pipe issues at half rate. Outputs 2 and 3 take a multiply instead of
# two shifts and two masks each: (w & isolated bits) * (2**a + 2**b) & M, the two copies never overlap, so
# the multiply adds without carries (sm_words; _common.sm_decode is the Triton form)
_CVT_WORD_SM_PTX = tl.constexpr(
    """{ .reg .b32 t;
        and.b32 $0, $4, 0x8E008E00;
        shl.b32 t, $4, 3;
        and.b32 $1, t, 0x8E008E00;
        and.b32 t, $4, 0x40074007;
        mul.lo.u32 t, t, 514;
        and.b32 $2, t, 0x8E008E00;
        and.b32 t, $4, 0x20382038;
        mul.lo.u32 t, t, 68;
        and.b32 $3, t, 0x8E008E00;
        mul.rn.f16x2 $0, $0, $5;
        mul.rn.f16x2 $1, $1, $5;
        mul.rn.f16x2 $2, $2, $5;
        mul.rn.f16x2 $3, $3, $5;
        }"""
)


@triton.jit
def _cvt_word_sm(x, s):
    """A word in sm order (``nibblekv.formats.sm_words``) and a half2 multiplier ``s`` -> 4 half2
    ``value * 2**-14 * s`` = elements (e0, e2), (e4, e6), (e1, e3), (e5, e7). Exact for every E4M3 scale: the
    product has <= 6 significant bits, is a multiple of 2**-15 * 2**-9 = 2**-24 (fp16's subnormal step)
    and < 2**11."""
    return tl.inline_asm_elementwise(
        asm=_CVT_WORD_SM_PTX,
        constraints="=r,=r,=r,=r,r,r",
        args=[x, s],
        dtype=(tl.uint32, tl.uint32, tl.uint32, tl.uint32),
        is_pure=True,
        pack=1,
    )


@triton.jit
def _pair_halves(a, b):
    """Two tokens' sm words -> (low halves of a, b), (high halves of a, b): ``_cvt_word_sm`` of each gives
    (token a, token b) half2 of elements e0, e4, e1, e5 (first) and e2, e6, e3, e7 (second)."""
    return tl.inline_asm_elementwise(
        "prmt.b32 $0, $2, $3, 0x5410; prmt.b32 $1, $2, $3, 0x7632;",
        "=r,=r,r,r", [a, b], dtype=(tl.uint32, tl.uint32), is_pure=True, pack=1,
    )  # fmt: skip


def _mma_ptx(ab: str) -> str:
    """PTX of one ``mma.sync.m16n8k16`` with ``ab`` (f16 or bf16) operands and f32 accumulators."""
    return (
        f"mma.sync.aligned.m16n8k16.row.col.f32.{ab}.{ab}.f32 {{$0, $1, $2, $3}}, {{$4, $5, $6, $7}}, {{$8, $9}}, "
        "{$10, $11, $12, $13};"
    )


_MMA_F16_PTX = tl.constexpr(_mma_ptx("f16"))
_MMA_BF16_PTX = tl.constexpr(_mma_ptx("bf16"))
# score-fragment pair -> P^T B-fragment: round to 16-bit pairs, then one 8x8 transpose across the warp
_P_F16_PTX = tl.constexpr("{ .reg .b32 p; cvt.rn.f16x2.f32 p, $2, $1; movmatrix.sync.aligned.m8n8.trans.b16 $0, p; }")
_P_BF16_PTX = tl.constexpr("{ .reg .b32 p; cvt.rn.bf16x2.f32 p, $2, $1; movmatrix.sync.aligned.m8n8.trans.b16 $0, p; }")


@triton.jit
def _mma_asm(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, ASM: tl.constexpr):
    """D = A B + C on this lane's fragment registers, by ``ASM`` (an ``_mma_ptx``)."""
    return tl.inline_asm_elementwise(
        ASM, "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", [a0, a1, a2, a3, b0, b1, c0, c1, c2, c3],
        dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=1,
    )  # fmt: skip


@triton.jit
def _mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    """One ``mma.sync.m16n8k16`` (f16 x f16 -> f32): D = A B + C on this lane's fragment registers."""
    return _mma_asm(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, _MMA_F16_PTX)


def _lane_reduce_ptx(op: str, masks: tuple[int, ...]) -> str:
    """PTX: $0/$1 = ``op`` (max or add) of $2/$3 over the lanes that differ only in the bits of ``masks``
    (xor 4, 8, 16: the 8 lanes sharing ``L % 4``, one fragment column; xor 1, 2: the 4 sharing ``L // 4``,
    one fragment row)."""
    body = "".join(
        f"""
        shfl.sync.bfly.b32 a, {x}, {m}, 0x1f, 0xffffffff;
        shfl.sync.bfly.b32 b, {y}, {m}, 0x1f, 0xffffffff;
        {op}.f32 $0, {x}, a;
        {op}.f32 $1, {y}, b;"""
        for i, m in enumerate(masks)
        for x, y in [("$2", "$3") if i == 0 else ("$0", "$1")]
    )
    return "{ .reg .f32 a, b;" + body + "\n        }"


_MAX8_PTX = tl.constexpr(_lane_reduce_ptx("max", (4, 8, 16)))
_SUM8_PTX = tl.constexpr(_lane_reduce_ptx("add", (4, 8, 16)))
_MAX4_PTX = tl.constexpr(_lane_reduce_ptx("max", (1, 2)))
_SUM4_PTX = tl.constexpr(_lane_reduce_ptx("add", (1, 2)))


@triton.jit
def _reduce2(x, y, ASM: tl.constexpr):
    """``x`` and ``y`` reduced across lanes by ``ASM`` (an ``_lane_reduce_ptx``)."""
    return tl.inline_asm_elementwise(
        ASM, "=f,=f,f,f", [x, y], dtype=(tl.float32, tl.float32), is_pure=True, pack=1
    )


@triton.jit
def _lane_reduce(x, y, MAX: tl.constexpr, COLUMN: tl.constexpr):
    """Max (``MAX``) or sum of ``x`` and of ``y`` over the 8 lanes sharing ``L % 4`` (``COLUMN``: one fragment
    column) or the 4 lanes sharing ``L // 4`` (one fragment row: ``decode_mma16``)."""
    if COLUMN:
        if MAX:
            return _reduce2(x, y, _MAX8_PTX)
        return _reduce2(x, y, _SUM8_PTX)
    if MAX:
        return _reduce2(x, y, _MAX4_PTX)
    return _reduce2(x, y, _SUM4_PTX)


@triton.jit
def _pack_h2(a, b):
    """fp32 (a, b) -> half2 (a low, b high)."""
    return tl.inline_asm_elementwise(
        "cvt.rn.f16x2.f32 $0, $2, $1;", "=r,f,f", [a, b], dtype=tl.uint32, is_pure=True, pack=1
    )


@triton.jit
def _p_asm(a, b, ASM: tl.constexpr):
    return tl.inline_asm_elementwise(ASM, "=r,f,f", [a, b], dtype=tl.uint32, is_pure=True, pack=1)


@triton.jit
def _p_frag(a, b):
    """Score-fragment pair (token g; heads 2t, 2t+1) -> P^T B-fragment (tokens 2t, 2t+1; head g), fp16."""
    return _p_asm(a, b, _P_F16_PTX)


@triton.jit
def _mma_bf16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    """``_mma`` on bf16 fragments (the bf16 tail: its K/V need no conversion)."""
    return _mma_asm(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, _MMA_BF16_PTX)


@triton.jit
def _p_frag_bf16(a, b):
    """``_p_frag`` in bf16 (the B operand of ``_mma_bf16``)."""
    return _p_asm(a, b, _P_BF16_PTX)


@triton.jit
def _st4(ptr, a, b, c, d, m):
    """Four consecutive fp32 values at ``ptr`` where ``m``, as one vector store: ``st.global.v4.f32`` (16-byte
    aligned), or for a bf16 ``ptr`` rounded to bf16 (``cvt.rn.bf16x2.f32``) and ``st.global.v2.b32`` (8-byte
    aligned)."""
    if ptr.dtype.element_ty == tl.bfloat16:
        return tl.inline_asm_elementwise(
            "{ .reg .pred p; .reg .b32 x, y; setp.ne.s32 p, $6, 0; cvt.rn.bf16x2.f32 x, $3, $2; "
            "cvt.rn.bf16x2.f32 y, $5, $4; @p st.global.v2.b32 [$1], {x, y}; mov.b32 $0, 0; }",
            "=r,l,f,f,f,f,r", [ptr.to(tl.int64), a, b, c, d, m.to(tl.int32)], dtype=tl.int32, is_pure=False,
            pack=1,
        )  # fmt: skip
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.s32 p, $6, 0; @p st.global.v4.f32 [$1], {$2, $3, $4, $5}; mov.b32 $0, 0; }",
        "=r,l,f,f,f,f,r", [ptr.to(tl.int64), a, b, c, d, m.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1,
    )  # fmt: skip


@triton.jit
def _ld4(ptr, m):
    """``ld.global.v4.u32``: 16 bytes at ``ptr`` (16-byte aligned) as four uint32 where ``m``, else zeros."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.s32 p, $5, 0; mov.b32 $0, 0; mov.b32 $1, 0; mov.b32 $2, 0; mov.b32 $3, 0; "
        "@p ld.global.v4.u32 {$0, $1, $2, $3}, [$4]; }",
        "=r,=r,=r,=r,l,r", [ptr.to(tl.int64), m.to(tl.int32)], dtype=(tl.uint32, tl.uint32, tl.uint32, tl.uint32),
        is_pure=True, pack=1,
    )  # fmt: skip


@triton.jit
def _page_addr(page, stride, base):
    """``base + page * stride`` as one ``mad.wide.u32`` (SASS ``IMAD.WIDE.U32``): ``page``, ``stride``
    non-negative int32 (a page id, the page's bytes), ``base`` a byte pointer (int64 address) -> int64.

    Why: ``page.to(int64) * s_page + off`` compiles to a full 64-bit multiply-add (sign word, two IMAD,
    IMAD.WIDE, IADD) and one more 64-bit add per pointer; this is one instruction per pointer.
    """
    return tl.inline_asm_elementwise(
        "mad.wide.u32 $0, $1, $2, $3;", "=l,r,r,l", [page.to(tl.int32), stride.to(tl.int32), base],
        dtype=tl.int64, is_pure=True, pack=1,
    )  # fmt: skip


@triton.jit
def _prefetch_l2(addr, pred):
    """Where ``pred``: ``prefetch.global.L2`` of the line holding ``addr`` (int64): per lane, no register
    holds the data (a bulk prefetch takes a warp-uniform address: ptxas loops over the lanes). Returns 0."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.b32 $0, 0; }",
        "=r,l,r", [addr, pred.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1,
    )  # fmt: skip


@triton.jit
def _prefetch_l2_bulk(addr, nbytes, pred):
    """Where ``pred``: ``cp.async.bulk.prefetch.L2`` of the ``nbytes`` (int32, a multiple of 16) from
    ``addr`` (int64, 16-byte aligned): one instruction a run, issued by the TMA unit, which holds no
    registers and no load slots of the warp. Returns 0."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.s32 p, $3, 0; "
        "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.b32 $0, 0; }",
        "=r,l,r,r", [addr, nbytes, pred.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1,
    )  # fmt: skip


if interpreting():  # NOTE: the interpreter cannot run PTX: the same helpers as Triton twins (ptx.reference)
    from nibblekv.kernels.ptx import reference as _tw

    _split64, _scale_h2, _bcast_h2 = _tw.split64, _tw.scale_h2, _tw.bcast_h2
    _cvt_word_sm, _pair_halves = _tw.cvt_word_sm, _tw.pair_halves
    _mma, _lane_reduce, _pack_h2, _p_frag = _tw.mma, _tw.lane_reduce, _tw.pack_h2, _tw.p_frag
    _mma_bf16, _p_frag_bf16 = _tw.mma_bf16, _tw.p_frag_bf16
    _st4, _ld4 = _tw.st4, _tw.ld4
    _page_addr, _prefetch_l2, _prefetch_l2_bulk = _tw.page_addr, _tw.prefetch_l2, _tw.prefetch_l2_bulk
