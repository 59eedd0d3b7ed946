"""Per-token paged decode (``DecodeKernel.TOK`` of ``decode_triton``): the plain per-token structure.

Same grid, partials and combine step as ``decode._decode_kernel`` (``(B, kv_heads, splits [+1 tail])``),
but every key tile is gathered row by row through the page table -- ``slot = table[t // P] * P + t % P``,
one ``[BN, D]`` load per tile -- instead of reshaping whole-page tiles ``[pages, P*D] -> [BN, D]``.
Why: on the H200 a plain kernel of this shape read BF16 at 4.5 TB/s, while the page-tile reshape sends V
through shared memory twice and splits K into two half dots.

``S = Q K^T`` with Q ``[BH, D]`` (the GQA group padded to 16 rows) as the A operand and
``acc [BH, D] += P V``; one dot over the whole head_dim. (The transposed ``S^T = K Q^T``, variant ``kq``,
was wrong on sm_90 with triton 3.6 and was removed; ``decode_mma`` supersedes it.)

NVFP4 tiles are dequantized to natural head_dim order by ``_common.nvfp4_split`` (the pool's sm bit order).
"""

from __future__ import annotations

import triton
import triton.language as tl

from nibblekv.kernels._common import (
    global_scales,
    nvfp4_split,
    softmax_update,
    split_range,
    split_slot,
)


@triton.jit
def _nvfp4_pair(r3, sc):
    """``r3 [BN, NB, 8]`` bytes, ``sc [BN, NB]`` E4M3 -> (even, odd elements) fp16 ``[BN, NB, 8]``, each
    ``value * 2**-7 / g``: the sm decode (``nvfp4_split``, ``value * 2**-14``) times ``scale * 2**7`` (exact
    in fp16, see ``_common``)."""
    lo, hi = nvfp4_split(r3)
    s16 = (sc.to(tl.float16) * 128.0)[:, :, None]
    return lo * s16, hi * s16


@triton.jit
def fp8_pairs_to_f16_asm(x):
    """uint16 ``[...]`` holding two float8_e4m3 each -> (first, second) fp16 ``[...]``: 1 prmt + 2 cvt per 4 values.

    With pack=2 one register holds pairs (e0, e1), (e2, e3); ``prmt`` regroups the bytes as (e0, e2),
    (e1, e3) and ``cvt.rn.f16x2.e4m3x2`` converts each half. The caller joins the two outputs back to
    natural order: the join (like the NVFP4 V path) keeps the conversion in the load layout, so the fp16
    tile crosses shared memory once, vectorized. NOTE: a plain ``.to(tl.float16)`` (or an elementwise asm)
    gets moved after a shared-memory load in the MMA operand layout, which for V (the MMA wants token
    pairs, the cache stores head_dim pairs) reads every byte alone: 128 LDS.U8 per 128-key block.
    """
    return tl.inline_asm_elementwise(
        asm="""
        {
        .reg .b32 t;
        .reg .b16 lo, hi;
        prmt.b32 t, $2, 0, 0x3120;
        mov.b32 {lo, hi}, t;
        cvt.rn.f16x2.e4m3x2 $0, lo;
        cvt.rn.f16x2.e4m3x2 $1, hi;
        }
        """,
        constraints="=r,=r,r",
        args=[x],
        dtype=(tl.float16, tl.float16),
        is_pure=True,
        pack=2,
    )


@triton.jit
def _nvfp4_tile(raw, sc):
    """``raw [BN, D/2]`` uint8, ``sc [BN, D/16]`` E4M3 -> ``[BN, D]`` fp16 ``value * 2**-7 / g`` in natural order.

    The block scale (times 2**7, exact in fp16, see ``_common``) multiplies the tile as packed HMUL2.
    """
    BN: tl.constexpr = raw.shape[0]
    HALF: tl.constexpr = raw.shape[1]
    NB: tl.constexpr = HALF // 8
    lo, hi = _nvfp4_pair(tl.reshape(raw, [BN, NB, 8]), sc)
    # join puts (even, odd) pairs innermost: column = block*16 + 2*e + (0 | 1) = natural order
    return tl.reshape(tl.join(lo, hi), [BN, 2 * HALF])


