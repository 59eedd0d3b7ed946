"""The KV storage formats: exact bit-level behaviour, checked against vectors written by hand."""

from __future__ import annotations

import math

import pytest
import torch

from nibblekv.formats import KVDtype, PageLayout, bytes_per_value, e2m1, fp8, nvfp4, parse_kv_dtype
from nibblekv.formats.layout import dequantize_rows, quantize_rows


def _bytes(t: torch.Tensor) -> list[int]:
    return t.view(torch.uint8).flatten().tolist()


# ---------------------------------------------------------------- E2M1 codes
def test_all_16_codes_decode() -> None:
    codes = torch.arange(16, dtype=torch.uint8)
    want = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]
    assert e2m1.decode(codes).tolist() == want


def test_every_code_value_encodes_to_itself() -> None:
    vals = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.5, -1, -1.5, -2, -3, -4, -6])
    assert e2m1.encode(vals).tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15]


# (value, code): every tie goes to the even code index; values beyond 6 saturate.
TIES = [
    (0.25, 0), (0.75, 2), (1.25, 2), (1.75, 4), (2.5, 4), (3.5, 6), (5.0, 6),
    (-0.25, 0), (-0.75, 10), (-1.25, 10), (-1.75, 12), (-2.5, 12), (-3.5, 14), (-5.0, 14),
    (7.0, 7), (1e9, 7), (-1e9, 15), (-0.0, 0), (0.1, 0), (-0.1, 0),
]


@pytest.mark.parametrize("value,code", TIES)
def test_tie_boundaries_and_saturation(value: float, code: int) -> None:
    assert e2m1.encode(torch.tensor([value])).item() == code


