"""Cache write and tail demotion kernels: every stored byte equals the formats reference's."""

from __future__ import annotations

import pytest
import torch

from nibblekv.formats import nvfp4
from nibblekv.formats.kv_view import TailDemotion
from nibblekv.formats.layer_kv import LayerKV
from nibblekv.formats.layout import KVDtype, PageLayout
from nibblekv.kernels.reference import demote_pages_ref, write_kv_ref
from nibblekv.kernels.write import demote_pages_triton, write_kv_triton

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
    demote_pages_ref(TailDemotion(tail, src, a, dst))
    demote_pages_triton(TailDemotion(tail, src, b, dst))
    _assert_same_bytes(a, b)


def test_demote_pages_skips_empty_slots() -> None:
    # CUDA graphs pass a fixed-size list, one slot per row: dst -1 = empty (src 0, the scratch page); both
    # twins skip those and leave every other page as it was
    torch.manual_seed(2)
    lay = PageLayout(KVDtype.NVFP4, 3, 64, 5)
    a, b = _poisoned(lay, 6, (0.5, 2.0))
    before = a.k_data.view(torch.uint8).clone(), a.k_scale.view(torch.uint8).clone()
    tail = LayerKV.allocate(PageLayout(KVDtype.BF16, 3, 64, 5), 4, DEVICE)
    tail.k_data.copy_(torch.randn(tail.k_data.shape) * 2)
    tail.v_data.copy_(torch.randn(tail.v_data.shape) * 5)
    src = torch.tensor([0, 3, 0, 1], device=DEVICE)
    dst = torch.tensor([-1, 4, -1, 1], device=DEVICE)
    demote_pages_ref(TailDemotion(tail, src, a, dst))
    demote_pages_triton(TailDemotion(tail, src, b, dst))
    _assert_same_bytes(a, b)
    untouched = [0, 2, 3, 5]
    data, scale = a.k_data.view(torch.uint8), a.k_scale.view(torch.uint8)  # raw bytes: NaN != NaN
    assert torch.equal(data[untouched], before[0][untouched])
    assert torch.equal(scale[untouched], before[1][untouched])
    assert not torch.equal(data[4], before[0][4])


def test_demote_rejects_mismatched_pages() -> None:
    lay = PageLayout(KVDtype.NVFP4, 2, 64, 16)
    a = LayerKV.allocate(lay, 2, DEVICE)
    tail = LayerKV.allocate(PageLayout(KVDtype.BF16, 2, 64, 8), 2, DEVICE)
    src, dst = torch.tensor([0], device=DEVICE), torch.tensor([1], device=DEVICE)
    with pytest.raises(ValueError):
        demote_pages_triton(TailDemotion(tail, src, a, dst))


# --- 4over6 block scales (NVFP4): per block, the better of amax/6 and amax/4 -------------------------------

# Blocks (times g, a power of two so they stay exact) whose winner is known: on the grid at scale 1 only
# with amax mapped to 4 (amax/4 wins), only with amax mapped to 6 (amax/6 wins), and exact under both
# (a tie: the standard amax/6 scale is kept).
_FOUR_WINS = [4, 3, 2, 1.5, 1, 0.5, 0, -4, -3, -2, -1.5, -1, -0.5, 0, 4, -4]
_SIX_WINS = [6, 4, 3, 2, 1.5, 1, 0.5, 0, -6, -4, -3, -2, -1.5, -1, -0.5, 0]
_TIE = [3] + [0] * 15
# Near-ties: the two squared errors are equal in exact arithmetic and differ only by the rounding of their
# fp32 sums, so the winner depends on the summation order (the reference's fixed tree of adjacent pairs).
# Under that tree amax/4 wins _ORDER_4 (a sequential sum would keep amax/6) and amax/6 keeps _ORDER_6
# (NumPy's and torch's .sum() order would pick amax/4): a kernel summing in another order fails here.
_NEAR = (0.19285203516483307, 2.192852020263672, 0.5571479797363281)  # fp32 values
_ORDER_4 = [6.0, _NEAR[2], _NEAR[0], _NEAR[1]] + [0.0] * 12
_ORDER_6 = [6.0, _NEAR[0]] + [0.0] * 6 + [_NEAR[2], _NEAR[1]] + [0.0] * 6


