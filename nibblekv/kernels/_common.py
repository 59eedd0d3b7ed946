"""Shared pieces of the Triton cache kernels: format codes, launch checks, in-register dequant.

NVFP4 dequant trick (exact): a 4-bit E2M1 code ``n = s e1 e0 m`` becomes the fp16 whose bits are
``(s << 15) | (e1 e0 m << 9)``; that fp16 equals ``value(n) * 2**-14`` for every code (the subnormal
codes 0 and 0.5 included). The kernels multiply it by ``block_scale * 2**7`` (<= 448*128 < 65504,
so it fits fp16) and fold the remaining ``2**7`` plus the layer's global scale into the fp32
softmax scale (K) or output scale (V). NOTE: ``code * 2**-14 * s * 2**7`` is exact in fp16 for every
E4M3 scale, subnormal scales included (it has <= 5 significant bits and is >= 2**-17).
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from nibblekv.formats.layer_kv import LayerKV
from nibblekv.formats.layout import KVDtype

# KV storage formats as kernel constexprs.
FMT_FLOAT: int = 0  # bf16 / fp16 / fp32 pages, loaded as they are
FMT_FP8: int = 1  # float8_e4m3fn pages, one FP32 scale per layer
FMT_NVFP4: int = 2  # packed E2M1 nibbles + per-16 E4M3 block scales

LOG2E: float = 1.4426950408889634


def fmt_code(dtype: KVDtype) -> int:
    """Kernel constexpr for a KV dtype."""
    if dtype is KVDtype.NVFP4:
        return FMT_NVFP4
    if dtype is KVDtype.FP8:
        return FMT_FP8
    return FMT_FLOAT


@functools.cache
def num_sms() -> int:
    """Streaming multiprocessors of GPU 0 (132, an H200's, without CUDA: CPU tests size grids the same way).

    NOTE: cached -- launchers ask on every call, and ``get_device_properties`` is host work per layer."""
    return torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132


def interpreting() -> bool:
    """True when Triton kernels run in the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_cache(cache: LayerKV, name: str) -> None:
    """Launch checks every kernel shares: 4-D page tensors with unit last stride, consistent shapes."""
    for t, what in ((cache.k_data, "k_data"), (cache.v_data, "v_data")):
        if t.dim() != 4 or t.stride(-1) != 1:
            raise ValueError(f"{name}.{what} must be 4-D [pages, heads, page, width] with unit last stride")
        if tuple(t.shape[1:]) != cache.layout.data_shape(1)[1:]:
            raise ValueError(f"{name}.{what} shape {tuple(t.shape)} does not match its layout {cache.layout}")
        if t.dtype != cache.layout.torch_dtype:
            raise ValueError(f"{name}.{what} dtype {t.dtype} != {cache.layout.torch_dtype}")
    if cache.k_data.stride() != cache.v_data.stride():
        raise ValueError(f"{name}: K and V pages must share strides")
    if cache.dtype is KVDtype.NVFP4:
        for s in (cache.k_scale, cache.v_scale):
            if s is None or s.dtype != torch.float8_e4m3fn or s.stride(-1) != 1:
                raise ValueError(f"{name}: nvfp4 needs float8_e4m3fn block scales with unit last stride")
            if tuple(s.shape) != (cache.num_pages, *cache.layout.scale_shape(1)[1:]):
                raise ValueError(f"{name}: scale shape {tuple(s.shape)} does not match the data")
        assert cache.k_scale is not None and cache.v_scale is not None
        if cache.k_scale.stride() != cache.v_scale.stride():
            raise ValueError(f"{name}: K and V scales must share strides")
    if cache.global_scale.numel() != 2 or cache.global_scale.dtype != torch.float32:
        raise ValueError(f"{name}.global_scale must be float32 [2]")


def check_tail(tail: LayerKV, kv_heads: int, head_dim: int) -> None:
    """Launch checks of the bf16 tail pool beside a main pool of ``kv_heads`` heads of ``head_dim``."""
    check_cache(tail, "tail")
    if tail.dtype.quantized or (tail.layout.num_kv_heads, tail.layout.head_dim) != (kv_heads, head_dim):
        raise ValueError("tail must be an unquantized pool with the main pool's kv_heads and head_dim")


def scale_tensors(cache: LayerKV) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int, int]]:
    """(k_scale, v_scale, (page, head, token) strides) -- data tensors stand in when there are no scales."""
    if cache.k_scale is None or cache.v_scale is None:
        return cache.k_data, cache.v_data, (0, 0, 0)
    s = cache.k_scale.stride()
    return cache.k_scale, cache.v_scale, (s[0], s[1], s[2])


