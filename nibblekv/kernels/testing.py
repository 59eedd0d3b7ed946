"""Builders of random paged caches for kernel tests and benchmarks (not used by the engine).

Pages are placed at random pool positions so kernels cannot rely on contiguity across pages.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nibblekv.formats.kv_view import PagedKV
from nibblekv.formats.layer_kv import LayerKV
from nibblekv.formats.layout import KVDtype, PageLayout
from nibblekv.kernels._common import fmt_code, interpreting
from nibblekv.kernels.decode.knobs import base_config
from nibblekv.kernels.decode.launch_config import DecodeConfig, DecodeKernel
from nibblekv.kernels.reference import write_kv_ref


@dataclass
class PagedBatch:
    """A batch of requests laid out in a main pool (+ optional tail pool) at random pages."""

    cache: LayerKV
    page_table: torch.Tensor  # int32 [B, max pages]
    lens: torch.Tensor  # int32 [B]
    tail: LayerKV | None
    tail_page_table: torch.Tensor | None
    tail_lens: torch.Tensor | None

    def view(
        self,
        active: torch.Tensor | None = None,
        min_active: int | None = None,
        cu_seqlens: torch.Tensor | None = None,
        max_chunk: int | None = None,
    ) -> PagedKV:
        """The batch as the attention kernels read it (``active`` / ``min_active``: CUDA-graph padding;
        ``cu_seqlens`` / ``max_chunk``: an extend's chunks, the lengths then being their cached prefixes')."""
        tail = (self.tail, self.tail_page_table, self.tail_lens)
        return PagedKV(self.cache, self.page_table, self.lens, *tail, active, min_active, cu_seqlens, max_chunk)

    def head(self, n: int) -> PagedKV:
        """The view of the first ``n`` requests alone (a CUDA graph's real rows, for the reference twin)."""
        tpt, tl_ = self.tail_page_table, self.tail_lens
        tail = (self.tail, None if tpt is None else tpt[:n], None if tl_ is None else tl_[:n])
        return PagedKV(self.cache, self.page_table[:n], self.lens[:n], *tail)


def fill_pool(pool: LayerKV, scale: float = 1.0, chunk_pages: int = 4096) -> None:
    """Random contents for a whole pool, in place: valid codes/scales for quantized dtypes (no NaN).

    Works ``chunk_pages`` pages at a time so multi-GB benchmark pools need no fp32 temporaries of their size.
    """
    for data, sc in ((pool.k_data, pool.k_scale), (pool.v_data, pool.v_scale)):
        for p0 in range(0, data.shape[0], chunk_pages):
            d = data[p0 : p0 + chunk_pages]
            if pool.dtype is KVDtype.NVFP4:
                d.copy_(torch.randint(0, 256, d.shape, dtype=torch.uint8, device=d.device))
                assert sc is not None
                s = sc[p0 : p0 + chunk_pages]
                s.copy_((torch.rand(s.shape, device=s.device) * 2 * scale + 0.05).to(torch.float8_e4m3fn))
            elif pool.dtype is KVDtype.FP8:
                d.copy_((torch.randn(d.shape, device=d.device) * scale).to(torch.float8_e4m3fn))
            else:
                d.normal_(0.0, scale)


SCALE_PLACEMENTS = ("page", "apart", "beside", "heads")


def place_scales(pool: LayerKV, placement: str) -> LayerKV:
    """An NVFP4 pool with its block scales placed as asked (the kernels take each tensor's page and head
    strides, so they read any of these unchanged): ``page`` the pool layout's own (K rows, K scales, V rows,
    V scales of a (page, KV head) side by side: ``LayerKV.allocate``), ``apart`` four tensors of their own,
    ``beside`` each (page, KV head)'s 16 x D/16 scale bytes right after its 16 x D/2 data bytes, K and V in
    tensors of their own, ``heads`` as ``page`` but KV head-major (a head's pages one after another, so a
    request on consecutive pages reads one run a head). ``pool`` itself where it is laid out so already or
    holds no scales, else a copy."""
    if placement not in SCALE_PLACEMENTS:
        raise ValueError(f"placement must be one of {SCALE_PLACEMENTS}: {placement!r}")
    ks, vs = pool.k_scale, pool.v_scale
    if ks is None or vs is None or (placement == "page" and pool.pages is not None):
        return pool
    if placement == "apart":  # NOTE: .contiguous() copies the views of a page-laid pool, returns the rest
        kd, vd = pool.k_data.contiguous(), pool.v_data.contiguous()
        return LayerKV(pool.layout, kd, vd, ks.contiguous(), vs.contiguous(), pool.global_scale)
    if placement == "page":
        out = LayerKV.allocate(pool.layout, pool.num_pages, pool.k_data.device, pool.global_scale)
    else:
        lay, n, h = pool.layout, pool.num_pages, pool.layout.num_kv_heads
        run, dev = lay.head_run_bytes(), pool.k_data.device
        if placement == "heads":  # one buffer, a head's (page) runs one after another
            buf = torch.empty(h * n * 2 * run, dtype=torch.uint8, device=dev)
            (kd, kss), (vd, vss) = (lay.run_views(buf, n, 2 * run, n * 2 * run, i * run) for i in (0, 1))
        else:  # beside: K and V each a buffer of (page, head) runs
            bufs = [torch.empty(n * h * run, dtype=torch.uint8, device=dev) for _ in range(2)]
            (kd, kss), (vd, vss) = (lay.run_views(b, n, h * run, run, 0) for b in bufs)
        out = LayerKV(lay, kd, vd, kss, vss, pool.global_scale)
    assert out.k_scale is not None and out.v_scale is not None
    out.k_data.copy_(pool.k_data), out.k_scale.copy_(ks)
    out.v_data.copy_(pool.v_data), out.v_scale.copy_(vs)
    return out


def random_pages(
    batch: int,
    pages_per_req: int,
    pool_pages: int,
    device: torch.device | str,
    gen: torch.Generator | None = None,
) -> torch.Tensor:
    """int32 ``[batch, pages_per_req]`` distinct random page ids from ``pool_pages``."""
    perm = torch.randperm(pool_pages, generator=gen)[: batch * pages_per_req]
    return perm.reshape(batch, pages_per_req).to(torch.int32).to(device)


def make_batch(
    dtype: KVDtype,
    lens: list[int],
    kv_heads: int,
    head_dim: int,
    page_size: int,
    device: torch.device | str,
    tail_lens: list[int] | None = None,
    tail_dtype: torch.dtype = torch.bfloat16,
    global_scale: tuple[float, float] = (1.0, 1.0),
    via_write: bool = True,
    spare_pages: int = 3,
) -> PagedBatch:
    """Random requests of ``lens`` main-pool tokens (+ ``tail_lens`` tail tokens).

    ``via_write`` stores bf16-ish random rows through the reference cache write (realistic values);
    otherwise the pool is filled with random codes directly (fast, for benchmarks).
    """
    b = len(lens)
    lay = PageLayout(dtype, kv_heads, head_dim, page_size)
    per_req = max(1, -(-max(lens) // page_size))
    pool_pages = b * per_req + spare_pages
    gs = torch.tensor(global_scale if dtype.quantized else (1.0, 1.0), dtype=torch.float32, device=device)
    cache = LayerKV.allocate(lay, pool_pages, device, gs)
    pt = random_pages(b, per_req, pool_pages, device)
    if via_write:
        fill_pool(cache)  # stale pages and slots beyond each length hold random (finite) bytes
        for i, n in enumerate(lens):
            if n == 0:
                continue
            pos = torch.arange(n, device=device)
            slots = pt[i, pos // page_size].long() * page_size + pos % page_size
            k = torch.randn(n, kv_heads, head_dim, device=device) * 2.0 * global_scale[0]
            v = torch.randn(n, kv_heads, head_dim, device=device) * global_scale[1]
            write_kv_ref(k, v, cache, slots)
    else:
        fill_pool(cache)
    tail = tpt = tl_t = None
    if tail_lens is not None:
        tlay = PageLayout(
            KVDtype.BF16 if tail_dtype == torch.bfloat16 else KVDtype.FP32, kv_heads, head_dim, page_size
        )
        tper = max(1, -(-max(max(tail_lens), 1) // page_size))
        tpool = b * tper + spare_pages
        tail = LayerKV.allocate(tlay, tpool, device)
        fill_pool(tail)
        tpt = random_pages(b, tper, tpool, device)
        tl_t = torch.tensor(tail_lens, dtype=torch.int32, device=device)
    return PagedBatch(cache, pt, torch.tensor(lens, dtype=torch.int32, device=device), tail, tpt, tl_t)


def rel_rms(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` in float64 (NaN anywhere -> inf)."""
    o, r = out.double(), ref.double()
    if not torch.isfinite(o).all():
        return float("inf")
    return float((o - r).norm() / r.norm().clamp_min(1e-30))


# The short keys of a decode spec (benchmark command lines, test parameters) -> DecodeConfig fields.
SPEC_KEYS = {
    "bn": "block_n", "tbn": "tail_block_n", "w": "num_warps", "s": "num_stages", "conv": "conv", "sv": "split",
    "ppsm": "ppsm", "wppsm": "wppsm", "tpi": "tpi", "pf": "pf", "minc": "minc", "cdb": "combine_db",
    "vst": "vst", "vq": "vq", "tin": "tin", "cap": "split_cap", "bal": "balanced",
    "tpp": "tail_page_prefetch", "ts": "tail_splits", "wv": "wave_ctas", "st": "tail_stages",
    "bppsm": "bal_ppsm", "l2": "l2_ahead", "slots": "mma_slots", "pbf": "part_bf16",
    "lz": "lazy_rescale", "bh": "bal_heads", "l2b": "l2_bulk", "sms": "smem_stages",
}  # fmt: skip


def decode_config_from_spec(spec: str, kv_dtype: KVDtype, head_dim: int) -> DecodeConfig:
    """A decode spec ``"kernel[:key=value,...]"`` (``SPEC_KEYS``; e.g. ``"mma:tpi=1,bal=1"``) -> the typed
    config for ``decode_triton(config=...)``: the command-line edge of benchmarks and tests. Under the
    interpreter the non-mma kernels keep their small tiles: only ``bn``, ``tbn`` and ``sv`` apply there."""
    name, _, opts = spec.partition(":")
    names = tuple(k.value for k in DecodeKernel)
    if name not in names:
        raise ValueError(f"unknown decode kernel {name!r} (one of {names})")
    kernel, interp = DecodeKernel(name), interpreting()
    cfg = base_config(kernel, fmt_code(kv_dtype), head_dim, interp)
    changes: dict[str, int] = {}
    for item in filter(None, opts.split(",")):
        key, _, val = item.partition("=")
        if key not in SPEC_KEYS:
            raise ValueError(f"unknown decode option {key!r} in {spec!r} (one of {tuple(SPEC_KEYS)})")
        if not interp or cfg.mma or key in ("bn", "tbn", "sv"):
            if key == "s" and cfg.tail_stages is not None:  # NOTE: s sets the tail's stages too (a later st wins)
                changes["tail_stages"] = int(val)
            changes[SPEC_KEYS[key]] = int(val)
    return cfg.replace(**changes)
