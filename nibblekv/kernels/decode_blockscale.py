"""NVFP4 decode with the block scales applied outside the elementwise path (variant ``bs`` of ``decode_triton``).

The ``tok`` kernel (decode_tok) dequantizes every value: nibble -> fp16, times its E4M3 block scale (one
HMUL2 per value pair), then permutes the low/high-nibble halves back to natural head_dim order (one PRMT
per value pair). Here each 16-value block ``b`` of head_dim is its own slice and the scales act on the
small side of the dots instead (constexpr ``SC``, bit 0 for K, bit 1 for V):

* K (``SC & 1``): ``S[g, t] = sum_b s_k[t, b] * (q_b . code_k[t, b])`` -- one batched dot over the D/16
  blocks (``[NB, BH, 16] x [NB, 16, BN]``), each block's partial scores times that token's scale (fp32),
  summed over blocks. Without the bit: the codes are scaled in fp16 (as ``tok``) and one full-D dot runs.
  ``SC & 4`` instead runs K block by block: D/16 2D dots ``[BH, 16] x [16, BN]`` accumulating the scaled
  partial scores (Q slices re-read from L1 each block) -- the 3D dot puts its warps on the block axis, so
  the sum over blocks crosses warps and each warp then repeats the whole softmax.
* V (``SC & 2``): ``O[g, block b] = sum_t (P[g, t] * s_v[t, b]) * code_v[t, b]`` -- D/16 accumulators
  ``[NB, BH, 16]``, P times each block's per-token scale (in fp32, then fp16) before a batched dot.
  Without the bit: the codes are scaled in fp16 and one ``[BH, BN] x [BN, D]`` dot runs.

Codes convert with no per-value multiply (``CONV``: 0 plain Triton / 1 two asm blocks / 2 one asm block,
all fp16 bit placement = ``value * 2**-14``; 3 via E4M3 bytes + ``cvt`` = ``value * 2**-6``). The constant
factor and the global scales fold into the fp32 softmax / output scales.

Order inside a block (``ORD``): 0 natural (low/high nibble pairs joined, as ``tok``); 1 concatenated (the
8 low nibbles = even dims, then the 8 high nibbles = odd dims: no join back to natural order). Any fixed
order works because a block is contracted whole: Q's columns are loaded in the same order once per
program, and the output columns are stored through the same permutation.

Everything else (per-token gather through the page table, split-K, the bf16 tail segment, the partial
outputs and the combine step) is ``decode_tok``'s: ``decode_tok_kernel`` calls ``bs_segment`` for the
main NVFP4 pool when launched with ``BS=True``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from nibblekv.kernels._common import nvfp4_split


@triton.jit
def _bs_codes(raw, CONV: tl.constexpr):
    """``raw [..., 8]`` uint8 -> (low nibbles, high nibbles) fp16 codes, unscaled (see the module doc)."""
    # NOTE: _tok is imported at the bottom of this file: decode_tok imports this module (bs_segment).
    if CONV == 3:
        lo, hi = _tok.nvfp4_split_e4m3_asm(raw)
    elif CONV == 2:
        lo, hi = _tok.nvfp4_split2_asm(raw)
    else:
        lo, hi = nvfp4_split(raw, CONV == 1)
    return lo, hi


@triton.jit
def _bs_order(lo, hi, ORD: tl.constexpr):
    """(low, high) ``[BN, NB, 8]`` -> ``[BN, NB, 16]`` in the block order ``ORD`` (see ``_bs_col``)."""
    BN: tl.constexpr = lo.shape[0]
    NB: tl.constexpr = lo.shape[1]
    x = tl.join(lo, hi)  # [BN, NB, 8, 2]: (byte, nibble)
    if ORD == 1:
        x = tl.permute(x, (0, 1, 3, 2))  # (nibble, byte): even dims, then odd dims
    return tl.reshape(x, [BN, NB, 16])


@triton.jit
def _bs_col(j, ORD: tl.constexpr):
    """head_dim offset (within its block) of position ``j`` (0..15) of a block in order ``ORD``."""
    if ORD == 1:
        return (j % 8) * 2 + j // 8
    else:
        return j


@triton.jit
def _bs_load(data_ptr, scale_ptr, row, srow, nmask, D: tl.constexpr, MASKED: tl.constexpr):
    """``BN`` gathered rows -> raw codes ``[BN, D/16, 8]`` uint8 and block scales ``[BN, D/16]`` fp32.

    NOTE: masked rows read as zeros (stale bytes could decode to NaN scales; 0 * NaN poisons the sum).
    """
    NB: tl.constexpr = D // 16
    offs_b = tl.arange(0, NB)
    col = offs_b[:, None] * 8 + tl.arange(0, 8)[None, :]
    dptr = data_ptr + row[:, None, None] + col[None, :, :]
    sptr = scale_ptr + srow[:, None] + offs_b[None, :]
    if MASKED:
        raw = tl.load(dptr, mask=nmask[:, None, None], other=0)
        sc = tl.load(sptr, mask=nmask[:, None], other=0.0)
    else:
        raw = tl.load(dptr)
        sc = tl.load(sptr)
    return raw, sc.to(tl.float32)


@triton.jit
def _bs_load_slice(data_ptr, row, nmask, b: tl.constexpr, MASKED: tl.constexpr):
    """Block ``b`` of ``BN`` gathered rows: ``[BN, 8]`` uint8 (8 bytes per token)."""
    ptr = data_ptr + row[:, None] + (b * 8 + tl.arange(0, 8))[None, :]
    if MASKED:
        return tl.load(ptr, mask=nmask[:, None], other=0)
    return tl.load(ptr)


@triton.jit
def _bs_load_scale(scale_ptr, srow, nmask, b: tl.constexpr, MASKED: tl.constexpr):
    """Scale of block ``b`` of ``BN`` gathered rows: ``[BN]`` fp32."""
    if MASKED:
        return tl.load(scale_ptr + srow + b, mask=nmask, other=0.0).to(tl.float32)
    return tl.load(scale_ptr + srow + b).to(tl.float32)


@triton.jit
def _bs_block(
    n0, end, q, q_rows, gmask, m, l, acc, qk_scale, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_tok, sc_page,
    head_off, shead_off, pt_ptr,
    D: tl.constexpr, PAGE: tl.constexpr, BN: tl.constexpr, CONV: tl.constexpr, SC: tl.constexpr,
    ORD: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    """Keys ``[n0, n0 + BN)``: gather, convert, one online-softmax step (MASKED: keys >= end masked).

    ``q``: unused (SC & 4), ``[NB, BH, 16]`` (SC & 1) or ``[BH, D]`` fp16 in block order; ``acc``: ``[NB, BH, 16]``
    (SC & 2) or ``[BH, D]`` fp32. Scales enter as ``s * 2**7`` where they meet fp16 (exact; <= 57344).
    """
    NB: tl.constexpr = D // 16
    idx = n0 + tl.arange(0, BN)
    nmask = idx < end
    if MASKED:  # NOTE: mask the page-table read too (the interpreter does not catch out-of-bounds loads)
        page = tl.load(pt_ptr + idx // PAGE, mask=nmask, other=0).to(tl.int64)
    else:
        page = tl.load(pt_ptr + idx // PAGE).to(tl.int64)
    tok = (idx % PAGE).to(tl.int64)
    row = page * s_page + head_off + tok * s_tok
    srow = page * sc_page + shead_off + tok * NB  # NOTE: constexpr stride, see decode_tok._tok_block

    if SC & 4 == 0:
        kraw, ks = _bs_load(k_ptr, ks_ptr, row, srow, nmask, D, MASKED)
        klo, khi = _bs_codes(kraw, CONV)
    if SC & 4:  # K block by block: 2D dots [BH, 16] x [16, BN], Q slices re-read (L1) each block
        s = tl.zeros([q.shape[0], BN], tl.float32)
        for b in tl.static_range(NB):
            kb = _bs_load_slice(k_ptr, row, nmask, b, MASKED)
            ksb = _bs_load_scale(ks_ptr, srow, nmask, b, MASKED)
            blo, bhi = _bs_codes(kb, CONV)
            kb = tl.reshape(
                _bs_order(tl.reshape(blo, [BN, 1, 8]), tl.reshape(bhi, [BN, 1, 8]), ORD), [BN, 16]
            )
            qb = tl.load(q_rows[:, None] + (b * 16 + _bs_col(tl.arange(0, 16), ORD))[None, :],
                         mask=gmask[:, None], other=0.0).to(tl.float16)  # fmt: skip
            s += tl.dot(qb, tl.trans(kb)) * ksb[None, :]
    elif SC & 1:
        kt = tl.permute(_bs_order(klo, khi, ORD), (1, 2, 0))  # [NB, 16, BN]
        sp = tl.dot(q, kt)  # [NB, BH, BN]: per-block partial scores
        s = tl.sum(sp * tl.trans(ks)[:, None, :], axis=0)
    else:
        k16 = (ks * 128.0).to(tl.float16)[:, :, None]
        k = tl.reshape(_bs_order(klo * k16, khi * k16, ORD), [BN, D])
        s = tl.dot(q, tl.trans(k))
    s = s * qk_scale
    if MASKED:
        s = tl.where(nmask[None, :], s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(s - m_new[:, None])
    l = l * alpha + tl.sum(p, axis=1)

    vraw, vs = _bs_load(v_ptr, vs_ptr, row, srow, nmask, D, MASKED)
    vlo, vhi = _bs_codes(vraw, CONV)
    if SC & 2:
        v = tl.permute(_bs_order(vlo, vhi, ORD), (1, 0, 2))  # [NB, BN, 16]
        pv = p.to(tl.float16)[None, :, :] * (tl.trans(vs) * 128.0).to(tl.float16)[:, None, :]  # [NB, BH, BN]
        acc = tl.dot(pv, v, acc * alpha[None, :, None])
    else:
        v16 = (vs * 128.0).to(tl.float16)[:, :, None]
        v = tl.reshape(_bs_order(vlo * v16, vhi * v16, ORD), [BN, D])
        acc = tl.dot(p.to(tl.float16), v, acc * alpha[:, None])
    return m_new, l, acc


@triton.jit
def bs_segment(
    q_ptr, s_qh, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_head, s_tok, sc_page, sc_head,
    pt_ptr, start, end, h, qk_scale, out_scale, o_ptr, lse_ptr, s_os,
    G: tl.constexpr, BH: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, BN: tl.constexpr,
    CONV: tl.constexpr, INTERP: tl.constexpr, SC: tl.constexpr, ORD: tl.constexpr,
):  # fmt: skip
    """``decode_tok._tok_segment`` for an NVFP4 pool with block scales outside the elementwise path.

    ``qk_scale`` / ``out_scale`` come as for ``tok`` (times ``2**7 * g``); the code factor is fixed here.
    """
    NB: tl.constexpr = D // 16
    CS: tl.constexpr = 2.0**-6 if CONV == 3 else 2.0**-14  # codes are value * CS
    # tok's 2**7 becomes this variant's factor: K scaled after the dot needs 1 / CS, else 1 / (2**7 CS)
    if SC & 5:
        qk_scale = qk_scale * (1.0 / (128.0 * CS))
    else:
        qk_scale = qk_scale * (1.0 / (128.0 * 128.0 * CS))
    out_scale = out_scale * (1.0 / (128.0 * 128.0 * CS))
    offs_g = tl.arange(0, BH)
    gmask = offs_g < G
    q_rows = q_ptr + (h * G + offs_g) * s_qh  # [BH]
    # column (b, j) of the block-ordered head_dim: natural offset b * 16 + _bs_col(j)
    colb = tl.arange(0, NB)[:, None] * 16 + _bs_col(tl.arange(0, 16), ORD)[None, :]  # [NB, 16]
    if SC & 4:
        q = tl.zeros([BH, 16], tl.float16)  # unused: the K blocks re-read their Q slices
    elif SC & 1:
        q = tl.load(q_rows[None, :, None] + colb[:, None, :], mask=gmask[None, :, None], other=0.0)
    else:
        q = tl.load(q_rows[:, None] + tl.reshape(colb, [D])[None, :], mask=gmask[:, None], other=0.0)
    q = q.to(tl.float16)
    m = tl.full([BH], float("-inf"), tl.float32)
    l = tl.zeros([BH], tl.float32)
    if SC & 2:
        acc = tl.zeros([NB, BH, 16], tl.float32)
    else:
        acc = tl.zeros([BH, D], tl.float32)
    head_off = h.to(tl.int64) * s_head
    shead_off = h.to(tl.int64) * sc_head
    full_end = start + (end - start) // BN * BN
    if (
        INTERP
    ):  # NOTE: triton 3.6's interpreter cannot run `for` over loaded bounds; GPUs need `for` to pipeline
        n0 = start
        while n0 < full_end:
            m, l, acc = _bs_block(
                n0, end, q, q_rows, gmask, m, l, acc, qk_scale, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_tok, sc_page,
                head_off, shead_off, pt_ptr, D, PAGE, BN, CONV, SC, ORD, False,
            )  # fmt: skip
            n0 += BN
    else:
        for n0 in range(start, full_end, BN):
            m, l, acc = _bs_block(
                n0, end, q, q_rows, gmask, m, l, acc, qk_scale, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_tok, sc_page,
                head_off, shead_off, pt_ptr, D, PAGE, BN, CONV, SC, ORD, False,
            )  # fmt: skip
    if full_end < end:
        m, l, acc = _bs_block(
            full_end, end, q, q_rows, gmask, m, l, acc, qk_scale, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_tok, sc_page,
            head_off, shead_off, pt_ptr, D, PAGE, BN, CONV, SC, ORD, True,
        )  # fmt: skip
    # An empty segment stores lse = -inf and o = 0, which the combine step weighs as nothing.
    inv = tl.where(l > 0, out_scale / tl.maximum(l, 1e-30), 0.0)
    lse = tl.where(l > 0, m + tl.log2(tl.maximum(l, 1e-30)), float("-inf"))
    o_rows = o_ptr + offs_g * s_os
    if SC & 2:
        tl.store(
            o_rows[None, :, None] + colb[:, None, :], acc * inv[None, :, None], mask=gmask[None, :, None]
        )
    else:
        tl.store(o_rows[:, None] + tl.reshape(colb, [D])[None, :], acc * inv[:, None], mask=gmask[:, None])
    tl.store(lse_ptr + offs_g * (s_os // D), lse, mask=gmask)


# circular on purpose: decode_tok imports bs_segment; the JIT resolves _tok.* at compile time
from nibblekv.kernels import decode_tok as _tok
