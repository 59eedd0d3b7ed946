"""``decode_triton``: the launcher of every decode kernel -- it checks shapes, takes the kernel and its launch
config from ``decode.config.select_decode`` (a typed ``DecodeConfig``), sizes the split-K grid and merges the
splits with ``decode.combine._combine_kernel``. No host syncs: CUDA-graph capturable.
"""

from __future__ import annotations

import contextlib

import torch
import triton

from nibblekv.formats.kv_view import PagedKV
from nibblekv.formats.layer_kv import LayerKV
from nibblekv.kernels._common import (
    FMT_FLOAT,
    FMT_NVFP4,
    check_cache,
    check_tail,
    fmt_code,
    interpreting,
    num_sms,
    scale_tensors,
    tail_operands,
)
from nibblekv.kernels.decode.balanced import launch_balanced
from nibblekv.kernels.decode.combine import _combine_kernel, combine_chunk, empty_partials
from nibblekv.kernels.decode.config import (
    _mma_max_registers,
    combine_dim_block,
    graph_num_splits,
    mma_num_splits,
    prefetch_args,
    select_decode,
)
from nibblekv.kernels.decode.launch_config import DecodeConfig, DecodeKernel
from nibblekv.kernels.decode.mma import decode_mma_kernel
from nibblekv.kernels.decode.mma_tail import decode_tail_kernel
from nibblekv.kernels.decode.paged import _decode_kernel
from nibblekv.kernels.decode.tok import decode_tok_kernel

# NOTE: GQA groups over 16 run as chunks of <= 16 query heads (each reads the KV head again): the tok/paged
# builds with 64-row query blocks (group 36) hit an illegal address on the H200 (the interpreter
# passed) and 32/64-column extend groups were wrong there
MAX_GROUP_ROWS = 16


