"""NVFP4 paged decode with hand-placed tensor-core fragments (``DecodeKernel.MMA`` of ``decode_triton``).

Why: Triton's ``tl.dot`` path (``decode_tok``) pads the GQA group to 16 rows, re-reads Q from shared
memory every block and sends the dequantized V tile through shared memory for a transpose; at 4 bits
that glue, not the bytes, sets the speed (0.22-0.31 of the H200's read ceiling). Here every value goes
from global memory straight into the register that ``mma.sync.m16n8k16`` reads, converted in place:

* The program is ``NW`` warps; each warp owns 16-token tiles and keeps its own softmax state, written
  as its own split (slot ``sp * NW + warp``; ``decode.combine._combine_kernel`` merges all slots).
* Every tensor is ``[32 * NW]``: one element per thread (Triton's default 1-D layout), so lane ``L``
  (``g = L // 4``, ``t = L % 4``) holds exactly its PTX fragment registers. NOTE: this holds only while
  no op gives these tensors another layout -- addresses are never contiguous across lanes (no vectorized
  load layout), and there are no Triton reductions; the warp-collective steps are inline PTX.
* Scores as ``S^T = K Q^T``: the K tile ``[16 tokens, 16 dims]`` is the A operand (rows = tokens ``g``,
  ``g + 8``), ``Q^T`` the loop-invariant B operand ``[16 dims, 8 heads]`` (GQA groups up to 8, no
  16-row padding). Lane ``t`` loads bytes ``[16t, 16t + 16)`` of each key row (blocks ``2t``, ``2t + 1``):
  k-step ``kk`` uses word ``kk // 2``; Q is gathered once in the same permuted dim order.
* ``O^T += V^T P^T``: V's A operand wants token pairs per register; lane ``(g, t)`` loads block ``g``
  (8 bytes) of tokens ``2t, 2t+1, 2t+8, 2t+9`` and ``prmt`` pairs two tokens' 16-bit halves, so each
  converted half2 is (token ``2t``, token ``2t+1``) of one dim, and the V block scales of those two tokens
  form one half2 too. ``P^T`` comes from the score fragment by one ``movmatrix.trans`` per 8 tokens.
* The pool keeps NVFP4 words in sm bit order (``nibblekv.formats.sm_words``): 6 masks, a shift and two
  multiplies make a word's 8 nibbles 4 half2 of fp16 bits ``value * 2**-14`` (``ptx.mma._cvt_word_sm``);
  the block scale multiplies as half2 (exact but for products under 2**-14 with scales under 2**-10, see
  ``_cvt_word_sm``). V pairs two tokens' low (high) 16-bit halves with one ``prmt``. Why not E4M3 bytes +
  ``cvt.rn.f16x2.e4m3x2`` on the standard order (the first form of this kernel): that is 9 ALU-pipe ops a
  word, this 6, and Hopper's ALU pipe issues at half rate -- it, not the instruction count, limited the
  kernel.

GPU only (sm_89+: E4M3 conversion, ``movmatrix``); head_dim 128, GQA group <= 8, NVFP4 pools with packed
scale rows (head_dim 64: ``PAIR`` below; 256: ``decode.mma256``, the same step on two 128-dim halves).
Under the interpreter each PTX helper has a Triton twin on the same packed registers.
"""

from __future__ import annotations

import triton
import triton.language as tl

from nibblekv.kernels.decode._mma_ring import _ring_close, _ring_next, _ring_start, _ring_tile, _run_addr
from nibblekv.kernels.decode._mma_step import _finish, _run_step
from nibblekv.kernels.decode._mma_tile import (
    _l2_pages,
    _l2_prefetch,
    _load_tile,
    _online_init,
    _q_frags,
    _warp_lanes,
)
from nibblekv.kernels.decode.mma16 import _mma16_segment
from nibblekv.kernels.decode.mma256 import _mma256_segment
from nibblekv.kernels.decode.mma256_tail import _mma_tail256
from nibblekv.kernels.decode.mma_tail import _mma_tail
from nibblekv.kernels.ptx.ring import _ring_src


