"""Cache write and tail demotion kernels: every stored byte equals the formats reference's."""

from __future__ import annotations

import pytest
import torch

from nibblekv.formats.layout import KVDtype, PageLayout
from nibblekv.kernels.cache_write import demote_pages_triton, write_kv_triton
from nibblekv.kernels.reference import demote_pages_ref, write_kv_ref
from nibblekv.kernels.types import LayerKV

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _poisoned(layout: PageLayout, pages: int, gs: tuple[float, float]) -> tuple[LayerKV, LayerKV]:
    """Two identical pools whose every byte starts as 0xFF (NaN for floats and fp8)."""
    a = LayerKV.allocate(layout, pages, DEVICE, torch.tensor(gs, device=DEVICE))
    for t in (a.k_data, a.v_data, a.k_scale, a.v_scale):
        if t is not None:
            t.view(torch.uint8).fill_(0xFF)
    b = LayerKV(layout, a.k_data.clone(), a.v_data.clone(), None if a.k_scale is None else a.k_scale.clone(),
                None if a.v_scale is None else a.v_scale.clone(), a.global_scale.clone())  # fmt: skip
    return a, b


def _assert_same_bytes(a: LayerKV, b: LayerKV) -> None:
    for x, y in ((a.k_data, b.k_data), (a.v_data, b.v_data), (a.k_scale, b.k_scale), (a.v_scale, b.v_scale)):
        if x is None:
            assert y is None
            continue
        assert y is not None
        xb, yb = x.view(torch.uint8), y.view(torch.uint8)
        if x.dtype in (torch.bfloat16, torch.float32):  # NaN payloads may differ; compare NaN-ness + values
            assert torch.equal(torch.isnan(x), torch.isnan(y))
            keep = ~torch.isnan(x)
            ib = torch.int16 if x.dtype == torch.bfloat16 else torch.int32
            assert torch.equal(x[keep].view(ib), y[keep].view(ib))
        else:
            diff = (xb != yb).nonzero()
            assert diff.numel() == 0, f"{diff.shape[0]} bytes differ, first at {diff[0].tolist()}"


def _rows(t: int, hkv: int, d: int, g: float) -> torch.Tensor:
    """Rows with specials: NaN, +-Inf, exact E2M1 ties, an all-zero block, -0.0, tiny and huge values."""
    x = torch.randn(t, hkv, d) * 3 * g
    x[0, 0, :8] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1e-30, -1e30, 0.25, 0.75])
    x[1, 0, :16] = 0.0
    # block amax 6 -> scale 1/g exactly: the grid's tie points land exactly on the E2M1 boundaries
    x[1, -1, :16] = torch.tensor([6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5, 0.1]) * g
    x[2 % t, 0, 16:32] = torch.linspace(-1e-3, 1e-3, 16)  # E4M3 subnormal block scales
    return x.to(DEVICE)


@pytest.mark.parametrize("dtype", [KVDtype.NVFP4, KVDtype.FP8, KVDtype.BF16])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("src_dtype", [torch.bfloat16, torch.float32])
def test_write_kv_bit_exact(dtype: KVDtype, d: int, src_dtype: torch.dtype) -> None:
    torch.manual_seed(d)
    gs = (0.37, 1.0) if dtype.quantized else (1.0, 1.0)
    lay = PageLayout(dtype, 3, d, 5)
    a, b = _poisoned(lay, 9, gs)
    t = 11
    k, v = _rows(t, 3, d, gs[0]).to(src_dtype), _rows(t, 3, d, gs[1]).to(src_dtype)
    slots = torch.randperm(45)[:t].to(DEVICE)
    slots[3] = -1  # skipped row
    write_kv_ref(k, v, a, slots)
    write_kv_triton(k, v, b, slots)
    _assert_same_bytes(a, b)


def test_write_kv_strided_rows_int64_slots() -> None:
    # k/v as views of a fused qkv projection: row stride larger than heads * D
    qkv = torch.randn(7, 4 + 2 * 2, 64, device=DEVICE).to(torch.bfloat16)
    k, v = qkv[:, 4:6], qkv[:, 6:8]
    lay = PageLayout(KVDtype.NVFP4, 2, 64, 16)
    a, b = _poisoned(lay, 4, (1.0, 1.0))
    slots = torch.tensor([0, 17, 18, 63, 5, -1, 40], dtype=torch.int64, device=DEVICE)
    write_kv_ref(k, v, a, slots)
    write_kv_triton(k, v, b, slots)
    _assert_same_bytes(a, b)


@pytest.mark.parametrize("dtype", [KVDtype.NVFP4, KVDtype.FP8])
def test_demote_pages_bit_exact(dtype: KVDtype) -> None:
    torch.manual_seed(1)
    lay = PageLayout(dtype, 2, 64, 16)
    a, b = _poisoned(lay, 6, (0.5, 2.0))
    tail = LayerKV.allocate(PageLayout(KVDtype.BF16, 2, 64, 16), 4, DEVICE)
    tail.k_data.copy_(torch.randn(tail.k_data.shape) * 2)
    tail.v_data.copy_(torch.randn(tail.v_data.shape) * 5)
    src = torch.tensor([3, 0], device=DEVICE)
    dst = torch.tensor([5, 2], device=DEVICE)
    demote_pages_ref(tail, src, a, dst)
    demote_pages_triton(tail, src, b, dst)
    _assert_same_bytes(a, b)


def test_demote_rejects_mismatched_pages() -> None:
    lay = PageLayout(KVDtype.NVFP4, 2, 64, 16)
    a = LayerKV.allocate(lay, 2, DEVICE)
    tail = LayerKV.allocate(PageLayout(KVDtype.BF16, 2, 64, 8), 2, DEVICE)
    with pytest.raises(ValueError):
        demote_pages_triton(tail, torch.tensor([0], device=DEVICE), a, torch.tensor([1], device=DEVICE))
