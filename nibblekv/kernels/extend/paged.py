"""Extend (chunked-prefill) attention: new query tokens over their cached prefix, read in the cache dtype.

Grid ``(row blocks, B, kv_heads)``. A program owns ``BM`` rows of one request's chunk, a row being one
(query token, query head of the KV head's GQA group) pair, so every K/V byte read serves all ``G``
heads. It runs three phases with one online softmax: the main-pool prefix (NVFP4/FP8/BF16 pages,
dequantized in registers -- no workspace), the bf16 tail prefix, then the chunk's own fresh K/V with a
causal mask. Main-pool V is accumulated in stored units and rescaled once when that phase ends.
With ``num_splits = S > 1`` the grid's last axis is ``kv_heads * S``: split ``sp`` reads its share of
the main-pool prefix, the last split also the tail and the chunk, and each stores a partial (o, lse)
that decode's combine step merges.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nibblekv.formats.kv_view import PagedKV
from nibblekv.kernels._common import (
    check_cache,
    check_tail,
    fmt_code,
    global_scales,
    interpreting,
    load_kv_halves,
    load_v_rows,
    num_sms,
    online_softmax_step,
    scale_tensors,
    tail_operands,
)
from nibblekv.kernels.decode.combine import _combine_kernel, combine_chunk
from nibblekv.kernels.decode.config import combine_dim_block
from nibblekv.kernels.decode.launch import _pages_contiguous
from nibblekv.kernels.decode.paged import _decode_block


@triton.jit
def _load_q(q_ptr, rows_off, head_off, rmask, D: tl.constexpr, FMT: tl.constexpr):
    """Query rows split the way ``load_kv_halves`` splits keys of format FMT (even/odd or halves)."""
    HALF: tl.constexpr = D // 2
    offs = tl.arange(0, HALF)
    if FMT == 2:
        ca = offs * 2
        cb = offs * 2 + 1
    else:
        ca = offs
        cb = offs + HALF
    base = q_ptr + rows_off[:, None] + head_off[:, None]
    qa = tl.load(base + ca[None, :], mask=rmask[:, None], other=0.0)
    qb = tl.load(base + cb[None, :], mask=rmask[:, None], other=0.0)
    return qa, qb


@triton.jit
def _prefix_phase(qa, qb, m, l, acc, qk_scale, start, n, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_tok, sc_page,
                  sc_tok, head_off, shead_off, pt_ptr, D: tl.constexpr, PAGE: tl.constexpr, BN: tl.constexpr,
                  FMT: tl.constexpr, INTERP: tl.constexpr, PAGED: tl.constexpr):  # fmt: skip
    """Tokens ``[start, n)`` of one pool (no causal mask; ``start`` a multiple of ``BN``): unmasked full
    blocks, then one masked partial block."""
    full_end = start + (n - start) // BN * BN
    if INTERP:
        n0 = start
        while n0 < full_end:
            m, l, acc = _decode_block(
                n0, n, qa, qb, m, l, acc, qk_scale, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_tok, sc_page, sc_tok,
                head_off, shead_off, pt_ptr, D, PAGE, BN, FMT, INTERP, PAGED, False,
            )  # fmt: skip
            n0 += BN
    else:
        for n0 in range(start, full_end, BN):
            m, l, acc = _decode_block(
                n0, n, qa, qb, m, l, acc, qk_scale, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_tok, sc_page, sc_tok,
                head_off, shead_off, pt_ptr, D, PAGE, BN, FMT, INTERP, PAGED, False,
            )  # fmt: skip
    if full_end < n:
        m, l, acc = _decode_block(
            full_end, n, qa, qb, m, l, acc, qk_scale, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_tok, sc_page, sc_tok,
            head_off, shead_off, pt_ptr, D, PAGE, BN, FMT, INTERP, False, True,
        )  # fmt: skip
    return m, l, acc


@triton.jit
def _merge_loads(mo_ptr, mlse_ptr, mrow, rmask, D: tl.constexpr):
    """A block's rows of the partial to merge: (lse [BM], o [BM, D]); rows past the chunk weigh nothing."""
    lse = tl.load(mlse_ptr + mrow, mask=rmask, other=float("-inf"))
    o = tl.load(mo_ptr + mrow[:, None] * D + tl.arange(0, D)[None, :], mask=rmask[:, None], other=0.0)
    return lse, o


