"""Triton twins of ``decode_mma``'s PTX helpers, for the interpreter (CPU tests; it cannot run PTX).

Same inputs and outputs, on the same packed registers (uint32 = two fp16 / four bytes), one element per
lane of ``[32 * NW]`` tensors (lane ``L`` of warp ``w`` = element ``32 w + L``). The warp-collective
steps (``mma.sync``, ``shfl``, ``movmatrix``) become gathers over the warp's 32 lanes, with the fragment
layouts of the PTX ISA (m16n8k16, f16 A row-major / B column-major, f32 C): lane = 4 * groupID + t.
"""

from __future__ import annotations

import triton
import triton.language as tl

from nibblekv.kernels._common import sm_decode


@triton.jit
def _u16_to_f32(x):
    """Low 16 bits (an fp16) -> fp32."""
    return (x & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _f32_to_u16(x):
    """fp32 -> fp16 bits (round to nearest even) in a uint32."""
    return x.to(tl.float16).to(tl.uint16, bitcast=True).to(tl.uint32)


@triton.jit
def _e4m3_to_u16(b):
    """Low byte (an E4M3) -> fp16 bits in a uint32."""
    return (
        (b & 0xFF)
        .to(tl.uint8)
        .to(tl.float8e4nv, bitcast=True)
        .to(tl.float16)
        .to(tl.uint16, bitcast=True)
        .to(tl.uint32)
    )


@triton.jit
def _hmul2(x, s):
    """half2 x * half2 s (each product rounded to fp16)."""
    lo = _f32_to_u16(_u16_to_f32(x) * _u16_to_f32(s))
    hi = _f32_to_u16(_u16_to_f32(x >> 16) * _u16_to_f32(s >> 16))
    return lo | (hi << 16)


@triton.jit
def split64(x):
    return (x & 0xFFFFFFFF).to(tl.uint32), (x >> 32).to(tl.uint32)


@triton.jit
def scale_h2(s):
    return _e4m3_to_u16(s) | (_e4m3_to_u16(s >> 8) << 16)


@triton.jit
def bcast_h2(s):
    lo = s & 0xFFFF
    hi = s >> 16
    return lo | (lo << 16), hi | (hi << 16)


@triton.jit
def cvt_word_sm(x, s):
    r0, r1, r2, r3 = sm_decode(x)
    return _hmul2(r0, s), _hmul2(r1, s), _hmul2(r2, s), _hmul2(r3, s)


@triton.jit
def pair_halves(a, b):
    return (a & 0xFFFF) | (b << 16), (a >> 16) | (b & 0xFFFF0000)


@triton.jit
def _bf16_to_f32(x):
    """Low 16 bits (a bf16) -> fp32."""
    return ((x & 0xFFFF) << 16).to(tl.float32, bitcast=True)


@triton.jit
def _f32_to_bf16(x):
    """fp32 -> bf16 bits (round to nearest even; finite values) in a uint32."""
    b = x.to(tl.uint32, bitcast=True)
    return (b + 0x7FFF + ((b >> 16) & 1)) >> 16


@triton.jit
def _half(x, BF16: tl.constexpr):
    if BF16:
        return _bf16_to_f32(x)
    return _u16_to_f32(x)


@triton.jit
def _halves(r0, r1, BF16: tl.constexpr = 0):
    """Two packed registers -> fp32 ``[N, 2 (register), 2 (half)]`` flattened per warp: ``[NW, 32 * 4]``."""
    x = tl.join(
        tl.join(_half(r0, BF16), _half(r0 >> 16, BF16)), tl.join(_half(r1, BF16), _half(r1 >> 16, BF16))
    )
    # x[i, half, reg]: join puts the new axis last
    n: tl.constexpr = r0.shape[0]
    return tl.reshape(tl.permute(x, [0, 2, 1]), [n // 32, 32 * 4])


@triton.jit
def _gather_warp(src, idx):
    """``src [NW, S]``, ``idx [R]`` (same for every warp) -> ``[NW, R]``."""
    full = idx[None, :] + tl.zeros([src.shape[0], idx.shape[0]], tl.int32)
    return tl.gather(src, full, 1)


@triton.jit
def mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    return _mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, 0)


@triton.jit
def mma_bf16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    return _mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, 1)


@triton.jit
def _mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, BF16: tl.constexpr):
    n: tl.constexpr = a0.shape[0]
    r = tl.arange(0, 16)[:, None]
    k = tl.arange(0, 16)[None, :]
    # A[r][k]: lane 4 (r % 8) + (k % 8) / 2, register (r >= 8) + 2 (k >= 8), half k % 2
    lo = _halves(a0, a1, BF16)  # registers 0, 1
    hi = _halves(a2, a3, BF16)  # registers 2, 3
    a_idx = tl.reshape(((r % 8) * 4 + (k % 8) // 2) * 4 + (r // 8) * 2 + k % 2, [256])
    k_hi = tl.reshape((k + 0 * r) >= 8, [256])[None, :]
    a = tl.where(k_hi, _gather_warp(hi, a_idx), _gather_warp(lo, a_idx))
    a = tl.reshape(a, [n // 32, 16, 16])
    # B[k][c] (k < 16, c < 8): lane 4 c + (k % 8) / 2, register k >= 8, half k % 2
    kb = tl.arange(0, 16)[:, None]
    cb = tl.arange(0, 8)[None, :]
    b_idx = tl.reshape((cb * 4 + (kb % 8) // 2) * 4 + (kb // 8) * 2 + kb % 2, [128])
    b = tl.reshape(_gather_warp(_halves(b0, b1, BF16), b_idx), [n // 32, 16, 8])
    d = tl.sum(a[:, :, :, None] * b[:, None, :, :], axis=2)  # [NW, 16, 8], fp32
    # C/D[r][c]: lane 4 (r % 8) + c / 2, register 2 (r >= 8) + c % 2
    flat = tl.reshape(d, [n // 32, 128])
    lane = tl.arange(0, 32)
    g = lane // 4
    t = lane % 4
    d0 = tl.reshape(_gather_warp(flat, g * 8 + 2 * t), [n])
    d1 = tl.reshape(_gather_warp(flat, g * 8 + 2 * t + 1), [n])
    d2 = tl.reshape(_gather_warp(flat, (g + 8) * 8 + 2 * t), [n])
    d3 = tl.reshape(_gather_warp(flat, (g + 8) * 8 + 2 * t + 1), [n])
    return d0 + c0, d1 + c1, d2 + c2, d3 + c3


@triton.jit
def _lane_bcast(x, MAX: tl.constexpr, COLUMN: tl.constexpr):
    """Max (MAX) or sum of ``x`` on every lane, over the 8 lanes of its ``L % 4`` column (COLUMN) or the 4
    lanes of its ``L // 4`` row."""
    n: tl.constexpr = x.shape[0]
    x3 = tl.reshape(x, [n // 32, 8, 4])  # [warp, g, t]
    AX: tl.constexpr = 1 if COLUMN else 2
    if MAX:
        red = tl.max(x3, axis=AX)
    else:
        red = tl.sum(x3, axis=AX)
    if COLUMN:
        return tl.reshape(tl.broadcast_to(red[:, None, :], [n // 32, 8, 4]), [n])
    return tl.reshape(tl.broadcast_to(red[:, :, None], [n // 32, 8, 4]), [n])


@triton.jit
def lane_reduce(x, y, MAX: tl.constexpr, COLUMN: tl.constexpr):
    return _lane_bcast(x, MAX, COLUMN), _lane_bcast(y, MAX, COLUMN)


@triton.jit
def pack_h2(a, b):
    return _f32_to_u16(a) | (_f32_to_u16(b) << 16)


@triton.jit
def _transpose8(a, b):
    """movmatrix.trans: lane (g, t) gets M[2t][g], M[2t+1][g] where lane (r, c) holds M[r][2c], M[r][2c+1]."""
    n: tl.constexpr = a.shape[0]
    src = tl.reshape(tl.join(a, b), [n // 32, 64])
    lane = tl.arange(0, 32)
    g = lane // 4
    t = lane % 4
    lo = tl.reshape(_gather_warp(src, (4 * (2 * t) + g // 2) * 2 + g % 2), [n])
    hi = tl.reshape(_gather_warp(src, (4 * (2 * t + 1) + g // 2) * 2 + g % 2), [n])
    return lo, hi


@triton.jit
def p_frag(a, b):
    lo, hi = _transpose8(a.to(tl.float16).to(tl.float32), b.to(tl.float16).to(tl.float32))
    return pack_h2(lo, hi)


@triton.jit
def p_frag_bf16(a, b):
    lo, hi = _transpose8(a, b)
    return _f32_to_bf16(lo) | (_f32_to_bf16(hi) << 16)


@triton.jit
def st4(ptr, a, b, c, d, m):
    """Four consecutive fp32 at ``ptr`` where ``m``, rounded to its dtype (one vector store on the GPU)."""
    tl.store(ptr, a, mask=m)
    tl.store(ptr + 1, b, mask=m)
    tl.store(ptr + 2, c, mask=m)
    tl.store(ptr + 3, d, mask=m)
    return tl.zeros_like(a).to(tl.int32)


@triton.jit
def ld4(ptr, m):
    """16 bytes at ``ptr`` as four uint32 where ``m``, else zeros (one vector load on the GPU)."""
    p = ptr.to(tl.pointer_type(tl.uint32))
    return (
        tl.load(p, mask=m, other=0),
        tl.load(p + 1, mask=m, other=0),
        tl.load(p + 2, mask=m, other=0),
        tl.load(p + 3, mask=m, other=0),
    )


@triton.jit
def page_addr(page, stride, base):
    return base + page.to(tl.int64) * stride.to(tl.int64)


@triton.jit
def prefetch_l2(addr, pred):
    """A cache hint: nothing to do under the interpreter."""
    return (addr * 0).to(tl.int32)


@triton.jit
def prefetch_l2_bulk(addr, nbytes, pred):
    """A cache hint: nothing to do under the interpreter."""
    return (addr * 0).to(tl.int32)


# ----------------------------------------------------------------------------------------------------
# ptx.ring: nothing is copied; a stage's address is the global address of its run (``ring_src``)
# ----------------------------------------------------------------------------------------------------
@triton.jit
def ring_alloc(like, S: tl.constexpr):
    return like * 0


@triton.jit
def mbar_init(bar, lane):
    return bar * 0


@triton.jit
def mbar_inval(bar, lane, after):
    return bar * 0


@triton.jit
def ring_issue(bar, tx, dst, src, run, copy, arm, after):
    return bar * 0


@triton.jit
def ring_wait(bar, phase):
    return bar * 0


@triton.jit
def ring_src(stage, run):
    """The global address of the run the stage would hold."""
    return run


@triton.jit
def lds128(addr):
    p = addr.to(tl.pointer_type(tl.uint64))
    return tl.load(p), tl.load(p + 1)


@triton.jit
def lds64(addr):
    return tl.load(addr.to(tl.pointer_type(tl.uint64)))


@triton.jit
def lds_narrow(addr, BYTES: tl.constexpr):
    if BYTES == 1:
        return tl.load(addr.to(tl.pointer_type(tl.uint8))).to(tl.uint32)
    return tl.load(addr.to(tl.pointer_type(tl.uint16))).to(tl.uint32)
