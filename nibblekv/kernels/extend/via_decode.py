"""Extend for short chunks through the decode kernels (NVFP4: ``decode_mma``; FP8: ``decode_tok``).

Why: ``extend_triton`` runs every dtype at about the same speed -- a chain of ``tl.dot`` blocks whose
latency, not the bytes, sets the time -- so its NVFP4 prefix reads reach ~0.24 of the H200's ceiling and
FP8's ~0.39 where a chunk is a few tokens (speculative-decoding checks, the last piece of a chunked
prompt, a prefix hit that leaves a partial page). For such a chunk every query token sees the WHOLE
cached prefix (the causal mask bites only inside the chunk), so the prefix part is a decode with more
query columns per KV head: a column is a (query token, query head) pair instead of a head.

Three steps, merged exactly by their log-sum-exps:

1. the main-pool prefix: ``decode_triton`` on a virtual batch -- request ``b``'s chunk becomes
   ``NG = cdiv(max_chunk * G, GV)`` virtual requests of ``GV`` columns per KV head (column ``cg * GV + n``
   = token ``// G``, head ``% G`` of the chunk), all with ``b``'s page table and prefix length (the NG
   copies read the same bytes; concurrent, they mostly hit L2). ``GV`` <= 16 columns (head_dim 128; 9-16
   run as ``decode_mma16``), 8 (256) or 4 (64) for ``decode_mma``, up to ``TOK_MAX_COLUMNS`` for
   ``decode_tok``;
2. the rest -- the bf16 tail and the chunk's own keys, causally -- by ``extend_triton`` with ``merge``
   (it skips the main pool: step 1 covered it), which
3. merges each row's two partials in its epilogue: ``o = (o1 * 2**lse1 + o2 * 2**lse2) / (2**lse1 + 2**lse2)``
   (``extend_triton``'s ``merge``: no merge launch, no o2 / lse2 round trip through memory).

Columns past a request's chunk read a clamped query row; their outputs are never gathered back.
``gather_q_ref`` / ``merge_ref`` are the torch twins of steps 1 and 3.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nibblekv.formats.kv_view import PagedKV
from nibblekv.formats.layer_kv import LayerKV
from nibblekv.kernels._common import FMT_FP8, FMT_NVFP4, fmt_code, interpreting
from nibblekv.kernels.decode.config import (
    TOK_VERIFIED_HEAD_DIMS,
    _mma_unsupported,
    mma_columns,
    mma_narrow_columns,
)
from nibblekv.kernels.decode.knobs import base_config
from nibblekv.kernels.decode.launch import decode_triton
from nibblekv.kernels.decode.launch_config import DecodeConfig, DecodeKernel
from nibblekv.kernels.extend.paged import extend_triton

# NOTE: more virtual requests than this per request re-read (and re-convert) the same prefix bytes more
# often; the tl.dot path converts each byte once for all columns.
MAX_GROUPS = 2
# NOTE: decode_tok's query block is max(16, next_pow2(columns)) rows: 16 columns cost no more registers.
# Groups of up to 64 columns were tried: the sm_90 build had no spills, but on the H200 it was
# wrong (FP8, head_dim 64, 36 columns: rel. RMS 0.42; correct under the interpreter) and slower than
# extend_triton (16-token chunks at GQA 4: FP8 0.22 vs 0.39 of the read ceiling)
TOK_MAX_COLUMNS = 16
# NOTE: decode_mma16 reads the virtual batch's Q rows from q itself (decode_triton's q_rows) instead of a
# gather launch (2.6 us). On: us with / without at 4-token chunks, B=64 x 8K 213.9 / 215.3, B=32 x 32K 402.1 /
# 403.9 (means of four rounds in alternating order, H200)
FOLD_Q = True


def extend_decode_plan(q: torch.Tensor, cache: LayerKV, max_chunk: int, wide: str = "mma") -> tuple[str, int, int] | str:
    """``(decode variant, columns per virtual request GV, virtual requests per request NG)``, or why not.

    ``wide``: the kernel for NVFP4 chunks of more than 8 columns (head_dim 128 and 256; 4 at 64) -- ``"mma"``
    (``decode_mma16`` up to 16 columns, then several virtual requests, the prefix read once per group) or
    ``"mma8"`` (groups of 8 columns: ``decode_mma`` only, for comparison) or
    ``"tok"`` (one ``decode_tok`` group of <= ``TOK_MAX_COLUMNS`` columns, the prefix read once through
    ``tl.dot``; 0.27 vs 0.34 of the H200's read ceiling for two 8-column ``decode_mma`` groups at 4-token
    chunks), then up to ``MAX_GROUPS`` such groups. An FP8 chunk always takes
    ``decode_tok`` groups of <= ``TOK_MAX_COLUMNS`` columns, up to ``MAX_GROUPS`` of them (virtual requests
    that read the same prefix, the second mostly from L2; ``wide`` does not apply)."""
    if wide not in ("mma", "mma8", "tok"):
        raise ValueError(f"wide must be 'mma', 'mma8' or 'tok', got {wide!r}")
    hkv, d = cache.layout.num_kv_heads, cache.layout.head_dim
    cols = max_chunk * (q.shape[1] // hkv)
    fmt = fmt_code(cache.dtype)
    if fmt == FMT_NVFP4:
        narrow = mma_narrow_columns(d)
        cap = narrow if wide == "mma8" else mma_columns(d)
        if cols > narrow and wide == "tok":
            return _tok_plan(cols, d)
        why = _mma_unsupported(cache, min(cap, cols))
        if why is None and cols > MAX_GROUPS * cap:
            why = f"needs chunk x GQA group <= {MAX_GROUPS * cap} columns per KV head"
        return why or ("mma", min(cap, cols), -(-cols // cap))
    if fmt == FMT_FP8:
        # NOTE: up to two groups: 8-token chunks at GQA 4 (32 columns) read the prefix at 0.53 of the
        # H200's read ceiling vs extend_triton's 0.39 (B=64 x 8K)
        return _tok_plan(cols, d)
    return "reads an NVFP4 or FP8 pool (bf16 extend already streams)"


def _tok_plan(cols: int, d: int) -> tuple[str, int, int] | str:
    """``decode_tok`` groups of <= ``TOK_MAX_COLUMNS`` columns, at most ``MAX_GROUPS`` of them."""
    if not interpreting() and d not in TOK_VERIFIED_HEAD_DIMS:
        return f"decode_tok needs head_dim in {TOK_VERIFIED_HEAD_DIMS}"
    if cols > MAX_GROUPS * TOK_MAX_COLUMNS:
        return f"needs chunk x GQA group <= {MAX_GROUPS * TOK_MAX_COLUMNS} columns per KV head"
    gv = min(cols, TOK_MAX_COLUMNS)
    return ("tok", gv, -(-cols // gv))


def extend_decode_unsupported(q: torch.Tensor, cache: LayerKV, max_chunk: int, wide: str = "mma") -> str | None:
    """Why :func:`extend_decode` cannot serve this call (None if it can)."""
    plan = extend_decode_plan(q, cache, max_chunk, wide)
    return plan if isinstance(plan, str) else None


def gather_q_ref(q: torch.Tensor, cu_seqlens: torch.Tensor, g: int, gv: int, ng: int) -> torch.Tensor:
    """The virtual decode batch: ``q [T, Hq, D]`` -> ``[B * NG, Hkv * GV, D]`` (see the module docstring)."""
    t_total, hq, d = q.shape
    bsz, hkv = cu_seqlens.numel() - 1, hq // g
    starts = cu_seqlens[:-1].to(torch.int64)
    col = torch.arange(ng * gv, device=q.device).view(1, ng, 1, gv)
    tok = (starts.view(bsz, 1, 1, 1) + col // g).clamp(max=t_total - 1)  # past the chunk: any valid row
    head = torch.arange(hkv, device=q.device).view(1, 1, hkv, 1) * g + col % g
    tok, head = torch.broadcast_tensors(tok, head)
    return q[tok.reshape(-1), head.reshape(-1)].view(bsz * ng, hkv * gv, d)


def merge_ref(
    o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor, cu_seqlens: torch.Tensor,
    g: int, gv: int, ng: int, out: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """``out [T, Hq, D]`` = each row's prefix partial (``o1 [B*NG, Hkv*GV, D]``, ``lse1``) merged with its
    own partial (``o2 [T, Hq, D]``, ``lse2 [T, Hq]``); log2-domain LSEs."""
    t_total, hq, _ = o2.shape
    bsz, hkv = cu_seqlens.numel() - 1, hq // g
    cu = cu_seqlens.to(torch.int64)
    starts, lens = cu[:-1], cu[1:] - cu[:-1]
    b_of = torch.repeat_interleave(torch.arange(bsz, device=o2.device), lens, output_size=t_total)
    c = ((torch.arange(t_total, device=o2.device) - starts[b_of]) * g).view(t_total, 1)
    c = c + torch.arange(g, device=o2.device)
    vrow = (b_of.view(t_total, 1) * ng + c // gv).view(t_total, 1, g).expand(t_total, hkv, g)
    vcol = torch.arange(hkv, device=o2.device).view(1, hkv, 1) * gv + (c % gv).view(t_total, 1, g)
    vrow, vcol = vrow.reshape(t_total, hq), vcol.reshape(t_total, hq)
    o1r, lse1r = o1[vrow, vcol].float(), lse1[vrow, vcol]
    m = torch.maximum(lse1r, lse2)  # lse2 is finite: a query token always sees itself
    w1, w2 = torch.exp2(lse1r - m), torch.exp2(lse2 - m)
    out.copy_((o1r * w1[..., None] + o2.float() * w2[..., None]) / (w1 + w2)[..., None])
    return out


@triton.jit
def _gather_q_kernel(
    q_ptr, s_qt, s_qh, cu_ptr, qv_ptr, t_last,
    G: tl.constexpr, GV: tl.constexpr, GVP: tl.constexpr, NG: tl.constexpr, HV: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    """Grid ``(B * NG, Hkv)``, ``HV = Hkv * GV``: the ``GV`` virtual query rows (D values each) of one KV head
    per program (``GVP`` = next power of two). NOTE: a program per row took 6.4 us at B=64, 4-token chunks,
    GQA 4 -- 8192 one-warp programs for 2 MB (H200)."""
    r = tl.program_id(0)
    h = tl.program_id(1)
    n = tl.arange(0, GVP)
    col = (r % NG) * GV + n
    tok = tl.minimum(tl.load(cu_ptr + r // NG).to(tl.int64) + col // G, t_last)
    head = h * G + col % G
    offs = tl.arange(0, D)
    m = (n < GV)[:, None]
    x = tl.load(q_ptr + tok[:, None] * s_qt + head[:, None] * s_qh + offs[None, :], mask=m)
    tl.store(qv_ptr + (r.to(tl.int64) * HV + h * GV + n)[:, None] * D + offs[None, :], x, mask=m)


def extend_decode(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    kv: PagedKV,
    sm_scale: float,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    wide: str = "mma",
    own_warps: int | None = None,
    own_block_n: int | None = None,
    prefix_config: DecodeConfig | None = None,
    fold_q: bool | None = None,
) -> torch.Tensor:
    """``extend_triton``'s contract (``q [T, Hq, D]`` -> ``[T, Hq, D]``; the view ``kv``'s lengths are the
    cached prefix's) for an NVFP4 or FP8 pool whose
    decode kernel takes ``max_chunk * G`` columns per KV head (``extend_decode_plan``); ``kv.max_chunk``
    (host int, required here) >= every chunk of ``kv.cu_seqlens [B + 1]``. ``num_splits``: the prefix
    decode's split count (default: the decode launcher's); ``wide``: see :func:`extend_decode_plan`. ``own_warps`` /
    ``own_block_n``: step 2's launch (``extend_triton``'s ``num_warps`` / ``block_n``; default 1 warp, 2
    from 17 columns, and 16-key blocks) -- for benchmark sweeps of that ~8 us launch.
    ``prefix_config``: the prefix decode's launch config (default: ``base_config`` of the plan's kernel,
    which it must name).
    ``fold_q`` (default ``FOLD_Q``, on): where the prefix runs ``decode_mma16`` (9-16 columns), its kernel
    reads the query rows itself (``decode_triton``'s ``q_rows``): no gather launch."""
    cache, page_table, prefix_lens = kv.cache, kv.page_table, kv.lens
    cu_seqlens, max_chunk = kv.cu_seqlens, kv.max_chunk
    if cu_seqlens is None or max_chunk is None:
        raise ValueError("extend_decode needs a view with cu_seqlens and max_chunk")
    plan = extend_decode_plan(q, cache, max_chunk, wide)
    if isinstance(plan, str):
        raise ValueError(f"extend variant 'decode' {plan}")  # noqa: TRY004 - a reason, not a wrong type
    variant, gv, ng = plan
    t_total, hq, d = q.shape
    bsz = cu_seqlens.numel() - 1
    hkv = cache.layout.num_kv_heads
    g = hq // hkv
    if (
        q.stride(-1) != 1
        or cu_seqlens.dim() != 1
        or (out is not None and (out.shape != q.shape or out.stride(-1) != 1))
    ):
        raise ValueError("q (and out) need a unit last stride, cu_seqlens must be [B + 1]")
    if out is None:
        out = torch.empty_like(q)
    if bsz == 0 or t_total == 0:
        return out
    # 1) the prefix as a decode over a virtual batch
    fold = (FOLD_Q if fold_q is None else fold_q) and variant == "mma" and gv > mma_narrow_columns(d)
    q_rows = (q, cu_seqlens, g, ng) if fold else None
    if fold:  # NOTE: only the virtual batch's shape: decode_mma16 reads the rows from q (q_rows)
        qv = q.as_strided((bsz * ng, hkv * gv, d), (0, 0, 1))
    else:
        qv = torch.empty((bsz * ng, hkv * gv, d), dtype=q.dtype, device=q.device)
        if interpreting():
            qv.fill_(float("nan"))
        _gather_q_kernel[(bsz * ng, hkv)](
            q, q.stride(0), q.stride(1), cu_seqlens, qv, t_total - 1,
            G=g, GV=gv, GVP=triton.next_power_of_2(gv), NG=ng, HV=hkv * gv, D=d, num_warps=4,
        )  # fmt: skip
    pv = page_table if ng == 1 else page_table.repeat_interleave(ng, dim=0)
    lv = prefix_lens if ng == 1 else prefix_lens.repeat_interleave(ng)
    # NOTE: the prefix partial in fp32: rounding it to q's dtype before the merge doubled the error against
    # extend_ref
    o1 = torch.empty(qv.shape, dtype=torch.float32, device=q.device)
    lse1 = torch.empty((bsz * ng, hkv * gv), dtype=torch.float32, device=q.device)
    kernel = DecodeKernel(variant)
    cfg = prefix_config or base_config(kernel, fmt_code(cache.dtype), d)
    if cfg.mma != (kernel is DecodeKernel.MMA) or (not cfg.mma and cfg.kernel is not kernel):
        raise ValueError(f"prefix_config runs {cfg.kernel.value!r}, the plan {variant!r}")
    prefix = PagedKV(cache, pv, lv)  # the virtual batch's view of the main pool
    decode_triton(qv, prefix, sm_scale, num_splits=num_splits, out=o1, config=cfg, lse_out=lse1, q_rows=q_rows)
    # 2) tail + own keys: extend_triton with merge (no main-pool pass, and no zeros prefix_lens -- one fill
    # launch less), each row's prefix partial loaded first and merged in its epilogue
    if interpreting():
        out.fill_(float("nan"))
    # NOTE: query blocks of the chunk's rows (not 64) and one stage: with the prefix kernel's 5 stages (180 KB
    # of shared memory, one program per SM) this launch took 20 us at B=64, 4-token chunks, GQA 4 (H200:
    # 512 programs in 4 waves, each a memory round trip or two). 16-key
    # blocks and 1 warp (2 from 17 columns): the launch 13.3 -> 8.4 us at B=64 x 8K, 4-token chunks (2 / 8:
    # 12.1 -> 7.1, 23.2 -> 17.8 at 2 warps; 1 warp 32.2), whole call 236.7 -> 230.6 us; FP8 alike (H200,
    # no bf16 tail in those rows)
    if own_warps is None:
        own_warps = 1 if max_chunk * g <= 16 else 2
    extend_triton(
        q, k_new, v_new, kv, sm_scale, out=out, block_m=min(64, max(16, triton.next_power_of_2(max_chunk * g))),
        num_stages=1, num_warps=own_warps, block_n=own_block_n or 16, merge=(o1, lse1, gv, ng),
    )  # fmt: skip
    return out


__all__ = [
    "FOLD_Q", "MAX_GROUPS", "TOK_MAX_COLUMNS", "extend_decode", "extend_decode_plan",
    "extend_decode_unsupported",
    "gather_q_ref", "merge_ref",
]  # fmt: skip