@triton.jit
def _own_block(k0, kend, t, qa, qb, m, l, acc, qk_scale, kn_ptr, vn_ptr, s_kt, kv_head_off,
               D: tl.constexpr, BN: tl.constexpr, INTERP: tl.constexpr):  # fmt: skip
    """Chunk keys ``[k0, k0 + BN)`` (fresh rows), causal: query token ``t`` sees keys ``<= t``."""
    idx = k0 + tl.arange(0, BN)
    kmask = idx < kend
    row = idx.to(tl.int64) * s_kt + kv_head_off
    ka, kb = load_kv_halves(kn_ptr, kn_ptr, row, row, kmask, D, 0, INTERP)
    v = load_v_rows(vn_ptr, vn_ptr, row, row, kmask, D, 0, INTERP)
    valid = kmask[None, :] & (idx[None, :] <= t[:, None])
    return online_softmax_step(qa, qb, ka, kb, v, valid, m, l, acc, qk_scale)


# NOTE: S (prefix splits) is a runtime argument, not a constexpr: the launcher picks it per batch from the
# grid size, and a serving engine sees many batch shapes -- as a constexpr each new value was a JIT compile
# of this kernel (seconds) inside a running step (an agentic sweep lost 7-10 s per row so).
# NOTE: s_tpt (the tail page table's row stride: the batch's most prefix tail pages) changes from batch
# to batch too; Triton would build the kernel again for each of == 1, % 16 == 0 (0 included) and other
# values -- compiles inside the first real requests (an offline-throughput run of SmolLM2 built
# _extend_kernel twice after the warm-up, H200). Index math only: nothing gains from it.
@triton.jit(do_not_specialize=["S", "s_tpt"])
def _extend_kernel(
    q_ptr, s_qt, s_qh, kn_ptr, vn_ptr, s_kt, s_kh, cu_ptr, out_ptr, s_ot, s_oh,
    k_ptr, v_ptr, ks_ptr, vs_ptr, g_ptr, s_page, s_head, s_tok, sc_page, sc_head, sc_tok, pt_ptr, s_pt, plens_ptr,
    tk_ptr, tv_ptr, t_page, t_head, t_tok, tpt_ptr, s_tpt, tlens_ptr, sm_scale, o_part, lse_part, lse_out,
    HQ: tl.constexpr, S, G: tl.constexpr, BM: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, TPAGE: tl.constexpr,
    BN: tl.constexpr, HAS_TAIL: tl.constexpr, FMT: tl.constexpr,
    INTERP: tl.constexpr, PAGED: tl.constexpr, TPAGED: tl.constexpr, OWN_STAGES: tl.constexpr = 0,
    WRITE_LSE: tl.constexpr = 0, mo_ptr=None, mlse_ptr=None, MERGE: tl.constexpr = 0, MGV: tl.constexpr = 1,
    MNG: tl.constexpr = 1,
):  # fmt: skip
    mb = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2) // S
    sp = tl.program_id(2) % S  # split of the main-pool prefix; the last one also runs phases 2 and 3
    s = tl.load(cu_ptr + b)
    c = tl.load(cu_ptr + b + 1) - s
    if mb * BM < c * G:
        r = mb * BM + tl.arange(0, BM)
        rmask = r < c * G
        t = r // G
        qrow = (s + t).to(tl.int64) * s_qt
        qhead = (h * G + r % G).to(tl.int64) * s_qh
        m = tl.full([BM], float("-inf"), tl.float32)
        l = tl.zeros([BM], tl.float32)
        acc = tl.zeros([BM, D], tl.float32)
        log2e = 1.4426950408889634

        if MERGE:  # NOTE: no main-pool pass: the merged partial covers that prefix (prefix_lens unread)
            # the partial's row in extend_decode's virtual batch; its loads go out now, beside the own keys'
            col = t * G + r % G
            mrow = (b.to(tl.int64) * MNG + col // MGV) * (HQ // G * MGV) + h * MGV + col % MGV
            lse1, o1 = _merge_loads(mo_ptr, mlse_ptr, mrow, rmask, D)
            qa, qb = _load_q(q_ptr, qrow, qhead, rmask, D, 0)
        else:
            # 1) main-pool prefix, in the cache dtype
            n = tl.load(plens_ptr + b)
            qa, qb = _load_q(q_ptr, qrow, qhead, rmask, D, FMT)
            gk, gv = global_scales(g_ptr, FMT)
            chunk = tl.cdiv(tl.cdiv(n, S), BN) * BN
            start = tl.minimum(sp * chunk, n)
            m, l, acc = _prefix_phase(
                qa, qb, m, l, acc, sm_scale * log2e * gk, start, tl.minimum(start + chunk, n), k_ptr, v_ptr,
                ks_ptr, vs_ptr, s_page, s_tok, sc_page,
                sc_tok, h.to(tl.int64) * s_head, h.to(tl.int64) * sc_head, pt_ptr + b.to(tl.int64) * s_pt,
                D, PAGE, BN, FMT, INTERP, PAGED,
            )  # fmt: skip
            acc = acc * gv  # main-pool V was accumulated in stored units
            if FMT != 0:
                qa, qb = _load_q(q_ptr, qrow, qhead, rmask, D, 0)

        # 2) tail prefix (bf16), 3) the chunk itself, causally
        last = sp == S - 1
        if HAS_TAIL and last:
            nt = tl.load(tlens_ptr + b)
            m, l, acc = _prefix_phase(
                qa, qb, m, l, acc, sm_scale * log2e, 0, nt, tk_ptr, tv_ptr, tk_ptr, tv_ptr, t_page, t_tok, 0, 0,
                h.to(tl.int64) * t_head, 0, tpt_ptr + b.to(tl.int64) * s_tpt,
                D, TPAGE, BN, 0, INTERP, TPAGED,
            )  # fmt: skip
        t_hi = tl.minimum(c - 1, (mb * BM + BM - 1) // G)
        kend = tl.where(last, t_hi + 1, 0)  # NOTE: the chunk's own keys belong to the last split alone
        kn_base = kn_ptr + s.to(tl.int64) * s_kt
        vn_base = vn_ptr + s.to(tl.int64) * s_kt
        if INTERP:
            k0 = 0
            while k0 < kend:
                m, l, acc = _own_block(k0, kend, t, qa, qb, m, l, acc, sm_scale * log2e, kn_base, vn_base, s_kt,
                                       h.to(tl.int64) * s_kh, D, BN, INTERP)  # fmt: skip
                k0 += BN
        elif OWN_STAGES > 0:  # NOTE: its own pipeline depth: at the kernel's 5 stages this loop's buffers
            # take 160 of 176 KiB of shared memory (one program per SM; sm_90 build)
            for k0 in tl.range(0, kend, BN, num_stages=OWN_STAGES):
                m, l, acc = _own_block(k0, kend, t, qa, qb, m, l, acc, sm_scale * log2e, kn_base, vn_base, s_kt,
                                       h.to(tl.int64) * s_kh, D, BN, INTERP)  # fmt: skip
        else:
            for k0 in range(0, kend, BN):
                m, l, acc = _own_block(k0, kend, t, qa, qb, m, l, acc, sm_scale * log2e, kn_base, vn_base, s_kt,
                                       h.to(tl.int64) * s_kh, D, BN, INTERP)  # fmt: skip

        if S == 1:
            if MERGE:  # the row's partial from extend_decode's prefix decode (its virtual batch, see there)
                mm = tl.maximum(m, lse1)  # m is finite: a query token sees at least itself
                w_own = tl.exp2(m - mm)
                w1 = tl.exp2(lse1 - mm)
                acc = acc * w_own[:, None] + o1 * w1[:, None]
                l = l * w_own + w1
                m = mm
            o = acc / l[:, None]
            optr = (
                out_ptr + (s + t).to(tl.int64)[:, None] * s_ot + (h * G + r % G).to(tl.int64)[:, None] * s_oh
            )
            tl.store(optr + tl.arange(0, D)[None, :], o.to(out_ptr.dtype.element_ty), mask=rmask[:, None])
            if WRITE_LSE:  # l > 0 always: a query token sees at least itself
                tl.store(lse_out + (s + t).to(tl.int64) * HQ + h * G + r % G, m + tl.log2(l), mask=rmask)
        else:  # a partial (o, lse) per split, merged by decode's combine step; an empty split weighs nothing
            inv = tl.where(l > 0, 1.0 / tl.maximum(l, 1e-30), 0.0)
            lse = tl.where(l > 0, m + tl.log2(tl.maximum(l, 1e-30)), float("-inf"))
            slot = ((s + t).to(tl.int64) * HQ + h * G + r % G) * S + sp
            tl.store(
                o_part + slot[:, None] * D + tl.arange(0, D)[None, :], acc * inv[:, None], mask=rmask[:, None]
            )
            tl.store(lse_part + slot, lse, mask=rmask)


def _check_merge(
    merge: tuple[torch.Tensor, torch.Tensor, int, int], bsz: int, hkv: int, d: int, cols: int
) -> None:
    o, lse, gv, ng = merge
    if gv < 1 or ng < 1 or gv * ng < cols:
        raise ValueError(f"merge: GV * NG = {gv} * {ng} must cover the {cols} columns of the longest chunk")
    want = (bsz * ng, hkv * gv)
    if (
        o.shape != (*want, d) or lse.shape != want or o.dtype != torch.float32 or lse.dtype != torch.float32
        or not (o.is_contiguous() and lse.is_contiguous())
    ):  # fmt: skip
        raise ValueError(f"merge needs contiguous float32 o {[*want, d]} and lse {list(want)}")


def _default_stages(d: int) -> int:
    """Pipeline depth that fits shared memory at BM=BN=64 (sm_90 compile: 180 KB at D=128 with 5 stages,
    229 KB at D=256 with 3, 360 KB at D=256 with 5 -- over the 227 KB limit)."""
    return 5 if d <= 128 else 2


DEFAULT_OWN_STAGES = 1


def auto_extend_splits(grid_programs: int) -> int:
    """Prefix splits for a grid of ``grid_programs`` (one per query block, request and KV head).

    NOTE: split only a grid that cannot give every SM a program: B=4 x 32K prefix with 64-token chunks
    (128 programs) ran 787 us at 1 split and 605 at 4; B=1 x 32K with a 512-token chunk (256 programs)
    1061 at 1 and 1218 at 4; B=32 x 8K with 16-token chunks (256) 285 at 1 and 383 at 4 (H200).
    Aim at two programs per SM (the default launch's occupancy).
    """
    sms = num_sms()
    if grid_programs > sms:
        return 1
    # a power of two: the combine step compiles once per split count (its slot tile is a constexpr)
    return min(8, triton.next_power_of_2(triton.cdiv(2 * sms, max(1, grid_programs))))


def extend_triton(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    kv: PagedKV,
    sm_scale: float,
    merge: tuple[torch.Tensor, torch.Tensor, int, int] | None = None,
    out: torch.Tensor | None = None,
    lse_out: torch.Tensor | None = None,
    num_splits: int | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    own_stages: int | None = None,
    max_registers: int | None = None,
) -> torch.Tensor:
    """Triton twin of ``extend_ref``: ``q [T, Hq, D]``, ``k_new/v_new [T, Hkv, D]`` -> ``[T, Hq, D]`` over the
    view ``kv`` (its ``cu_seqlens`` split the chunks; its lengths are the cached prefix's).

    ``kv.max_chunk`` (host int >= the longest chunk) avoids a device sync; the arguments override the config.
    ``num_splits`` (default :func:`auto_extend_splits`) splits each
    request's main-pool prefix over that many programs (flash-decoding for extend: a small batch of short
    chunks otherwise runs ``B * kv_heads`` programs, each streaming the whole prefix), merged by decode's
    combine step.
    ``own_stages`` (default 1; 0 = the kernel's ``num_stages``) pipelines the loop over the chunk's own keys
    apart from the prefix loops. ``max_registers`` (default: the
    compiler's choice) caps registers per thread, to fit more programs per SM. ``lse_out`` (fp32
    ``[T, Hq]``, contiguous) receives each row's log2-sum-exp2 of its scaled scores, for merging.
    ``merge = (o, lse, GV, NG)``: every row's attention over keys this call does not see (fp32
    ``o [B * NG, Hkv * GV, D]``, log2-domain ``lse [B * NG, Hkv * GV]``, contiguous; row ``(t, head)`` of
    request ``b`` is column ``t * G + head % G`` of the virtual batch in ``extend_decode``), merged into
    the output in the epilogue (``merge_ref``'s math); it needs one split (the default with ``merge``), and
    the main pool is not read (``kv.lens`` unused): ``merge`` covers that prefix.
    """
    cache, page_table, prefix_lens, cu_seqlens = kv.cache, kv.page_table, kv.lens, kv.cu_seqlens
    tail, tail_page_table, tail_prefix_lens = kv.tail, kv.tail_page_table, kv.tail_lens
    max_chunk = kv.max_chunk
    if cu_seqlens is None:
        raise ValueError("an extend's view needs cu_seqlens")
    check_cache(cache, "cache")
    lay = cache.layout
    hkv, d = lay.num_kv_heads, lay.head_dim
    if q.dim() != 3 or q.shape[2] != d or q.shape[1] % hkv or q.stride(-1) != 1:
        raise ValueError(f"q must be [T, Hq, {d}] with Hq % {hkv} == 0 and unit last stride")
    if k_new.shape != (q.shape[0], hkv, d) or v_new.shape != k_new.shape:
        raise ValueError(f"k_new/v_new must be [T, {hkv}, {d}]")
    if d < 16 or d & (d - 1):
        raise ValueError(f"head_dim must be a power of two >= 16, got {d}")
    if k_new.stride() != v_new.stride() or k_new.stride(-1) != 1:
        k_new, v_new = k_new.contiguous(), v_new.contiguous()
    bsz = cu_seqlens.numel() - 1
    if page_table.dim() != 2 or page_table.shape[0] != bsz or prefix_lens.shape != (bsz,):
        raise ValueError("page_table must be [B, pages] and prefix_lens [B]")
    page_table = page_table.contiguous()
    has_tail = tail is not None and tail_prefix_lens is not None
    if has_tail:
        assert tail is not None and tail_page_table is not None and tail_prefix_lens is not None
        check_tail(tail, hkv, d)
        tail_page_table = tail_page_table.contiguous()
    if out is None:
        out = torch.empty_like(q)
    if lse_out is not None and (
        lse_out.shape != q.shape[:2] or lse_out.dtype != torch.float32 or not lse_out.is_contiguous()
    ):
        raise ValueError(f"lse_out must be contiguous float32 {list(q.shape[:2])}")
    if bsz == 0 or q.shape[0] == 0:
        return out
    interp = interpreting()
    fmt = fmt_code(cache.dtype)
    g = q.shape[1] // hkv
    if max_chunk is None:
        max_chunk = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    bm = block_m or (16 if interp else 64)
    bm = max(bm, triton.next_power_of_2(g))
    bn = block_n or (16 if interp else 64)
    ks, vs, (sp, sh, st) = scale_tensors(cache)
    ds = cache.k_data.stride()
    tk, tv, ts, tpt, ttl, tpage = tail_operands(
        tail, tail_page_table, tail_prefix_lens, cache, page_table, prefix_lens
    )
    grid_programs = triton.cdiv(max_chunk * g, bm) * bsz * hkv
    if merge is not None:  # NOTE: the epilogue merges whole rows: one split, no split default applies
        _check_merge(merge, bsz, hkv, d, max_chunk * g)
        splits = num_splits or 1
        if splits != 1:
            raise ValueError("merge needs num_splits == 1 (the epilogue holds the whole row)")
    else:
        splits = num_splits or (1 if interp else auto_extend_splits(grid_programs))
    if splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {splits}")
    hq, t = q.shape[1], q.shape[0]
    if splits > 1:
        o_part = torch.empty((t, hq, splits, d), dtype=torch.float32, device=q.device)
        lse_part = torch.empty((t, hq, splits), dtype=torch.float32, device=q.device)
    else:
        o_part = lse_part = out  # unused
    grid = (triton.cdiv(max_chunk * g, bm), bsz, hkv * splits)
    maxnreg = max_registers or 0
    _extend_kernel[grid](
        q, q.stride(0), q.stride(1), k_new, v_new, k_new.stride(0), k_new.stride(1), cu_seqlens, out, out.stride(0), out.stride(1),
        cache.k_data, cache.v_data, ks, vs, cache.global_scale, ds[0], ds[1], ds[2], sp, sh, st,
        page_table, page_table.stride(0), prefix_lens,
        tk, tv, ts[0], ts[1], ts[2], tpt, tpt.stride(0), ttl, float(sm_scale), o_part, lse_part,
        lse_out if lse_out is not None else lse_part, HQ=hq, S=splits, G=g, BM=bm, D=d, PAGE=lay.page_size, TPAGE=tpage, BN=bn, HAS_TAIL=has_tail, FMT=fmt,
        INTERP=interp,
        PAGED=_pages_contiguous(cache, bn), TPAGED=has_tail and _pages_contiguous(tail, bn),
        # NOTE: at the kernel's num_stages the own-key loop's buffers took 160 of 176 KiB of shared memory (one
        # program per SM); 1 stage: two per SM, 1.4-1.55x faster for every dtype and shape (H200,
        # e.g. B32 x 8K prefix, 16-token chunks, bf16 417 -> 274 us)
        OWN_STAGES=0 if interp else (DEFAULT_OWN_STAGES if own_stages is None else own_stages),
        num_warps=num_warps or 4, num_stages=num_stages or (1 if interp else _default_stages(d)),
        WRITE_LSE=int(lse_out is not None and splits == 1),
        **({} if merge is None else {"mo_ptr": merge[0], "mlse_ptr": merge[1], "MERGE": 1, "MGV": merge[2],
                                     "MNG": merge[3]}),
        **({} if interp or not maxnreg else {"maxnreg": maxnreg}),
    )  # fmt: skip
    if splits > 1:
        db = combine_dim_block(t * hq, splits, d)
        _combine_kernel[(t * hq, d // db)](
            o_part, lse_part, out, out.stride(0), out.stride(1),
            HQ=hq, S=splits, D=d, DB=db, CH=combine_chunk(1, db, splits),
            lse_out=lse_out, WRITE_LSE=int(lse_out is not None), num_warps=4,
        )  # fmt: skip
    return out