@triton.jit
def _mma_segment(
    q_ptr, s_qh, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_head, sc_page, sc_head,
    pt_ptr, start, end, end1, h, qk_scale, out_scale, o_ptr, lse_ptr, s_oh,
    G: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, NW: tl.constexpr, TPI: tl.constexpr, PF: tl.constexpr,
    PAIR: tl.constexpr = 0, VST: tl.constexpr = 0, VQ: tl.constexpr = 0,
    L2: tl.constexpr = 0, LZ: tl.constexpr = 0, L2B: tl.constexpr = 0, SMS: tl.constexpr = 0,
):  # fmt: skip
    """Each warp attends its tiles of ``[start, end)`` (``TPI`` 16-token tiles per softmax step; ``PF`` = 1:
    the next step's bytes load during this one) and stores its partial o / lse at ``o_ptr + w * D`` /
    ``lse_ptr + w`` (``s_oh`` = elements between two heads' partials).

    ``PAIR``: a head_dim-64 pool read as head_dim 128 -- each "row" is two consecutive tokens (their bytes
    and scale bytes are adjacent), rows ``[start, end)``, the second token valid below row ``end1``. The 8
    fragment columns are (head ``c // 2``, token parity ``c % 2``): Q of head ``c // 2`` sits in dims
    ``[64 p, 64 p + 64)`` and zeros elsewhere, so column (h, p) scores exactly the tokens of parity p, and
    its output is dims ``[64 p, 64 p + 64)`` of O^T (the other half mixes the wrong tokens and is dropped).
    Each (head, parity) is its own softmax partial: slots ``2 w`` and ``2 w + 1`` of ``D / 2`` dims; the
    combine step merges them like splits. GQA groups <= 4.

    ``VST``: the partial o as 16-byte vector stores (8 per lane) instead of 32 scalar ones, each of which
    touches 32 sectors -- the whole grid stores at once at its end (one wave), so the epilogue is a burst.
    ``VQ``: Q (bf16, rows 16-byte aligned) as 4 vector loads per lane, for the same reason at the start.
    ``L2`` (16-row pages, no PAIR): ``decode_mma16``'s L2 prefetch of the tiles ``L2`` steps ahead (with
    ``PF``: gained nothing at 16 programs per SM, opt-in for 12); without ``PF`` each step then loads its
    registers from L2 (no registers hold the next step: fewer of them). ``L2B`` > 0: each tile's prefetch
    is one bulk copy of its (page, KV head) run of that many bytes (``_l2_prefetch``).
    ``LZ`` > 0: the lazy softmax (``_mma_step._step_max``; ``DecodeConfig.lazy_rescale``).
    ``SMS`` > 0 (``DecodeConfig.smem_stages``; one warp, 16-row pages in the pool's page layout, no PAIR,
    ``PF`` and ``L2`` off): the full steps' tiles come through a shared-memory ring of ``SMS`` stages
    (``ptx.ring``), ``SMS - 1`` steps ahead, each tile's (page, KV head) run one bulk copy.
    """
    lane, warp, g, t, k64, v64, ks16, vs8, hoff, shoff = _warp_lanes(
        k_ptr, v_ptr, ks_ptr, vs_ptr, h, s_head, sc_head, NW,
    )  # fmt: skip
    # Q^T B-fragments, loop-invariant: lane (g, t) holds head g, dims [32t, 32t + 32) in k-step order
    if PAIR:  # column g = (head g // 2, parity g % 2): dims [64 p, 64 p + 64) hold that head's Q
        qm = (g // 2 < G) & (t // 2 == g % 2)
        qrow = q_ptr + (h * G + g // 2) * s_qh - 64 * (g % 2)
    else:
        qm = g < G
        qrow = q_ptr + (h * G + g) * s_qh
    # NOTE: with VQ the lane's 32 dims are 64 contiguous bytes: 4 vector loads instead of 32 scattered ones
    q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13, q14, q15 = _q_frags(qrow + 32 * t, qm, VQ)
    m0, m1, l0, l1, z = _online_init(32 * NW)
    o00, o01, o02, o03 = z, z, z, z
    o10, o11, o12, o13 = z, z, z, z
    o20, o21, o22, o23 = z, z, z, z
    o30, o31, o32, o33 = z, z, z, z
    o40, o41, o42, o43 = z, z, z, z
    o50, o51, o52, o53 = z, z, z, z
    o60, o61, o62, o63 = z, z, z, z
    o70, o71, o72, o73 = z, z, z, z
    STEP: tl.constexpr = 16 * NW * TPI
    full_end = start + (end1 - start) // STEP * STEP  # NOTE: end1 == end unless PAIR
    lim = full_end
    lim1 = full_end
    if L2 > 0 and PAGE == 16 and PAIR == 0:  # the first L2 prefetch's pages (as decode_mma16's)
        pl = _l2_pages(pt_ptr, start, L2 * STEP, full_end, lane, warp, TPI, PAGE)
    if SMS > 0:
        tl.static_assert((NW == 1) & (PAGE == 16) & (PAIR == 0), "the ring: one warp, one page a tile")
        RUN: tl.constexpr = 32 * (D // 2 + D // 16)  # a tile's K and V runs: rows and scales
        kbase = (k64 + (hoff >> 3)).to(tl.int64)
        ring, bars, nsteps, pn = _ring_start(
            lane, kbase, start, full_end, pt_ptr, s_page, m0, SMS, TPI, RUN, PAGE,
        )  # fmt: skip
        i = nsteps * 0
    if PF:
        nb = start + 16 * TPI * warp
        rawA = _load_tile(
            k64, v64, ks16, vs8, pt_ptr, nb, full_end, full_end, hoff, shoff, s_page, sc_page, g, t,
            PAGE, D, True, PAIR,
        )
        rawB = rawA
        if TPI == 2:
            rawB = _load_tile(
                k64, v64, ks16, vs8, pt_ptr, nb + 16, full_end, full_end, hoff, shoff, s_page, sc_page, g, t,
                PAGE, D, True, PAIR,
            )
    n0 = start
    while (
        n0 < full_end
    ):  # NOTE: `while`, not `for`: triton 3.6's interpreter cannot run `for` over loaded bounds
        nb = n0 + 16 * TPI * warp
        if L2 > 0 and PAGE == 16 and PAIR == 0:  # NOTE: pl holds the pages of step n0 + L2 * STEP
            _l2_prefetch(k64, v64, ks16, vs8, pl, hoff, shoff, s_page, sc_page, lane, TPI, PAGE, D, L2B)
            pl = _l2_pages(pt_ptr, n0, (L2 + 1) * STEP, full_end, lane, warp, TPI, PAGE)
        if SMS > 0:  # NOTE: the stage read last step is refilled only after that step's m0 exists
            sb, pn = _ring_next(
                ring, bars, i, nsteps, pn, start, pt_ptr, kbase, s_page, lane, m0, SMS, TPI, RUN, PAGE,
            )  # fmt: skip
            rawA = _ring_tile(_ring_src(sb, _run_addr(pt_ptr, nb, kbase, s_page, PAGE)), g, t, D)
            rawB = rawA
            if TPI == 2:
                srcB = _ring_src(sb + RUN, _run_addr(pt_ptr, nb + 16, kbase, s_page, PAGE))
                rawB = _ring_tile(srcB, g, t, D)
            i += 1
        elif PF:  # prefetch the next step (the current tiles again on the last step: no mask needed)
            nxt = tl.where(n0 + STEP < full_end, n0 + STEP, n0) + 16 * TPI * warp
            nextA = _load_tile(
                k64, v64, ks16, vs8, pt_ptr, nxt, full_end, full_end, hoff, shoff, s_page, sc_page, g, t,
                PAGE, D, False, PAIR,
            )
            nextB = nextA
            if TPI == 2:
                nextB = _load_tile(
                    k64, v64, ks16, vs8, pt_ptr, nxt + 16, full_end, full_end, hoff, shoff, s_page, sc_page,
                    g, t, PAGE, D, False, PAIR,
                )
        else:
            rawA = _load_tile(
                k64, v64, ks16, vs8, pt_ptr, nb, full_end, full_end, hoff, shoff, s_page, sc_page, g, t,
                PAGE, D, False, PAIR,
            )
            rawB = rawA
            if TPI == 2:
                rawB = _load_tile(
                    k64, v64, ks16, vs8, pt_ptr, nb + 16, full_end, full_end, hoff, shoff, s_page, sc_page,
                    g, t, PAGE, D, False, PAIR,
                )
        (
            m0, m1, l0, l1, o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33,
            o40, o41, o42, o43, o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
        ) = _run_step(
            rawA, rawB, nb, lim, lim1, qk_scale, m0, m1, l0, l1, q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11,
            q12, q13, q14, q15, o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33,
            o40, o41, o42, o43, o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73, TPI, False, LZ,
        )  # fmt: skip
        if PF:
            rawA = nextA
            rawB = nextB
        n0 += STEP
    # the rest (< STEP tokens): one masked tile per warp and step
    lim = end
    lim1 = end1
    while n0 < end:
        nb = n0 + 16 * warp
        rawA = _load_tile(
            k64, v64, ks16, vs8, pt_ptr, nb, end, end1, hoff, shoff, s_page, sc_page, g, t,
            PAGE, D, True, PAIR,
        )
        (
            m0, m1, l0, l1, o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33,
            o40, o41, o42, o43, o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
        ) = _run_step(
            rawA, rawA, nb, lim, lim1, qk_scale, m0, m1, l0, l1, q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11,
            q12, q13, q14, q15, o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33,
            o40, o41, o42, o43, o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73, 1, True, LZ,
        )  # fmt: skip
        n0 += 16 * NW
    if SMS > 0:
        _ring_close(bars, lane, m0, SMS)
    _finish(
        m0, m1, l0, l1, out_scale, o_ptr, lse_ptr, s_oh, g, t, warp, G, D, PAIR, VST,
        o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
        o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
    )  # fmt: skip


@triton.jit
def mma_chunk(n, num_splits, MINC: tl.constexpr):
    """Tokens per split of a ``n``-token context (16-token tiles, >= ``MINC``); shared with the combine step."""
    return tl.maximum(tl.cdiv(tl.cdiv(n, num_splits), 16) * 16, MINC)


@triton.jit
def dyn_splits(act, max_splits, warp_slots, warps_per_req, reserve_per_req):
    """Splits per (request, KV head) when ``act`` requests are real: ``warp_slots`` one-warp programs, less
    ``reserve_per_req`` per request (0 in every launch), shared out in splits of
    ``warps_per_req`` (rounded down: whole waves), at least 1, at most ``max_splits`` (the grid's). NOTE: the
    host twin is ``decode.config.mma_num_splits``; the combine step calls this one with the same arguments."""
    a = tl.maximum(act, 1)
    return tl.maximum(1, tl.minimum(max_splits, (warp_slots - a * reserve_per_req) // (a * warps_per_req)))


@triton.jit
def decode_mma_kernel(
    q_ptr, s_qb, s_qh,
    k_ptr, v_ptr, ks_ptr, vs_ptr, g_ptr,
    s_page, s_head, s_tok, sc_page, sc_head, sc_tok,
    pt_ptr, s_pt, lens_ptr,
    tk_ptr, tv_ptr, t_page, t_head, t_tok, tpt_ptr, s_tpt, tlens_ptr,
    o_ptr, lse_ptr, sm_scale,
    HQ: tl.constexpr, G: tl.constexpr, BH: tl.constexpr, D: tl.constexpr,
    PAGE: tl.constexpr, TPAGE: tl.constexpr, BN: tl.constexpr, TBN: tl.constexpr,
    NUM_SPLITS, HAS_TAIL: tl.constexpr, FMT: tl.constexpr, INTERP: tl.constexpr, NW: tl.constexpr,
    TPI: tl.constexpr = 1, PF: tl.constexpr = 1, MINC: tl.constexpr = 16, PAIR: tl.constexpr = 0,
    VST: tl.constexpr = 0, VQ: tl.constexpr = 0, TAIL_MMA: tl.constexpr = 0,
    act_ptr=None, warp_slots=0, reserve_per_req=0, DYN: tl.constexpr = 0,
    TPP: tl.constexpr = 0,
    L2: tl.constexpr = 0, qr_ptr=None, s_qt=0, s_qr=0, qcu_ptr=None, q_last=0, QG: tl.constexpr = 0,
    QNG: tl.constexpr = 1, LZ: tl.constexpr = 0, L2B: tl.constexpr = 0, SMS: tl.constexpr = 0,
):  # fmt: skip
    """``decode._decode_kernel``'s arguments (the tail ones used with ``TAIL_MMA``); grid ``(B, kv_heads, NUM_SPLITS)``, ``NW``
    warps. ``PAIR``: a head_dim-64 pool viewed as head_dim ``D`` = 128 with two tokens a row (``PAGE`` =
    rows per page, ``lens`` still in tokens; see ``_mma_segment``): twice the slots, ``D / 2`` dims each.

    Partial slots per head: ``NUM_SPLITS * NW`` (split ``sp``, warp ``w`` -> slot ``sp * NW + w``), then with
    ``HAS_TAIL`` the tail's slots: with ``TAIL_MMA`` > 0 the grid has that many more splits ``sp >=
    NUM_SPLITS``, one-warp programs each attending whole 16-row tiles of the tail into a slot of their own
    (two with ``PAIR``: one per parity), else one slot written by :func:`decode_tail_kernel` (its own
    launch). ``BN`` is
    unused here (tiles are 16 tokens); ``s_tok``/``sc_tok`` must be ``D / 2`` / ``D / 16`` (checked by the
    launcher).

    ``DYN`` (CUDA graphs replayed with padding rows): a 1-D grid of ``B * kv_heads * (NUM_SPLITS +
    TAIL_MMA)`` programs; only the first ``*act_ptr`` requests are real, and they get ``dyn_splits``
    (<= ``NUM_SPLITS``) splits each -- programs ``[0, act * kv_heads * splits)`` in (request, head, split)
    order, so the one wave holds only real work; the tail programs come after all split slots.
    ``TPP``: the tail program prefetches each next tile's page id (``_mma_tail``).

    ``L2``: ``decode_mma16``'s L2 prefetch distance in steps (``DecodeConfig.l2_ahead``; 0 = off); ``L2B``
    > 0: the head_dim-128 / 256 segments' prefetches as bulk copies of that many bytes a (page, KV head) run.
    ``LZ``: the lazy softmax rescale threshold of the head_dim-128 / 256 segments
    (``DecodeConfig.lazy_rescale``).
    ``QG`` > 0 (``decode_mma16`` only): Q rows from ``qr_ptr`` (``q [T, Hq, D]``, strides ``s_qt`` /
    ``s_qr``) through ``decode_triton``'s ``q_rows`` map -- request ``b`` is virtual: real request ``b //
    QNG`` (its first token ``qcu_ptr[b // QNG]``), columns from ``(b % QNG) * G``; ``q_ptr`` is unused.
    """
    HKV: tl.constexpr = HQ // G
    TM1: tl.constexpr = TAIL_MMA if TAIL_MMA > 0 else 1
    if DYN:
        pid = tl.program_id(0)
        act = tl.load(act_ptr)
        s_run = dyn_splits(act, NUM_SPLITS, warp_slots, HKV * NW, reserve_per_req)
        grid_main = tl.num_programs(0) - TAIL_MMA * (tl.num_programs(0) // (NUM_SPLITS + TAIL_MMA))
        if (pid >= act * HKV * s_run) & (pid < grid_main):
            return
        tail_prog = pid >= grid_main
        pair = tl.where(tail_prog, (pid - grid_main) // TM1, pid // s_run)
        sp = tl.where(tail_prog, NUM_SPLITS + (pid - grid_main) % TM1, pid % s_run)
        b = pair // HKV
        h = pair % HKV
        if b >= act:
            return
    else:
        b = tl.program_id(0)
        h = tl.program_id(1)
        sp = tl.program_id(2)
        s_run = NUM_SPLITS
    # NOTE: mirrored by decode.mma_tail_slots
    TAIL_SLOTS: tl.constexpr = HAS_TAIL * (TAIL_MMA * (1 + PAIR) if TAIL_MMA > 0 else 1)
    S_TOT = NUM_SPLITS * NW * (1 + PAIR) + TAIL_SLOTS
    DO: tl.constexpr = D // (1 + PAIR)
    q_base = q_ptr + b.to(tl.int64) * s_qb
    if TAIL_MMA:  # noqa: SIM102 - a constexpr: resolved at compile time, the inner test at run time
        if sp >= NUM_SPLITS:
            part = sp - NUM_SPLITS
            tail_first = (b.to(tl.int64) * HQ + h * G) * S_TOT + S_TOT - TAIL_SLOTS + part * (1 + PAIR)
            if D == 256:  # the same on two 128-dim halves (decode.mma256)
                _mma_tail256(
                    q_base, s_qh, tk_ptr, tv_ptr, t_page, t_head, t_tok, tpt_ptr + b.to(tl.int64) * s_tpt,
                    tl.load(tlens_ptr + b), h, sm_scale * 1.4426950408889634, o_ptr + tail_first * DO,
                    lse_ptr + tail_first, S_TOT * DO, G, TPAGE, VST, TPP, part, TAIL_MMA,
                )  # fmt: skip
            else:
                _mma_tail(
                    q_base, s_qh, tk_ptr, tv_ptr, t_page, t_head, t_tok, tpt_ptr + b.to(tl.int64) * s_tpt,
                    tl.load(tlens_ptr + b), h, sm_scale * 1.4426950408889634, o_ptr + tail_first * DO,
                    lse_ptr + tail_first, S_TOT * DO, G, D, TPAGE, VST, PAIR, TPP, part, TAIL_MMA,
                )  # fmt: skip
            return
    first = (b.to(tl.int64) * HQ + h * G) * S_TOT + sp * NW * (1 + PAIR)
    n = tl.load(lens_ptr + b)
    rows = (n + PAIR) // (1 + PAIR)
    # NOTE: splits are fixed per batch size (CUDA graphs); at least MINC tokens each keeps a short
    # context from spreading one tile per warp over all of them (the later splits stay empty)
    chunk = mma_chunk(rows, s_run, MINC)
    start = sp * chunk
    if start >= rows:  # NOTE: writes nothing; the combine step reads only the first cdiv(rows, chunk) splits
        return
    end = tl.minimum(start + chunk, rows)
    end1 = end
    if PAIR:
        end1 = tl.minimum(end, n // 2)  # an odd count: the last row's second token is not there
    # the decoded codes are value * 2**-14: fold that and the global scales into the fp32 factors
    gk = tl.load(g_ptr) * 16384.0
    gv = tl.load(g_ptr + 1) * 16384.0
    if G > 8:  # 9-16 columns: one S = Q K^T warp (decode_mma16)
        qtok0 = 0
        if QG > 0:
            q_base = qr_ptr
            s_qh = s_qr
            qtok0 = tl.load(qcu_ptr + b // QNG)
        _mma16_segment(
            q_base, s_qh, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_head, sc_page, sc_head,
            pt_ptr + b.to(tl.int64) * s_pt, start, end, end1, h, sm_scale * 1.4426950408889634 * gk, gv,
            o_ptr + first * DO, lse_ptr + first, S_TOT * DO,
            G, D, PAGE, NW, TPI, PF, PAIR, VST, VQ, L2,
            qtok0, (b % QNG) * G, s_qt, q_last, QG,
        )  # fmt: skip
    elif D == 256:  # the head_dim-128 step on two halves (decode.mma256)
        _mma256_segment(
            q_base, s_qh, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_head, sc_page, sc_head,
            pt_ptr + b.to(tl.int64) * s_pt, start, end, h, sm_scale * 1.4426950408889634 * gk, gv,
            o_ptr + first * DO, lse_ptr + first, S_TOT * DO,
            G, PAGE, NW, TPI, PF, VST, VQ, L2, LZ, L2B, SMS,
        )  # fmt: skip
    else:
        _mma_segment(
            q_base, s_qh, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_head, sc_page, sc_head,
            pt_ptr + b.to(tl.int64) * s_pt, start, end, end1, h, sm_scale * 1.4426950408889634 * gk, gv,
            o_ptr + first * DO, lse_ptr + first, S_TOT * DO,
            G, D, PAGE, NW, TPI, PF, PAIR, VST, VQ, L2, LZ, L2B, SMS,
        )  # fmt: skip