TailOperands = tuple[torch.Tensor, torch.Tensor, tuple[int, ...], torch.Tensor, torch.Tensor, int]


def tail_operands(
    tail: LayerKV | None,
    tail_page_table: torch.Tensor | None,
    tail_lens: torch.Tensor | None,
    cache: LayerKV,
    page_table: torch.Tensor,
    lens: torch.Tensor,
) -> TailOperands:
    """(k data, v data, data strides, page table, lengths, page size) of the bf16 tail pool for a launch;
    without a tail, the main pool's tensors stand in (the kernel never reads them: ``HAS_TAIL`` is off)."""
    if tail is None or tail_page_table is None or tail_lens is None:
        return cache.k_data, cache.v_data, (0, 0, 0), page_table, lens, cache.page_size
    return tail.k_data, tail.v_data, tail.k_data.stride(), tail_page_table, tail_lens, tail.page_size


# ----------------------------------------------------------------------------- in-register dequant


@triton.jit
def _f16_lo(o):
    """The low fp16 of a uint32."""
    return (o & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True)


@triton.jit
def _f16_hi(o):
    """The high fp16 of a uint32."""
    return (o >> 16).to(tl.uint16).to(tl.float16, bitcast=True)


@triton.jit
def sm_decode(w):
    """uint32 words in sm order (``nibblekv.formats.sm_words``) -> 4 uint32, each two fp16 bit patterns
    ``value * 2**-14``: elements (e0, e2), (e4, e6), (e1, e3), (e5, e7). The Triton form of
    ``ptx.mma._cvt_word_sm``'s masks, shift and multiplies (ptxas issues the last two as IMAD)."""
    o0 = w & 0x8E008E00
    o1 = (w << 3) & 0x8E008E00
    # NOTE: (t << 9) | (t << 1) and (t << 6) | (t << 2) of e1's / e5's isolated bits t as one multiply: the
    # copies never overlap, so it adds without carries (nibblekv.formats.sm_words; all 2**32 words checked)
    o2 = ((w & 0x40074007) * 514) & 0x8E008E00
    o3 = ((w & 0x20382038) * 68) & 0x8E008E00
    return o0, o1, o2, o3


@triton.jit
def nvfp4_split(b):
    """Pool bytes ``[R, NB, 8]`` (NVFP4 data in sm order, ``nibblekv.formats.sm_words``) -> (even elements,
    odd elements) as fp16 ``[R, NB, 8]``, each ``value * 2**-14``: two 32-bit words a block of 16, each
    word's 4 half2 by :func:`sm_decode`."""
    R: tl.constexpr = b.shape[0]
    NB: tl.constexpr = b.shape[1]
    sh = (tl.arange(0, 4) * 8).to(tl.uint32)
    w = tl.sum(tl.reshape(b, [R, NB, 2, 4]).to(tl.uint32) << sh[None, None, None, :], axis=3)
    o0, o1, o2, o3 = sm_decode(w)  # (e0, e2), (e4, e6), (e1, e3), (e5, e7)
    # NOTE: join(join(a, c), join(b, d)) flattens to a, b, c, d
    ev = tl.join(tl.join(_f16_lo(o0), _f16_lo(o1)), tl.join(_f16_hi(o0), _f16_hi(o1)))
    od = tl.join(tl.join(_f16_lo(o2), _f16_lo(o3)), tl.join(_f16_hi(o2), _f16_hi(o3)))
    return tl.reshape(ev, [R, NB, 8]), tl.reshape(od, [R, NB, 8])