def _decode_group_chunks(
    q: torch.Tensor,
    kv: PagedKV,
    sm_scale: float,
    out: torch.Tensor | None,
    lse_out: torch.Tensor | None,
    kw: dict[str, object],
) -> torch.Tensor:
    """``decode_triton`` over equal chunks of each KV head's query heads (GQA group > ``MAX_GROUP_ROWS``)."""
    bsz, hq, d = q.shape
    hkv = kv.cache.layout.num_kv_heads
    g = hq // hkv
    n = -(-g // MAX_GROUP_ROWS)
    size = -(-g // n)
    if out is not None and out.shape != q.shape:
        raise ValueError("out must be shaped like q with unit last stride")
    out = torch.empty_like(q) if out is None else out
    qv, ov = q.unflatten(1, (hkv, g)), out.unflatten(1, (hkv, g))
    lv = None if lse_out is None else lse_out.view(bsz, hkv, g)
    for j0 in range(0, g, size):
        j1 = min(g, j0 + size)
        qs = qv[:, :, j0:j1].reshape(bsz, hkv * (j1 - j0), d)
        ls = None if lv is None else torch.empty((bsz, hkv * (j1 - j0)), dtype=torch.float32, device=q.device)
        os_ = decode_triton(qs, kv, sm_scale, lse_out=ls, **kw)  # type: ignore[arg-type]
        ov[:, :, j0:j1] = os_.view(bsz, hkv, j1 - j0, d)
        if lv is not None and ls is not None:
            lv[:, :, j0:j1] = ls.view(bsz, hkv, j1 - j0)
    return out


def decode_triton(
    q: torch.Tensor,
    kv: PagedKV,
    sm_scale: float,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
    config: DecodeConfig | None = None,
    lse_out: torch.Tensor | None = None,
    q_rows: tuple[torch.Tensor, torch.Tensor, int, int] | None = None,
) -> torch.Tensor:
    """Triton twin of ``decode_ref``: ``q [B, Hq, D]`` -> ``[B, Hq, D]`` (q's dtype) over the view ``kv``.

    ``kv.page_table [B, >= ceil(max lens / page)]`` int32/int64, ``kv.lens [B]`` main-pool tokens; the tail
    (optional) likewise. ``num_splits`` (host int) fixes the split-K factor (default: fill the GPU); ``out``
    (like ``q``) receives the result if given. ``config`` (default: ``decode.config.select_decode``'s
    choice) asks for a kernel family and its launch knobs; it raises where that kernel cannot run.

    ``kv.active`` (int32 ``[1]`` on q's device) / ``kv.min_active`` (host int): only the first ``active`` rows
    are requests, the rest padding (a CUDA graph captured for B replays batches of ``min_active``..B).
    decode_mma then sizes its splits for the real rows at run time (a one-wave grid sized for B gives 6/16
    of its slots to padding rows at 10 of 16) and returns zeros for padding rows; the other kernels ignore it.

    ``q_rows = (q_real [T, Hq', D], cu_seqlens [B' + 1], G', NG)`` (``decode_mma16`` only: 9-16 columns, no
    tail, no ``active``): ``q`` only gives the shape ``[B' * NG, Hkv * G, D]`` of ``extend_decode``'s virtual
    batch and the kernel reads its rows from ``q_real`` itself (``gather_q_ref``'s map), no gather launch.
    """
    cache, page_table, lens, tail = kv.cache, kv.page_table, kv.lens, kv.tail
    tail_page_table, tail_lens, active, min_active = kv.tail_page_table, kv.tail_lens, kv.active, kv.min_active
    check_cache(cache, "cache")
    lay = cache.layout
    bsz, hq, d = q.shape if q.dim() == 3 else (0, 0, 0)
    hkv = lay.num_kv_heads
    if q.dim() != 3 or d != lay.head_dim or hq % hkv or q.stride(-1) != 1:
        raise ValueError(f"q must be [B, Hq, {lay.head_dim}] with Hq % {hkv} == 0 and unit last stride")
    if d < 16 or d & (d - 1):
        raise ValueError(f"head_dim must be a power of two >= 16, got {d}")
    if page_table.dim() != 2 or page_table.shape[0] != bsz or lens.shape != (bsz,):
        raise ValueError("page_table must be [B, pages] and lens [B]")
    if page_table.stride(-1) != 1:
        page_table = page_table.contiguous()
    has_tail = tail is not None and tail_lens is not None
    if has_tail:
        assert tail is not None and tail_page_table is not None and tail_lens is not None
        check_tail(tail, hkv, d)
        if tail_page_table.dim() != 2 or tail_page_table.shape[0] != bsz or tail_lens.shape != (bsz,):
            raise ValueError("tail_page_table must be [B, pages] and tail_lens [B]")
        if tail_page_table.stride(-1) != 1:
            tail_page_table = tail_page_table.contiguous()
    fmt = fmt_code(cache.dtype)
    interp = interpreting()
    g = hq // hkv
    cfg = select_decode(cache, g, bsz * hkv, tail if has_tail else None, config)
    name = cfg.kernel
    if q_rows is not None and (name is not DecodeKernel.MMA16 or has_tail or active is not None):
        raise ValueError("q_rows needs decode_mma16 (kernel mma, 9-16 columns a KV head), no tail or active")
    if not cfg.mma and g > MAX_GROUP_ROWS:
        return _decode_group_chunks(q, kv, sm_scale, out, lse_out, dict(num_splits=num_splits, config=config))
    conv = 0 if interp else cfg.conv  # the interpreter cannot run inline PTX
    bn, tbn = cfg.block_n, cfg.tail_block_n
    if cfg.mma and (cfg.minc < 16 or cfg.minc % 16):
        raise ValueError(f"decode kernel 'mma': minc must be a positive multiple of 16, got {cfg.minc}")
    # NOTE: "mma" writes one partial slot per warp of each split, two at head_dim 64 (PAIR in decode_mma)
    pair = int(cfg.mma and d == 64)
    tk, tv, ts, tpt, ttl, tpage = tail_operands(tail, tail_page_table, tail_lens, cache, page_table, lens)
    tail_in_grid = cfg.tail_in_grid
    # NOTE: one-warp tail programs per (request, KV head) in decode_mma's grid (tail_splits)
    tail_progs = int(tail_in_grid) * max(1, cfg.tail_splits)
    lo = bsz if active is None else max(1, min(bsz, min_active or bsz))
    if cfg.mma:
        splits = num_splits or mma_num_splits(lo, hkv, cfg.num_warps, cfg.ppsm, cfg.mma_slots)
    else:
        splits = num_splits or graph_num_splits(bsz, lo, hkv, bn, cfg.split_cap, cfg.wave_ctas)
    tail_slots = mma_tail_slots(has_tail, pair, tail_progs)
    s_tot = splits * (cfg.num_warps * (1 + pair) if cfg.mma else 1) + tail_slots
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.stride(-1) != 1:
        raise ValueError("out must be shaped like q with unit last stride")
    if lse_out is not None and (
        lse_out.shape != (bsz, hq) or lse_out.dtype != torch.float32 or not lse_out.is_contiguous()
    ):
        raise ValueError(f"lse_out must be contiguous float32 [{bsz}, {hq}]")
    if bsz == 0:
        return out
    if name is DecodeKernel.BALANCED:
        bal_cfg = cfg.replace(vq=cfg.vq * int(_q_vector_ok(q)))
        tail_ops = (tk, tv, ts, tpt, ttl, tpage)
        LAST_KERNEL["decode"] = launch_balanced(
            q, cache, page_table, lens, sm_scale, tail_ops, has_tail, bal_cfg, out, lse_out, active
        )
        return out
    # NOTE: one combine program per (request, KV head) -- its G query heads' rows are adjacent -- where the
    # pairs fill the GPU: H200, combine us per call at B26x32K / B32x8K / B64x8K / B128x8K 5.0 / 6.0 / 10.6 /
    # 19.4 -> 3.6 / 4.0 / 3.6 / 5.2; with fewer pairs than SMs a program per query head: B8x32K / B1x128K
    # 3.5 / 3.0 vs 4.1 / 4.6 grouped
    gc = g if bsz * hkv >= num_sms() else 1
    db = cfg.combine_db or combine_dim_block(bsz * hq // gc, s_tot, d)
    # NOTE: bf16 partials (part_bf16) only where the combine splits the dims: merging whole 256-dim bf16
    # rows took 15.7 us against fp32's 5.8 (H100, head_dim 256 GQA 8 B64 x 8 slots, 1,024 programs;
    # benchmarks/tools/combine_partials.py), while at the 16 / 64 dims picked at B1x256K / B8x32K bf16 is
    # within 0.2 us of fp32 and the decode kernel writes half the bytes. (The balanced kernel has its own
    # combine, G heads a program, which gained from bf16.)
    pdt = cfg.partial_dtype if db < d else torch.float32
    o_part, lse_part = empty_partials((bsz, hq, s_tot), d, q.device, interp, pdt)
    ks, vs, (sp, sh, st) = scale_tensors(cache)
    ds = cache.k_data.stride()
    tok = name is DecodeKernel.TOK
    if has_tail and not tok:
        tbn = max(tbn, tpage) if _pages_contiguous(tail, max(tbn, tpage)) else tbn
    args = (
        q, q.stride(0), q.stride(1),
        cache.k_data, cache.v_data, ks, vs, cache.global_scale,
        ds[0], ds[1], ds[2], sp, sh, st,
        page_table, page_table.stride(0), lens,
        tk, tv, ts[0], ts[1], ts[2], tpt, tpt.stride(0), ttl,
        o_part, lse_part, float(sm_scale),
    )  # fmt: skip
    stages = cfg.tail_stages if has_tail and cfg.tail_stages is not None else cfg.num_stages
    common = dict(
        HQ=hq, G=g, BH=max(16, triton.next_power_of_2(g)), D=d, PAGE=lay.page_size, TPAGE=tpage, BN=bn, TBN=tbn,
        NUM_SPLITS=splits, HAS_TAIL=has_tail, FMT=fmt, INTERP=interp,
        num_warps=cfg.num_warps, num_stages=stages,
    )  # fmt: skip
    side = None
    dyn: dict[str, object] = {}
    if cfg.mma:
        if has_tail and not tail_in_grid:  # its own launch (decode_tail_kernel), beside the main kernel
            side = side_stream(q.device)
            if side is not None:
                side.wait_stream(torch.cuda.current_stream(q.device))
            with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
                decode_tail_kernel[(bsz, hkv)](
                    q, q.stride(0), q.stride(1), tk, tv, ts[0], ts[1], ts[2], tpt, tpt.stride(0), ttl,
                    o_part, lse_part, float(sm_scale), s_tot, s_tot - 1,
                    HQ=hq, G=g, BH=common["BH"], D=d, TPAGE=tpage, TBN=tbn, INTERP=interp, num_warps=4,
                )  # fmt: skip
        mma_common = {**common, "D": 128, "PAGE": lay.page_size // 2} if pair else common
        dyn = _dyn_args(active, q.device, cfg.ppsm)
        grid = (bsz * hkv * (splits + tail_progs),) if dyn else (bsz, hkv, splits + tail_progs)
        k = decode_mma_kernel[grid](
            *args,
            TAIL_MMA=tail_progs,
            NW=cfg.num_warps,
            TPI=cfg.tpi,
            MINC=cfg.minc,
            PAIR=pair,
            VST=cfg.vst,
            VQ=cfg.vq * int(_q_vector_ok(q if q_rows is None else q_rows[0])),
            LZ=cfg.lazy_rescale,
            **prefetch_args(cache, cfg, g, cfg.ppsm),
            **_q_rows_args(q_rows),
            TPP=int(tail_in_grid and bool(cfg.tail_page_prefetch)),
            **dyn,
            **mma_common,
            # NOTE: the grid is one wave of ppsm warps per SM, so the register count must let ppsm warps be
            # resident (128 at 16). Uncapped, sm_90 compiles drift to 130 (GQA 8) and 166 (no tail, with
            # an early return): 15 / 12 warps per SM, two waves, 0.44-0.59 of the H200's ceiling
            # instead of 0.64-0.73. Capped at 128 none spills (tests/test_kernels_decode_sass.py).
            **({} if interp else {"maxnreg": _mma_max_registers(cfg.ppsm)}),
        )
    elif tok:
        if fmt == FMT_NVFP4 and st != d // 16:
            raise ValueError(
                f"decode kernel 'tok' needs packed NVFP4 scale rows (token stride {d // 16})"
            )
        split = cfg.split if fmt != FMT_FLOAT else 0
        k = decode_tok_kernel[(bsz, hkv, s_tot)](
            *args, CONV=conv, SPLIT=split, **common
        )  # fmt: skip
    else:
        paged = name is DecodeKernel.PAGED and _pages_contiguous(cache, bn)
        k = _decode_kernel[(bsz, hkv, s_tot)](
            *args, PAGED=paged,
            TPAGED=name is DecodeKernel.PAGED and has_tail and _pages_contiguous(tail, tbn), **common,
        )  # fmt: skip
    LAST_KERNEL["decode"] = k
    if side is not None:
        torch.cuda.current_stream(q.device).wait_stream(side)
    mma = cfg.mma
    gp = triton.next_power_of_2(gc)
    ch = combine_chunk(gp, db, s_tot - tail_slots * int(has_tail))
    _combine_kernel[(bsz * hq // gc, d // db)](
        o_part, lse_part, out, out.stride(0), out.stride(1),
        HQ=hq, S=s_tot, D=d, DB=db, CH=ch, G=gc, GP=gp, lens_ptr=lens,
        TB=max(2, triton.next_power_of_2(tail_slots)),
        MMA_SPLITS=splits if mma else 0, MMA_NW=cfg.num_warps * (1 + pair) if mma else 1,
        MINC=cfg.minc if mma else 16, HAS_TAIL=int(has_tail), TAIL_SLOTS=tail_slots, PAIR=pair,
        lse_out=lse_out, WRITE_LSE=int(lse_out is not None), num_warps=4,
        **(dict(dyn, WARPS_PER_REQ=hkv * cfg.num_warps) if mma and dyn else {}),
    )  # fmt: skip
    return out


def _dyn_args(active: torch.Tensor | None, device: torch.device, ppsm: int) -> dict[str, object]:
    """decode_mma / combine arguments for ``active`` (empty without it: the static grid)."""
    if active is None:
        return {}
    if active.shape != (1,) or active.dtype != torch.int32 or active.device != device:
        raise ValueError(f"active must be an int32 [1] tensor on {device}, got {active.dtype} {tuple(active.shape)}")
    # NOTE: reserve_per_req stays a kernel argument (0): dropping it would change the compiled kernels
    return {"act_ptr": active, "warp_slots": ppsm * num_sms(), "reserve_per_req": 0, "DYN": 1}


def mma_tail_slots(has_tail: bool, pair: int, tail_progs: int) -> int:
    """Partial slots the bf16 tail takes at the end of each head's: one per tail program in decode_mma's
    grid (``tail_progs``), two with ``PAIR`` (one per token parity), else one (its own launch). NOTE:
    mirrors ``TAIL_SLOTS`` in ``decode_mma_kernel``."""
    return int(has_tail) * (tail_progs * (1 + int(pair)) if tail_progs else 1)


def _q_rows_args(q_rows: tuple[torch.Tensor, torch.Tensor, int, int] | None) -> dict[str, object]:
    """``decode_mma_kernel``'s arguments for ``decode_triton``'s ``q_rows`` (none without)."""
    if q_rows is None:
        return {}
    qr, cu, qg, ng = q_rows
    if qr.dim() != 3 or qr.stride(-1) != 1 or cu.dim() != 1 or qr.shape[1] % qg:
        raise ValueError("q_rows: q_real must be [T, Hq, D] with unit last stride, cu_seqlens [B + 1]")
    return dict(qr_ptr=qr, s_qt=qr.stride(0), s_qr=qr.stride(1), qcu_ptr=cu, q_last=qr.shape[0] - 1, QG=qg,
                QNG=ng)  # fmt: skip


def _q_vector_ok(q: torch.Tensor) -> bool:
    """Whether decode_mma may load Q rows as 16-byte vectors (bf16, rows and heads 16-byte aligned)."""
    return q.dtype == torch.bfloat16 and q.data_ptr() % 16 == 0 and q.stride(0) % 8 == 0 and q.stride(1) % 8 == 0


_SIDE_STREAMS: dict[int, torch.cuda.Stream] = {}


def side_stream(device: torch.device) -> torch.cuda.Stream | None:
    """A second stream per GPU for small launches that overlap the main one (None off CUDA).

    NOTE: the bf16 tail's launch is independent of decode_mma's until the combine step; run in sequence
    at B=1 it added ~5 us a layer (H200). The caller forks (``wait_stream``) before and
    joins after, which CUDA-graph capture records as two parallel branches.
    """
    if device.type != "cuda" or interpreting():
        return None
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SIDE_STREAMS:
        _SIDE_STREAMS[idx] = torch.cuda.Stream(device=idx)
    return _SIDE_STREAMS[idx]


def _pages_contiguous(cache: LayerKV | None, block_n: int) -> bool:
    """Whether whole-page tiles apply: power-of-two pages dividing the key block, tokens packed in a page."""
    if cache is None:
        return False
    p, lay = cache.page_size, cache.layout
    ok = p & (p - 1) == 0 and block_n % p == 0 and cache.k_data.stride(2) == lay.data_width
    if cache.k_scale is not None:
        ok = ok and cache.k_scale.stride(2) == lay.head_dim // 16
    return ok


# The compiled kernel of the last launch (benchmarks read its register / spill counts).
LAST_KERNEL: dict[str, object] = {}