@triton.jit
def _nvfp4_rows(data_ptr, scale_ptr, row, srow, nmask, D: tl.constexpr, MASKED: tl.constexpr):
    """``BN`` gathered NVFP4 rows as stored: bytes ``[BN, D/2]`` and E4M3 scales ``[BN, D/16]`` (MASKED:
    masked rows read as zeros)."""
    offs = tl.arange(0, D // 2)
    offs_s = tl.arange(0, D // 16)
    if MASKED:
        raw = tl.load(data_ptr + row[:, None] + offs[None, :], mask=nmask[:, None], other=0)
        sc = tl.load(scale_ptr + srow[:, None] + offs_s[None, :], mask=nmask[:, None], other=0.0)
    else:
        raw = tl.load(data_ptr + row[:, None] + offs[None, :])
        sc = tl.load(scale_ptr + srow[:, None] + offs_s[None, :])
    return raw, sc


@triton.jit
def _load_tile(data_ptr, scale_ptr, row, srow, nmask, D: tl.constexpr, FMT: tl.constexpr, CONV: tl.constexpr,
               INTERP: tl.constexpr, MASKED: tl.constexpr, IS_V: tl.constexpr):  # fmt: skip
    """``BN`` gathered rows -> ``[BN, D]`` tile for ``tl.dot``: fp16 for FP8/NVFP4, own dtype (fp32 if INTERP) else.

    FP8 with ``CONV & 1`` (V) / ``CONV & 2`` (K): the tile loads as uint16 pairs and converts through
    ``fp8_pairs_to_f16_asm``; else ``.to(tl.float16)``.

    NOTE: masked rows read as zeros: stale V bytes could hold NaN and 0 * NaN would poison the sum.
    """
    if FMT == 2:
        raw, sc = _nvfp4_rows(data_ptr, scale_ptr, row, srow, nmask, D, MASKED)
        x = _nvfp4_tile(raw, sc)
    elif FMT == 1 and ((IS_V and CONV & 1) or (not IS_V and CONV & 2)):
        BN: tl.constexpr = row.shape[0]
        offs = tl.arange(0, D // 2)
        p16 = data_ptr.to(tl.pointer_type(tl.uint16)) + (row // 2)[:, None] + offs[None, :]  # rows are even
        if MASKED:
            raw = tl.load(p16, mask=nmask[:, None], other=0)
        else:
            raw = tl.load(p16)
        a, b = fp8_pairs_to_f16_asm(raw)
        x = tl.reshape(tl.join(a, b), [BN, D])
    else:
        offs = tl.arange(0, D)
        if MASKED:
            x = tl.load(data_ptr + row[:, None] + offs[None, :], mask=nmask[:, None], other=0.0)
        else:
            x = tl.load(data_ptr + row[:, None] + offs[None, :])
        if FMT == 1:
            x = x.to(tl.float16)  # one cvt.rn.f16x2.e4m3x2 per 2 values on sm_90
        elif INTERP:
            x = x.to(tl.float32)  # NOTE: the interpreter's bf16 tl.dot is wrong
    return x


@triton.jit
def _tok_block(
    n0, end, q, m, l, acc, qk_scale, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_tok, sc_page, sc_tok,
    head_off, shead_off, pt_ptr,
    D: tl.constexpr, PAGE: tl.constexpr, BN: tl.constexpr, FMT: tl.constexpr, CONV: tl.constexpr,
    INTERP: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    """Keys ``[n0, n0 + BN)``: gather, dequantize, one online-softmax step (MASKED: keys >= end masked)."""
    idx = n0 + tl.arange(0, BN)
    nmask = idx < end
    if MASKED:  # NOTE: mask the page-table read too (the interpreter does not catch out-of-bounds loads)
        page = tl.load(pt_ptr + idx // PAGE, mask=nmask, other=0).to(tl.int64)
    else:
        page = tl.load(pt_ptr + idx // PAGE).to(tl.int64)
    tok = (idx % PAGE).to(tl.int64)
    row = page * s_page + head_off + tok * s_tok
    if FMT == 2:
        # NOTE: the scale row stride as a constexpr (D/16 bytes, packed pages): a runtime 8 would tell
        # Triton nothing about alignment, and then it neither vectorizes nor pipelines (cp.async) the
        # scale loads -- seen in the TTGIR as a plain tt.load waiting a full memory latency per block.
        srow = page * sc_page + shead_off + tok * (D // 16)
    else:
        srow = row
    k = _load_tile(k_ptr, ks_ptr, row, srow, nmask, D, FMT, CONV, INTERP, MASKED, False)
    v = _load_tile(v_ptr, vs_ptr, row, srow, nmask, D, FMT, CONV, INTERP, MASKED, True)
    # q [BH, D]; scores [BH, BN]; acc [BH, D]
    s = tl.dot(q, tl.trans(k)) * qk_scale
    if MASKED:
        s = tl.where(nmask[None, :], s, float("-inf"))
    return softmax_update(s, v, m, l, acc)


@triton.jit
def _tok_segment(
    q_ptr, s_qh, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_head, s_tok, sc_page, sc_head, sc_tok,
    pt_ptr, start, end, h, qk_scale, out_scale, o_ptr, lse_ptr, s_os,
    G: tl.constexpr, BH: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, BN: tl.constexpr,
    FMT: tl.constexpr, CONV: tl.constexpr, INTERP: tl.constexpr,
):  # fmt: skip
    """Attend the group's query rows over tokens ``[start, end)`` of one pool; store partial o / lse."""
    offs_g = tl.arange(0, BH)
    gmask = offs_g < G
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + (h * G + offs_g)[:, None] * s_qh + offs_d[None, :], mask=gmask[:, None], other=0.0)
    if FMT != 0:
        q = q.to(tl.float16)  # the dequantized K/V tiles are fp16
    elif INTERP:
        q = q.to(tl.float32)
    else:  # NOTE: tl.dot needs both operands in one dtype: an fp32 q over a bf16 pool failed to compile
        q = q.to(k_ptr.dtype.element_ty)
    m = tl.full([BH], float("-inf"), tl.float32)
    l = tl.zeros([BH], tl.float32)
    acc = tl.zeros([BH, D], tl.float32)
    head_off = h.to(tl.int64) * s_head
    shead_off = h.to(tl.int64) * sc_head
    full_end = start + (end - start) // BN * BN
    if (
        INTERP
    ):  # NOTE: triton 3.6's interpreter cannot run `for` over loaded bounds; GPUs need `for` to pipeline
        n0 = start
        while n0 < full_end:
            m, l, acc = _tok_block(
                n0, end, q, m, l, acc, qk_scale, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_tok, sc_page, sc_tok,
                head_off, shead_off, pt_ptr, D, PAGE, BN, FMT, CONV, INTERP, False,
            )  # fmt: skip
            n0 += BN
    else:
        for n0 in range(start, full_end, BN):
            m, l, acc = _tok_block(
                n0, end, q, m, l, acc, qk_scale, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_tok, sc_page, sc_tok,
                head_off, shead_off, pt_ptr, D, PAGE, BN, FMT, CONV, INTERP, False,
            )  # fmt: skip
    if full_end < end:
        m, l, acc = _tok_block(
            full_end, end, q, m, l, acc, qk_scale, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_tok, sc_page, sc_tok,
            head_off, shead_off, pt_ptr, D, PAGE, BN, FMT, CONV, INTERP, True,
        )  # fmt: skip
    # An empty segment stores lse = -inf and o = 0, which the combine step weighs as nothing.
    inv = tl.where(l > 0, out_scale / tl.maximum(l, 1e-30), 0.0)
    lse = tl.where(l > 0, m + tl.log2(tl.maximum(l, 1e-30)), float("-inf"))
    o_ptrs = o_ptr + offs_g[:, None] * s_os + offs_d[None, :]
    tl.store(o_ptrs, acc * inv[:, None], mask=gmask[:, None])
    tl.store(lse_ptr + offs_g * (s_os // D), lse, mask=gmask)


@triton.jit
def _halves(data_ptr, scale_ptr, row, srow, nmask, D: tl.constexpr, FMT: tl.constexpr, CONV: tl.constexpr,
            MASKED: tl.constexpr):  # fmt: skip
    """``BN`` gathered rows -> (even columns, odd columns) as two fp16 ``[BN, D/2]`` tiles, never joined.

    NVFP4: low / high nibbles (times the block scale); FP8: the two bytes of each uint16 pair.
    Why: joining the halves back to natural order costs a byte permute (PRMT) per 2 values and moves the
    tile through a layout conversion; the dots consume the halves as they are (see ``_split_block``).
    """
    HALF: tl.constexpr = D // 2
    BN: tl.constexpr = row.shape[0]
    offs = tl.arange(0, HALF)
    if FMT == 2:
        NB: tl.constexpr = D // 16
        raw, sc = _nvfp4_rows(data_ptr, scale_ptr, row, srow, nmask, D, MASKED)
        lo, hi = _nvfp4_pair(tl.reshape(raw, [BN, NB, 8]), sc)
        a = tl.reshape(lo, [BN, HALF])
        b = tl.reshape(hi, [BN, HALF])
    else:
        p16 = data_ptr.to(tl.pointer_type(tl.uint16)) + (row // 2)[:, None] + offs[None, :]  # rows are even
        if MASKED:
            raw = tl.load(p16, mask=nmask[:, None], other=0)
        else:
            raw = tl.load(p16)
        if CONV == 0:  # plain Triton (interpreter): split the uint16 into its two float8 bytes
            a = (raw & 255).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
            b = (raw >> 8).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
        else:
            a, b = fp8_pairs_to_f16_asm(raw)
    return a, b


@triton.jit
def _split_block(
    n0, end, q, qa, qb, m, l, acc_a, acc_b, qk_scale, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_tok, sc_page,
    head_off, shead_off, pt_ptr,
    D: tl.constexpr, PAGE: tl.constexpr, BN: tl.constexpr, FMT: tl.constexpr, CONV: tl.constexpr,
    INTERP: tl.constexpr, MASKED: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    """Like ``_tok_block`` (S = Q K^T) with V -- and with SPLIT=2 for NVFP4 also K -- as (even, odd) halves.

    ``acc_a / acc_b [BH, D/2]`` accumulate the even / odd output columns; split NVFP4 scores are
    ``qa ka^T + qb kb^T`` (Q's even / odd columns), else ``q k^T`` with K in natural order.
    NOTE (sm_90 SASS, triton 3.6): split K halves get their conversion moved after a shared-memory load
    in the MMA operand layout (bytes unpacked and repacked one by one); the joined natural-order K does not.
    """
    idx = n0 + tl.arange(0, BN)
    nmask = idx < end
    if MASKED:
        page = tl.load(pt_ptr + idx // PAGE, mask=nmask, other=0).to(tl.int64)
    else:
        page = tl.load(pt_ptr + idx // PAGE).to(tl.int64)
    tok = (idx % PAGE).to(tl.int64)
    row = page * s_page + head_off + tok * s_tok
    srow = page * sc_page + shead_off + tok * (D // 16)  # NOTE: constexpr stride, see _tok_block
    if FMT == 2 and SPLIT == 2:
        ka, kb = _halves(k_ptr, ks_ptr, row, srow, nmask, D, FMT, CONV, MASKED)
        s = tl.dot(qa, tl.trans(ka))
        s = tl.dot(qb, tl.trans(kb), s)
    else:
        k = _load_tile(
            k_ptr, ks_ptr, row, srow, nmask, D, FMT, 0, INTERP, MASKED, False
        )
        s = tl.dot(q, tl.trans(k))
    s = s * qk_scale
    if MASKED:
        s = tl.where(nmask[None, :], s, float("-inf"))
    va, vb = _halves(v_ptr, vs_ptr, row, srow, nmask, D, FMT, CONV, MASKED)
    m_new = tl.maximum(m, tl.max(s, axis=1))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(s - m_new[:, None])
    l = l * alpha + tl.sum(p, axis=1)
    p16 = p.to(tl.float16)
    acc_a = tl.dot(p16, va, acc_a * alpha[:, None])
    acc_b = tl.dot(p16, vb, acc_b * alpha[:, None])
    return m_new, l, acc_a, acc_b


@triton.jit
def _split_segment(
    q_ptr, s_qh, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_head, s_tok, sc_page, sc_head,
    pt_ptr, start, end, h, qk_scale, out_scale, o_ptr, lse_ptr, s_os,
    G: tl.constexpr, BH: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, BN: tl.constexpr,
    FMT: tl.constexpr, CONV: tl.constexpr, INTERP: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    """``_tok_segment`` for quantized pools with column halves (``split`` 1 or 2; ``_split_block``)."""
    HALF: tl.constexpr = D // 2
    offs_g = tl.arange(0, BH)
    gmask = offs_g < G
    offs_j = tl.arange(0, HALF)
    q_rows = q_ptr + (h * G + offs_g)[:, None] * s_qh
    q = tl.load(q_rows + tl.arange(0, D)[None, :], mask=gmask[:, None], other=0.0).to(tl.float16)
    qa = tl.load(q_rows + 2 * offs_j[None, :], mask=gmask[:, None], other=0.0).to(tl.float16)
    qb = tl.load(q_rows + 2 * offs_j[None, :] + 1, mask=gmask[:, None], other=0.0).to(tl.float16)
    m = tl.full([BH], float("-inf"), tl.float32)
    l = tl.zeros([BH], tl.float32)
    acc_a = tl.zeros([BH, HALF], tl.float32)
    acc_b = tl.zeros([BH, HALF], tl.float32)
    head_off = h.to(tl.int64) * s_head
    shead_off = h.to(tl.int64) * sc_head
    full_end = start + (end - start) // BN * BN
    if (
        INTERP
    ):  # NOTE: triton 3.6's interpreter cannot run `for` over loaded bounds; GPUs need `for` to pipeline
        n0 = start
        while n0 < full_end:
            m, l, acc_a, acc_b = _split_block(
                n0, end, q, qa, qb, m, l, acc_a, acc_b, qk_scale, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_tok,
                sc_page, head_off, shead_off, pt_ptr, D, PAGE, BN, FMT, CONV, INTERP, False, SPLIT,
            )  # fmt: skip
            n0 += BN
    else:
        for n0 in range(start, full_end, BN):
            m, l, acc_a, acc_b = _split_block(
                n0, end, q, qa, qb, m, l, acc_a, acc_b, qk_scale, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_tok,
                sc_page, head_off, shead_off, pt_ptr, D, PAGE, BN, FMT, CONV, INTERP, False, SPLIT,
            )  # fmt: skip
    if full_end < end:
        m, l, acc_a, acc_b = _split_block(
            full_end, end, q, qa, qb, m, l, acc_a, acc_b, qk_scale, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_tok,
            sc_page, head_off, shead_off, pt_ptr, D, PAGE, BN, FMT, CONV, INTERP, True, SPLIT,
        )  # fmt: skip
    inv = tl.where(l > 0, out_scale / tl.maximum(l, 1e-30), 0.0)
    lse = tl.where(l > 0, m + tl.log2(tl.maximum(l, 1e-30)), float("-inf"))
    o_rows = o_ptr + offs_g[:, None] * s_os
    tl.store(o_rows + 2 * offs_j[None, :], acc_a * inv[:, None], mask=gmask[:, None])
    tl.store(o_rows + 2 * offs_j[None, :] + 1, acc_b * inv[:, None], mask=gmask[:, None])
    tl.store(lse_ptr + offs_g * (s_os // D), lse, mask=gmask)


@triton.jit
def decode_tok_kernel(
    q_ptr, s_qb, s_qh,
    k_ptr, v_ptr, ks_ptr, vs_ptr, g_ptr,
    s_page, s_head, s_tok, sc_page, sc_head, sc_tok,
    pt_ptr, s_pt, lens_ptr,
    tk_ptr, tv_ptr, t_page, t_head, t_tok, tpt_ptr, s_tpt, tlens_ptr,
    o_ptr, lse_ptr, sm_scale,
    HQ: tl.constexpr, G: tl.constexpr, BH: tl.constexpr, D: tl.constexpr,
    PAGE: tl.constexpr, TPAGE: tl.constexpr, BN: tl.constexpr, TBN: tl.constexpr,
    NUM_SPLITS, HAS_TAIL: tl.constexpr,
    FMT: tl.constexpr, CONV: tl.constexpr, INTERP: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    """Same arguments and partial-output layout as ``decode._decode_kernel`` (its combine step merges them)."""
    b, h, sp, S_TOT, q_base, o_base, lse_base = split_slot(
        q_ptr, s_qb, o_ptr, lse_ptr, NUM_SPLITS, HQ, G, D, HAS_TAIL,
    )  # fmt: skip
    if HAS_TAIL and sp < 0:
        n = tl.load(tlens_ptr + b)
        _tok_segment(
            q_base, s_qh, tk_ptr, tv_ptr, tk_ptr, tv_ptr, t_page, t_head, t_tok, 0, 0, 0,
            tpt_ptr + b.to(tl.int64) * s_tpt, 0, n, h, sm_scale * 1.4426950408889634, 1.0,
            o_base, lse_base, S_TOT * D,
            G, BH, D, TPAGE, TBN, 0, 0, INTERP,
        )  # fmt: skip
    else:
        start, end = split_range(tl.load(lens_ptr + b), sp, NUM_SPLITS, BN)
        gk, gv = global_scales(g_ptr, FMT)
        if SPLIT:
            _split_segment(
                q_base, s_qh, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_head, s_tok, sc_page, sc_head,
                pt_ptr + b.to(tl.int64) * s_pt, start, end, h, sm_scale * 1.4426950408889634 * gk, gv,
                o_base, lse_base, S_TOT * D,
                G, BH, D, PAGE, BN, FMT, CONV, INTERP, SPLIT,
            )  # fmt: skip
        else:
            _tok_segment(
                q_base, s_qh, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_head, s_tok, sc_page, sc_head, sc_tok,
                pt_ptr + b.to(tl.int64) * s_pt, start, end, h, sm_scale * 1.4426950408889634 * gk, gv,
                o_base, lse_base, S_TOT * D,
                G, BH, D, PAGE, BN, FMT, CONV, INTERP,
            )  # fmt: skip