def _rows_4o6(t: int, hkv: int, d: int, g: float) -> torch.Tensor:
    """Random rows with, in distinct blocks: NaN/+-Inf/-0.0/tiny/huge, all zeros, known 4over6 winners."""
    x = torch.randn(t, hkv, d) * 3 * g
    x[:, :, d // 2 :] *= torch.rand(t, hkv, 1) * 4  # blocks of varied magnitude
    x[0, 0, :8] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1e-30, -1e30, 0.25, 0.75])
    x[-1, -1, 16:32] = 0.0
    x[-1, 0, 32:48] = torch.tensor(_FOUR_WINS) * g
    x[0, -1, 48:64] = torch.tensor(_SIX_WINS) * g
    x[0, 1, 32:48] = torch.tensor(_TIE) * g
    x[0, 2, 0:16] = torch.tensor(_ORDER_4) * g
    x[-1, 2, 32:48] = torch.tensor(_ORDER_6) * g
    x[t // 2, 1, 0:16] = torch.linspace(-1e-3, 1e-3, 16) * g  # E4M3 subnormal block scales
    return x


def _check_winners(x: torch.Tensor, g: float) -> None:
    """The crafted blocks really exercise both winners and the tie (checked on the reference)."""
    _, plain = nvfp4.quantize(x, g)
    _, fos = nvfp4.quantize(x, g, four_over_six=True)
    plain, fos = plain.float(), fos.float()
    assert fos[-1, 0, 2] == 1.0 and plain[-1, 0, 2] != 1.0  # amax/4 wins
    assert fos[0, -1, 3] == plain[0, -1, 3] == 1.0  # amax/6 wins (amax/4 would be 1.5)
    assert fos[0, 1, 2] == plain[0, 1, 2] == 0.5  # tie (amax/4 would be 0.75, as exact): standard kept
    assert fos[-1, -1, 1] == 0.0
    if x.dtype == torch.float32:  # (bf16 rows lose the near-ties)
        assert fos[0, 2, 0] == 1.5 and plain[0, 2, 0] == 1.0  # _ORDER_4: amax/4 by an ulp
        assert fos[-1, 2, 2] == plain[-1, 2, 2] == 1.0  # _ORDER_6: amax/6 by an ulp
    assert (fos != plain).any() and (fos == plain).sum() > 3  # random blocks go both ways too


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("src_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("t", "hkv", "page"), [(1, 3, 16), (15, 5, 16), (17, 3, 15), (16, 5, 17)])
def test_write_kv_4over6_bit_exact(d: int, src_dtype: torch.dtype, t: int, hkv: int, page: int) -> None:
    torch.manual_seed(d + t)
    gs = (0.5, 2.0)
    lay = PageLayout(KVDtype.NVFP4, hkv, d, page)
    pages = (t + page - 1) // page + 2
    a, b = _poisoned(lay, pages, gs)
    k, v = _rows_4o6(t, hkv, d, gs[0]), _rows_4o6(t, hkv, d, gs[1])
    _check_winners(k.to(src_dtype), gs[0])
    k, v = k.to(src_dtype).to(DEVICE), v.to(src_dtype).to(DEVICE)
    slots = torch.randperm(pages * page)[:t].to(DEVICE)
    if t > 1:
        slots[1] = -1  # skipped row
    write_kv_ref(k, v, a, slots, four_over_six=True)
    write_kv_triton(k, v, b, slots, four_over_six=True)
    _assert_same_bytes(a, b)


def test_write_kv_4over6_random_global_scale() -> None:
    # a global scale that is not a power of two, and blocks of every magnitude from 1e-6 to 1e6
    torch.manual_seed(7)
    gs = (0.37, 1.7)
    lay = PageLayout(KVDtype.NVFP4, 3, 64, 5)
    a, b = _poisoned(lay, 4, gs)
    mags = torch.exp2(torch.randint(-20, 20, (11, 3, 4, 1)).float())
    k = (torch.randn(11, 3, 4, 16) * mags).reshape(11, 3, 64).to(DEVICE)
    v = _rows(11, 3, 64, gs[1]).to(DEVICE)
    slots = torch.randperm(20)[:11].to(DEVICE)
    write_kv_ref(k, v, a, slots, four_over_six=True)
    write_kv_triton(k, v, b, slots, four_over_six=True)
    _assert_same_bytes(a, b)


def test_write_kv_4over6_ignored_for_fp8() -> None:
    lay = PageLayout(KVDtype.FP8, 3, 64, 5)
    a, b = _poisoned(lay, 4, (0.5, 1.0))
    k, v = _rows(7, 3, 64, 0.5).to(DEVICE), _rows(7, 3, 64, 1.0).to(DEVICE)
    slots = torch.arange(3, 10, device=DEVICE)
    write_kv_ref(k, v, a, slots)
    write_kv_triton(k, v, b, slots, four_over_six=True)
    _assert_same_bytes(a, b)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize(("hkv", "page", "tail_dtype"), [(3, 15, KVDtype.BF16), (5, 17, KVDtype.FP32)])
def test_demote_pages_4over6_bit_exact(d: int, hkv: int, page: int, tail_dtype: KVDtype) -> None:
    torch.manual_seed(d + page)
    gs = (0.5, 2.0)
    a, b = _poisoned(PageLayout(KVDtype.NVFP4, hkv, d, page), 7, gs)
    tail = LayerKV.allocate(PageLayout(tail_dtype, hkv, d, page), 4, DEVICE)
    for data, g in ((tail.k_data, gs[0]), (tail.v_data, gs[1])):
        rows = _rows_4o6(4 * page, hkv, d, g)  # token-major rows of the 4 tail pages, in page order
        data.copy_(rows.reshape(4, page, hkv, d).transpose(1, 2).to(data.dtype))
    _check_winners(tail.k_data.transpose(1, 2).reshape(4 * page, hkv, d), gs[0])
    src = torch.tensor([3, 0, 2], device=DEVICE)
    dst = torch.tensor([6, 1, 4], device=DEVICE)
    demote_pages_ref(TailDemotion(tail, src, a, dst), four_over_six=True)
    demote_pages_triton(TailDemotion(tail, src, b, dst), four_over_six=True)
    _assert_same_bytes(a, b)