@pytest.mark.parametrize("bound", [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
def test_just_around_each_boundary(bound: float) -> None:
    grid = list(e2m1.E2M1_GRID)
    b = torch.tensor([bound, bound], dtype=torch.float32)
    around = torch.nextafter(b, torch.tensor([0.0, math.inf]))  # float32 neighbours
    lo_idx = max(i for i, g in enumerate(grid) if g < bound)
    got = e2m1.encode(around).tolist()
    assert got == [lo_idx, lo_idx + 1]


def test_pack_low_nibble_is_even_element() -> None:
    codes = torch.tensor([0x1, 0x2, 0xF, 0x0, 0x7, 0x9], dtype=torch.uint8)
    assert e2m1.pack(codes).tolist() == [0x21, 0x0F, 0x97]
    assert e2m1.unpack(e2m1.pack(codes)).tolist() == codes.tolist()


def test_pack_rejects_odd_length() -> None:
    with pytest.raises(ValueError):
        e2m1.pack(torch.zeros(3, dtype=torch.uint8))


# ---------------------------------------------------------------- NVFP4 golden vectors (by hand)
def _block(*vals: float) -> torch.Tensor:
    return torch.tensor(list(vals) + [0.0] * (16 - len(vals)), dtype=torch.float32)


def test_golden_unit_scale() -> None:
    # amax 6 -> s = 6/6 = 1.0 = E4M3 0x38; each value lands on its own tie rule.
    x = torch.tensor([0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, -6.0])
    packed, scale = nvfp4.quantize(x)
    # codes 0,0 1,2 2,2 3,4 4,4 5,6 6,6 7,15
    assert _bytes(packed) == [0x00, 0x21, 0x22, 0x43, 0x44, 0x65, 0x66, 0xF7]
    assert _bytes(scale) == [0x38]


def test_golden_scale_two() -> None:
    # amax 12 -> s = 2.0 = 0x40; q = x/2 = 6,-6,.5,-.5,.25,1.5,3.5,0 -> codes 7,15,1,9,0,3,6,0
    packed, scale = nvfp4.quantize(_block(12, -12, 1, -1, 0.5, 3, 7, 0))
    assert _bytes(packed) == [0xF7, 0x91, 0x30, 0x06, 0, 0, 0, 0]
    assert _bytes(scale) == [0x40]
    back = nvfp4.dequantize(packed, scale)
    assert back[:8].tolist() == [12, -12, 1, -1, 0, 3, 8, 0]


def test_golden_rounded_scale() -> None:
    # amax 1 -> 1/6 = 0.1667 rounds (RNE) to E4M3 0.171875 = 0x23 (exp 4, mantissa 3);
    # the *rounded* scale divides: 1/0.171875 = 5.82 -> 6 (7), 0.5/.171875 = 2.91 -> 3 (5),
    # -0.25/.171875 = -1.45 -> -1.5 (11).
    packed, scale = nvfp4.quantize(_block(1.0, 0.5, -0.25))
    assert _bytes(scale) == [0x23]
    assert _bytes(packed)[:2] == [0x57, 0x0B]
    assert nvfp4.dequantize(packed, scale)[:3].tolist() == [1.03125, 0.515625, -0.2578125]


def test_golden_global_scale() -> None:
    # g = 0.5, amax 3 -> s = 3/(6*0.5) = 1.0 (0x38); q = x / (1.0*0.5)
    packed, scale = nvfp4.quantize(_block(3.0, -1.0, 0.5), global_scale=0.5)
    assert _bytes(scale) == [0x38]
    assert _bytes(packed)[:2] == [0xC7, 0x02]  # q = 6, -2, 1: codes 7, 12 | 2, 0
    assert nvfp4.dequantize(packed, scale, 0.5)[:3].tolist() == [3.0, -1.0, 0.5]


def test_saturation_and_non_finite() -> None:
    # NaN -> 0; +-Inf and huge values clamp to +-6*448*g = 2688; scale saturates at 448 (0x7E).
    x = _block(float("inf"), float("-inf"), float("nan"), 1e30, -1e30)
    packed, scale = nvfp4.quantize(x)
    assert _bytes(scale) == [0x7E]
    assert _bytes(packed)[:3] == [0xF7, 0x70, 0x0F]  # codes 7,15 | 0,7 | 15,0
    back = nvfp4.dequantize(packed, scale)
    assert back[:5].tolist() == [2688.0, -2688.0, 0.0, 2688.0, -2688.0]
    assert torch.isfinite(back).all()


def test_zero_and_tiny_blocks_dequantize_to_zero() -> None:
    x = torch.cat([torch.zeros(16), torch.full((16,), 1e-5), -torch.zeros(16)])
    packed, scale = nvfp4.quantize(x)
    assert _bytes(scale) == [0, 0, 0]
    assert _bytes(packed) == [0] * 24
    back = nvfp4.dequantize(packed, scale)
    assert back.tolist() == [0.0] * 48 and not torch.signbit(back).any()


def test_nvfp4_rejects_bad_head_dim() -> None:
    with pytest.raises(ValueError):
        nvfp4.quantize(torch.zeros(2, 24))
    with pytest.raises(ValueError):
        PageLayout(KVDtype.NVFP4, num_kv_heads=2, head_dim=24, page_size=16)


# ---------------------------------------------------------------- FP8
def test_fp8_golden_and_saturation() -> None:
    x = torch.tensor([1.0, 500.0, -500.0, float("nan"), float("inf"), 0.1, float("-inf")])
    assert _bytes(fp8.quantize(x)) == [0x38, 0x7E, 0xFE, 0x00, 0x7E, 0x1D, 0xFE]
    # per-layer scale: stored = x / scale
    assert _bytes(fp8.quantize(torch.tensor([4.0]), scale=2.0)) == [0x40]
    assert fp8.dequantize(fp8.quantize(torch.tensor([4.0]), 2.0), 2.0).item() == 4.0


# ---------------------------------------------------------------- round-trip error bounds
def _rel_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("outliers", [False, True])
def test_round_trip_error_bounds(outliers: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(256, 128, generator=gen)
    if outliers:  # 1% of values 50x larger: block scales keep the damage local
        mask = torch.rand(x.shape, generator=gen) < 0.01
        x = torch.where(mask, x * 50, x)
    errs = {}
    for dt in (KVDtype.BF16, KVDtype.FP8, KVDtype.NVFP4):
        d, s = quantize_rows(x, dt)
        errs[dt] = _rel_rms(dequantize_rows(d, s, dt), x)
    assert errs[KVDtype.BF16] < 3e-3
    assert errs[KVDtype.FP8] < 0.035
    assert errs[KVDtype.NVFP4] < 0.12
    assert errs[KVDtype.BF16] < errs[KVDtype.FP8] < errs[KVDtype.NVFP4]
    # NVFP4 error per element is bounded by half a grid step of its block: <= amax16/6 * 1 (step 2 at 4..6)/2
    back = nvfp4.fake_quantize(x)
    amax = x.reshape(-1, 16).abs().amax(-1, keepdim=True)
    bound = amax * (1.0625 / 6) * 1.0 + 1e-6  # E4M3 rounds s up by < 1/16; largest half-step is 1.0
    assert ((back - x).reshape(-1, 16).abs() <= bound).all()


def test_global_scale_calibration_range() -> None:
    # A large-magnitude layer saturates with g=1 (amax/6 > 448) but not with g = amax/2688.
    x = torch.randn(64, 64) * 10000
    g = float(x.abs().max() / 2688)
    err_g1 = _rel_rms(nvfp4.fake_quantize(x, 1.0), x)
    err_cal = _rel_rms(nvfp4.fake_quantize(x, g), x)
    assert err_cal < 0.12 < err_g1


# ---------------------------------------------------------------- bytes and layout
def test_bytes_per_token_and_ratio() -> None:
    # Llama-3.3-70B-like: 8 KV heads, head_dim 128, per layer
    per = {dt: PageLayout(dt, 8, 128, 16).bytes_per_token() for dt in (KVDtype.BF16, KVDtype.FP8, KVDtype.NVFP4)}
    assert per == {KVDtype.BF16: 4096, KVDtype.FP8: 2048, KVDtype.NVFP4: 1152}
    assert per[KVDtype.NVFP4] / per[KVDtype.FP8] == 0.5625
    assert bytes_per_value(KVDtype.NVFP4) == 0.5625 and bytes_per_value(KVDtype.FP8) == 1.0


def test_page_shapes() -> None:
    lay = PageLayout(KVDtype.NVFP4, num_kv_heads=3, head_dim=64, page_size=16)
    data, scale = lay.allocate(5, "cpu")
    assert data.shape == (5, 3, 16, 32) and data.dtype == torch.uint8
    assert scale is not None and scale.shape == (5, 3, 16, 4) and scale.dtype == torch.float8_e4m3fn
    fp = PageLayout(KVDtype.FP8, 3, 64, 16).allocate(5, "cpu")
    assert fp[0].shape == (5, 3, 16, 64) and fp[0].dtype == torch.float8_e4m3fn and fp[1] is None


def test_nvfp4_pool_is_one_tensor_a_run_per_page_and_head() -> None:
    # LayerKV.allocate: an NVFP4 layer is one uint8 tensor; a (page, head)'s K rows, K scales, V rows and V
    # scales lie side by side in it (formats/layout.py), every byte of a page in its row of ``pages``
    from nibblekv.formats.layer_kv import LayerKV

    lay = PageLayout(KVDtype.NVFP4, num_kv_heads=3, head_dim=64, page_size=4)
    kv = LayerKV.allocate(lay, 5, "cpu")
    assert kv.pages is not None and kv.k_scale is not None and kv.v_scale is not None
    run = lay.head_run_bytes()
    assert run == 4 * (32 + 4) and tuple(kv.pages.shape) == (5, 3 * 2 * run)
    assert kv.pages.numel() == 5 * lay.page_size * lay.bytes_per_token()  # the bytes four tensors took
    assert kv.k_data.shape == (5, 3, 4, 32) and kv.k_scale.shape == (5, 3, 4, 4)
    base = kv.pages.data_ptr()
    for t, off in ((kv.k_data, 0), (kv.k_scale, 4 * 32), (kv.v_data, run), (kv.v_scale, run + 4 * 32)):
        assert t.data_ptr() - base == off and t.stride()[:2] == (3 * 2 * run, 2 * run)
    kv.v_scale[2, 1, 3, 0] = 1.0  # E4M3 1.0 = 0x38: the last scale row of page 2, head 1
    assert kv.pages[2, 1 * 2 * run + run + 4 * 32 + 3 * 4].item() == 0x38
    assert int(kv.pages.count_nonzero()) == 1
    fp = LayerKV.allocate(PageLayout(KVDtype.FP8, 3, 64, 4), 5, "cpu")
    assert fp.pages is None and fp.k_data.is_contiguous()


def test_parse_kv_dtype() -> None:
    assert parse_kv_dtype("auto", torch.float32) is KVDtype.FP32
    assert parse_kv_dtype("fp8") is KVDtype.FP8
    assert parse_kv_dtype("NVFP4") is KVDtype.NVFP4
    with pytest.raises(ValueError, match="unknown KV cache dtype"):
        parse_kv_dtype("int4")