@triton.jit
def load_kv_halves(
    data_ptr,
    scale_ptr,
    row_off,
    srow_off,
    mask,
    D: tl.constexpr,
    FMT: tl.constexpr,
    INTERP: tl.constexpr,
):
    """Load ``BN`` cached rows of one KV head and dequantize them in registers.

    ``row_off [BN]`` (int64) are element offsets of each row's data, ``srow_off [BN]`` of its NVFP4
    scales; masked rows read as zeros. Returns two ``[BN, D/2]`` tiles ``(a, b)`` ready for ``tl.dot``:

    * NVFP4: ``a`` = even elements, ``b`` = odd elements, fp16, each ``value * 2**-7 / g`` (the caller
      multiplies by ``2**7 * g`` in fp32; see the module doc);
    * FP8 / float: ``a`` = elements ``[0, D/2)``, ``b`` = ``[D/2, D)``; FP8 as fp16 ``value / g``, float
      pages in their own dtype (fp32 when interpreting bf16: the interpreter's bf16 ``tl.dot`` is wrong).
    """
    HALF: tl.constexpr = D // 2
    if FMT == 2:
        NB: tl.constexpr = D // 16
        offs_b = tl.arange(0, NB)
        offs_e = tl.arange(0, 8)
        col = offs_b[:, None] * 8 + offs_e[None, :]
        raw = tl.load(data_ptr + row_off[:, None, None] + col[None, :, :], mask=mask[:, None, None], other=0)
        sc = tl.load(scale_ptr + srow_off[:, None] + offs_b[None, :], mask=mask[:, None], other=0.0)
        sc = (sc.to(tl.float16) * 128.0)[:, :, None]
        lo, hi = nvfp4_split(raw)
        a = tl.reshape(lo * sc, [row_off.shape[0], HALF])
        b = tl.reshape(hi * sc, [row_off.shape[0], HALF])
    else:
        offs = tl.arange(0, HALF)
        ptrs = data_ptr + row_off[:, None] + offs[None, :]
        a = tl.load(ptrs, mask=mask[:, None], other=0.0)
        b = tl.load(ptrs + HALF, mask=mask[:, None], other=0.0)
        a, b = _dot_ready(a, b, FMT, INTERP)
    return a, b


@triton.jit
def _dot_ready(a, b, FMT: tl.constexpr, INTERP: tl.constexpr):
    """FP8 / float halves as ``tl.dot`` takes them: FP8 -> fp16; float in its own dtype (fp32 when
    interpreting: the interpreter's bf16 ``tl.dot`` is wrong)."""
    if FMT == 1:
        a = a.to(tl.float16)
        b = b.to(tl.float16)
    elif INTERP:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return a, b


@triton.jit
def global_scales(g_ptr, FMT: tl.constexpr):
    """``(gk, gv)``: what the tile kernels multiply into the softmax scale (K) and the output (V) -- the
    layer's global scales ``g_ptr[0:2]`` (quantized pools only, as in the formats reference), times the
    ``2**7`` that NVFP4 tiles leave out (the module doc); ``(1, 1)`` for float pools."""
    gk = 1.0
    gv = 1.0
    if FMT != 0:
        gk = tl.load(g_ptr)
        gv = tl.load(g_ptr + 1)
    if FMT == 2:
        gk = gk * 128.0
        gv = gv * 128.0
    return gk, gv


