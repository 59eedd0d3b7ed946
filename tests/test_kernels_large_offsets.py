"""Pages past 2 GiB of one pool tensor: the Triton kernels address them with 64-bit offsets.

At 1M-token contexts one layer's K (or V) tensor passes 2**31 bytes on a big GPU (a 16-layer model's fp8 pool on
an H200: ~3.7 GiB per tensor), so ``page id x page stride`` no longer fits int32. Each pool tensor here spans a
little over 2 GiB and the requests' pages sit at its end; the tensors come from ``torch.empty``, so on CPU only
the touched pages are ever backed by memory (~10 MiB resident). The kernels run through Triton's interpreter on
CPU, which wraps int32 arithmetic as the GPU does (an offset left in int32 would point ~2 GiB away); every result
must equal the pure-torch twin, which indexes with int64.
"""

from __future__ import annotations

import math

import pytest
import torch

from nibblekv.formats import KVDtype, PageLayout
from nibblekv.formats.kv_view import PagedKV, TailDemotion
from nibblekv.formats.layer_kv import LayerKV
from nibblekv.kernels import decode_attention, demote_pages, extend_attention, write_kv
from nibblekv.kernels.page_copy import gather_pages_ref, gather_pages_triton
from nibblekv.kernels.reference import decode_ref, extend_ref, gather_kv

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Llama-3.1-8B's heads on the GPU (the kernels' real dispatch); fewer in the CPU interpreter (seconds)
HKV, HQ = (8, 32) if DEVICE == "cuda" else (1, 2)
D, P = 128, 16


def _big_cache(dtype: KVDtype) -> LayerKV:
    """K and V tensors of just over 2**31 bytes each (uninitialized: nothing is touched but the pages written)."""
    layout = PageLayout(dtype, HKV, D, P)
    shape = torch.Size(layout.data_shape(1))
    page_bytes = shape.numel() * torch.empty((), dtype=layout.torch_dtype).element_size()
    n = (1 << 31) // page_bytes + 64

    def tensors() -> tuple[torch.Tensor, torch.Tensor | None]:
        data = torch.empty(layout.data_shape(n), dtype=layout.torch_dtype, device=DEVICE)
        sshape = layout.scale_shape(n)
        scale = None if sshape is None else torch.empty(sshape, dtype=torch.float8_e4m3fn, device=DEVICE)
        return data, scale

    (kd, ks), (vd, vs) = tensors(), tensors()
    cache = LayerKV(layout, kd, vd, ks, vs, torch.ones(2, device=DEVICE))
    assert (n - 1) * kd.stride(0) * kd.element_size() >= 1 << 31  # the last page starts past 2 GiB
    return cache


def gather_kv_rows(cache: LayerKV, data: torch.Tensor, pages: torch.Tensor) -> torch.Tensor:
    """Pages ``pages`` of ``data`` (K or V of ``cache``) dequantized by the int64 reference: [pages, HKV, P, D]."""
    k, v = gather_kv(cache, pages, len(pages) * P)
    rows = k if data is cache.k_data else v
    return rows.view(len(pages), P, HKV, D).transpose(1, 2)


@pytest.mark.parametrize("dtype", [KVDtype.FP8, KVDtype.NVFP4, KVDtype.BF16])
def test_write_decode_extend_and_page_copy_past_2gib(dtype: KVDtype, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NIBBLEKV_KERNELS", "triton")  # CPU: the interpreter runs the same kernels
    cache = _big_cache(dtype)
    n = cache.num_pages
    pages = torch.tensor([n - 1, n - 40], dtype=torch.int32, device=DEVICE)
    g = torch.Generator().manual_seed(0)
    slots = (pages.long()[:, None] * P + torch.arange(P, device=DEVICE)).reshape(-1)
    k = torch.randn(slots.numel(), HKV, D, generator=g).to(DEVICE)
    v = torch.randn(slots.numel(), HKV, D, generator=g).to(DEVICE)
    write_kv(k, v, cache, slots)
    # the bytes landed on those pages: read back by int64 torch indexing they are the written rows
    one = PagedKV(cache, pages[None], torch.tensor([1]))
    back = decode_ref(k[:1].repeat_interleave(HQ // HKV, 1), one, 1.0)
    assert torch.isfinite(back).all()
    tol = {KVDtype.BF16: 1e-2, KVDtype.FP8: 2e-3, KVDtype.NVFP4: 2e-3}[dtype]

    table = torch.stack([pages, pages.flip(0)])
    lens = torch.tensor([2 * P - 5, 2 * P], dtype=torch.int32, device=DEVICE)
    q = torch.randn(2, HQ, D, generator=g).to(DEVICE)
    scale = 1 / math.sqrt(D)
    out = decode_attention(q, PagedKV(cache, table, lens), scale)
    torch.testing.assert_close(out, decode_ref(q, PagedKV(cache, table, lens), scale), atol=tol, rtol=0)

    qe = torch.randn(5, HQ, D, generator=g).to(DEVICE)
    kn, vn = torch.randn(5, HKV, D, generator=g).to(DEVICE), torch.randn(5, HKV, D, generator=g).to(DEVICE)
    cu = torch.tensor([0, 3, 5], dtype=torch.int32, device=DEVICE)
    plens = torch.tensor([P + 2, 2 * P], dtype=torch.int32, device=DEVICE)
    prefix = PagedKV(cache, table, plens, cu_seqlens=cu)
    ref = extend_ref(qe, kn, vn, prefix, scale)
    # NOTE: extend_triton; short chunks (extend_decode) run the decode kernels checked above
    got = extend_attention(qe, kn, vn, prefix, scale)
    torch.testing.assert_close(got, ref, atol=tol, rtol=0)

    if dtype.quantized:  # tail (bf16) pages demoted into the pages past 2 GiB
        tail = LayerKV.allocate(PageLayout(KVDtype.BF16, HKV, D, P), 3, DEVICE)
        for t in (tail.k_data, tail.v_data):
            t.copy_(torch.randn(t.shape, generator=g))
        demote_pages(TailDemotion(tail, torch.tensor([1, 2], device=DEVICE), cache, pages.long()))
        for data, src in ((cache.k_data, tail.k_data), (cache.v_data, tail.v_data)):
            got_rows = gather_kv_rows(cache, data, pages)
            torch.testing.assert_close(got_rows, src[1:3].float(), atol=0.6, rtol=0.25)

    # the host tier's page gather: page rows [pages, bytes] of the K and V data
    segs = [t.view(n, -1).view(torch.uint8) for t in (cache.k_data, cache.v_data)]
    idx = pages.long()
    want = torch.empty(2, sum(s.shape[1] for s in segs), dtype=torch.uint8, device=DEVICE)
    got_rows = torch.empty_like(want)
    gather_pages_ref(segs, idx, want)
    gather_pages_triton(segs, idx, got_rows)
    assert torch.equal(got_rows, want)