@triton.jit
def split_slot(q_ptr, s_qb, o_ptr, lse_ptr, NUM_SPLITS, HQ: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
               HAS_TAIL: tl.constexpr):  # fmt: skip
    """The program's place in a split-K decode grid ``(B, kv_heads, HAS_TAIL + NUM_SPLITS)`` and its
    partial outputs ``o [B, HQ, S_TOT, D]`` fp32, ``lse [B, HQ, S_TOT]`` (``S_TOT = NUM_SPLITS +
    HAS_TAIL``): returns ``(b, h, sp, S_TOT, q_base, o_base, lse_base)`` with ``sp`` = -1 for the tail,
    ``o_base`` / ``lse_base`` at row ``(b, h * G, sp)`` (the tail's slot is the last one). NOTE: the tail is
    program 0 of the split axis (scheduled first, not as a short last wave); ``NUM_SPLITS`` is a runtime
    int, so one compile serves every split count."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.program_id(2) - HAS_TAIL
    S_TOT = NUM_SPLITS + HAS_TAIL
    first = (b.to(tl.int64) * HQ + h * G) * S_TOT + tl.where(sp < 0, NUM_SPLITS, sp)
    return b, h, sp, S_TOT, q_ptr + b.to(tl.int64) * s_qb, o_ptr + first * D, lse_ptr + first


@triton.jit
def split_range(n, sp, NUM_SPLITS, BN: tl.constexpr):
    """Split ``sp``'s tokens ``[start, end)`` of an ``n``-token context: whole ``BN``-token blocks each (a split
    past the context gets ``end < start``: an empty range). NOTE: ``start`` is not clamped to ``n`` as
    ``extend/paged.py`` clamps its own: here that rebuilt decode ``tok``'s main loop (FP8 665 -> 738 SASS a
    step, sm_90)."""
    chunk = tl.cdiv(tl.cdiv(n, NUM_SPLITS), BN) * BN
    start = sp * chunk
    return start, tl.minimum(start + chunk, n)


@triton.jit
def online_softmax_step(qa, qb, ka, kb, v, valid, m, l, acc, qk_scale):
    """One flash-attention step over a block of ``BN`` keys.

    ``qa, qb [BM, D/2]`` pair with ``ka, kb [BN, D/2]`` (same split of head_dim); ``valid`` is a bool mask
    broadcastable to ``[BM, BN]`` with at least one True per block (NOTE: callers never pass an all-masked
    block, so ``m`` becomes finite on the first step). Scores are ``dot * qk_scale`` in log2 units.
    ``v [BN, D]`` in natural head_dim order. Returns the updated running max ``m [BM]``, sum ``l [BM]``
    and accumulator ``acc [BM, D]`` (fp32).
    """
    s = tl.dot(qa.to(ka.dtype), tl.trans(ka))
    s = tl.dot(qb.to(kb.dtype), tl.trans(kb), s)
    s = tl.where(valid, s * qk_scale, float("-inf"))
    return softmax_update(s, v, m, l, acc)


@triton.jit
def softmax_update(s, v, m, l, acc):
    """Fold scores ``s [BM, BN]`` (log2 units, masked keys -inf) and their values ``v [BN, D]`` into the
    running max ``m [BM]``, sum ``l [BM]`` and fp32 accumulator ``acc [BM, D]``; returns the three."""
    m_new = tl.maximum(m, tl.max(s, axis=1))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(s - m_new[:, None])
    l = l * alpha + tl.sum(p, axis=1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return m_new, l, acc


@triton.jit
def load_kv_pages(
    data_ptr,
    scale_ptr,
    page_off,
    spage_off,
    tok_mask,
    D: tl.constexpr,
    PAGE: tl.constexpr,
    FMT: tl.constexpr,
    INTERP: tl.constexpr,
):
    """Like :func:`load_kv_halves` for whole pages: ``page_off [NPG]`` (int64) is the element offset of one
    KV head's contiguous page (NOTE: needs token stride == row width), ``tok_mask [NPG * PAGE]`` or None.

    Addresses are one base per page plus a constant tile, so per-token index math disappears.
    Returns ``(a, b)`` as ``[NPG * PAGE, D/2]`` tiles (see :func:`load_kv_halves`).
    """
    HALF: tl.constexpr = D // 2
    NPG: tl.constexpr = page_off.shape[0]
    BN: tl.constexpr = NPG * PAGE
    if FMT == 2:
        NB: tl.constexpr = D // 16
        cols = tl.arange(0, PAGE * HALF)
        scols = tl.arange(0, PAGE * NB)
        if tok_mask is None:
            raw = tl.load(data_ptr + page_off[:, None] + cols[None, :])
            sc = tl.load(scale_ptr + spage_off[:, None] + scols[None, :])
        else:
            m2 = tl.reshape(tok_mask, [NPG, PAGE])
            dm = tl.reshape(tl.broadcast_to(m2[:, :, None], [NPG, PAGE, HALF]), [NPG, PAGE * HALF])
            sm = tl.reshape(tl.broadcast_to(m2[:, :, None], [NPG, PAGE, NB]), [NPG, PAGE * NB])
            raw = tl.load(data_ptr + page_off[:, None] + cols[None, :], mask=dm, other=0)
            sc = tl.load(scale_ptr + spage_off[:, None] + scols[None, :], mask=sm, other=0.0)
        raw = tl.reshape(raw, [BN, NB, 8])
        sc = (tl.reshape(sc, [BN, NB]).to(tl.float16) * 128.0)[:, :, None]
        lo, hi = nvfp4_split(raw)
        a = tl.reshape(lo * sc, [BN, HALF])
        b = tl.reshape(hi * sc, [BN, HALF])
    else:
        cols = tl.arange(0, PAGE * D)
        if tok_mask is None:
            x = tl.load(data_ptr + page_off[:, None] + cols[None, :])
        else:
            m2 = tl.reshape(tok_mask, [NPG, PAGE])
            dm = tl.reshape(tl.broadcast_to(m2[:, :, None], [NPG, PAGE, D]), [NPG, PAGE * D])
            x = tl.load(data_ptr + page_off[:, None] + cols[None, :], mask=dm, other=0.0)
        a, b = _dot_ready(*tl.split(tl.permute(tl.reshape(x, [BN, 2, HALF]), [0, 2, 1])), FMT, INTERP)
    return a, b


@triton.jit
def _nvfp4_rows(raw, sc):
    """``raw [BN, D/2]`` bytes, ``sc [BN, D/16]`` E4M3 scales -> ``[BN, D]`` fp16 (value * 2**-7 / g), natural order.

    NOTE: built with join + reshape in the load layout, so the V tile reaches ``tl.dot`` as fp16 through
    one shared-memory transpose instead of byte-wise shared-memory reads (V's dot wants token pairs).
    """
    BN: tl.constexpr = raw.shape[0]
    HALF: tl.constexpr = raw.shape[1]
    NB: tl.constexpr = HALF // 8
    lo, hi = nvfp4_split(tl.reshape(raw, [BN, NB, 8]))
    s16 = (sc.to(tl.float16) * 128.0)[:, :, None]
    return tl.reshape(tl.join(lo * s16, hi * s16), [BN, 2 * HALF])


@triton.jit
def load_v_rows(data_ptr, scale_ptr, row_off, srow_off, mask, D: tl.constexpr, FMT: tl.constexpr,
                INTERP: tl.constexpr):  # fmt: skip
    """V rows (per-token offsets, masked rows read as zeros) -> ``[BN, D]`` in natural order.

    NVFP4 -> fp16 ``value * 2**-7 / g``; FP8 -> fp16 ``value / g``; float -> own dtype (fp32 if INTERP).
    """
    if FMT == 2:
        offs = tl.arange(0, D // 2)
        raw = tl.load(data_ptr + row_off[:, None] + offs[None, :], mask=mask[:, None], other=0)
        offs_s = tl.arange(0, D // 16)
        sc = tl.load(scale_ptr + srow_off[:, None] + offs_s[None, :], mask=mask[:, None], other=0.0)
        v = _nvfp4_rows(raw, sc)
    else:
        offs = tl.arange(0, D)
        v = tl.load(data_ptr + row_off[:, None] + offs[None, :], mask=mask[:, None], other=0.0)
        if FMT == 1:
            v = v.to(tl.float16)
        elif INTERP:
            v = v.to(tl.float32)
    return v


@triton.jit
def load_v_pages(data_ptr, scale_ptr, page_off, spage_off, D: tl.constexpr, PAGE: tl.constexpr,
                 FMT: tl.constexpr, INTERP: tl.constexpr):  # fmt: skip
    """Whole pages of V (see :func:`load_kv_pages`, no masks) -> ``[NPG * PAGE, D]`` in natural order."""
    NPG: tl.constexpr = page_off.shape[0]
    BN: tl.constexpr = NPG * PAGE
    if FMT == 2:
        cols = tl.arange(0, PAGE * (D // 2))
        scols = tl.arange(0, PAGE * (D // 16))
        raw = tl.load(data_ptr + page_off[:, None] + cols[None, :])
        sc = tl.load(scale_ptr + spage_off[:, None] + scols[None, :])
        v = _nvfp4_rows(tl.reshape(raw, [BN, D // 2]), tl.reshape(sc, [BN, D // 16]))
    else:
        cols = tl.arange(0, PAGE * D)
        v = tl.reshape(tl.load(data_ptr + page_off[:, None] + cols[None, :]), [BN, D])
        if FMT == 1:
            v = v.to(tl.float16)
        elif INTERP:
            v = v.to(tl.float32)
    return v
