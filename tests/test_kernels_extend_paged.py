"""Triton extend (chunked prefill over a cached prefix) vs the fp32 reference on the dequantized cache."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from nibblekv.formats.layout import KVDtype
from nibblekv.kernels.extend.paged import extend_triton
from nibblekv.kernels.reference import extend_ref
from nibblekv.kernels.testing import make_batch, rel_rms

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
P = 16


def _run(dtype: KVDtype, prefix: list[int], chunks: list[int], tails: list[int] | None, hkv: int, group: int,
         d: int, page: int = P, gscale: tuple[float, float] = (1.0, 1.0), fn: Callable[..., object] = extend_triton,
         **kw: object) -> float:  # fmt: skip
    """rel. RMS error of ``fn`` (extend_triton's signature) against extend_ref on a random ragged batch."""
    torch.manual_seed(hash((dtype.value, tuple(prefix), tuple(chunks), hkv, group, d)) % 2**31)
    pb = make_batch(dtype, prefix, hkv, d, page, DEVICE, tail_lens=tails, global_scale=gscale)
    t = sum(chunks)
    cu = torch.tensor([0] + list(torch.tensor(chunks).cumsum(0)), dtype=torch.int32, device=DEVICE)
    q = torch.randn(t, hkv * group, d, device=DEVICE).to(torch.bfloat16)
    k = torch.randn(t, hkv, d, device=DEVICE).to(torch.bfloat16)
    v = torch.randn(t, hkv, d, device=DEVICE).to(torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    sm = 1.0 / math.sqrt(d)
    fn(q, k, v, pb.view(cu_seqlens=cu), sm, out=out, **kw)
    ref = extend_ref(q.float(), k, v, pb.view(cu_seqlens=cu), sm)
    return rel_rms(out, ref)


@pytest.mark.parametrize("dtype", [KVDtype.NVFP4, KVDtype.FP8, KVDtype.BF16])
@pytest.mark.parametrize("group", [1, 3, 4])
def test_extend_matches_reference(dtype: KVDtype, group: int) -> None:
    # ragged: prefixes 0 / P-1 / P / P+1 / several pages, chunks 1..19, tails 0 / 1 / W
    assert (
        _run(dtype, [0, P - 1, P, P + 1, 2 * P + 3], [3, 1, 19, 6, 2], [5, 0, 1, 2 * P, 0], 2, group, 64)
        <= 1e-2
    )


@pytest.mark.parametrize("dtype", [KVDtype.NVFP4, KVDtype.FP8])
def test_extend_head_dim_128_no_tail_scales(dtype: KVDtype) -> None:
    assert _run(dtype, [37, 1], [5, 4], None, 1, 4, 128, gscale=(0.3, 3.0)) <= 1e-2


def test_extend_odd_page_size() -> None:
    assert _run(KVDtype.NVFP4, [4, 11], [3, 7], [2, 0], 2, 2, 64, page=5) <= 1e-2


@pytest.mark.parametrize("dtype", [KVDtype.NVFP4, KVDtype.FP8, KVDtype.BF16])
def test_extend_split_prefix(dtype: KVDtype) -> None:
    # the main-pool prefix split over 3 programs (empty splits for the short prefixes, one block each for
    # the long one), merged by the combine step; tails 0 / 1 / W in the last split
    assert _run(dtype, [0, P - 1, 3 * P + 5], [2, 5, 17], [3, 1, 2 * P], 2, 3, 64, num_splits=3) <= 1e-2


def test_extend_two_splits_and_odd_page() -> None:
    assert _run(KVDtype.NVFP4, [4, 41], [3, 7], [2, 0], 1, 4, 64, page=5, num_splits=2) <= 1e-2
    with pytest.raises(ValueError, match="num_splits"):
        _run(KVDtype.BF16, [4], [3], None, 1, 1, 64, num_splits=-1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU-only shapes")
@pytest.mark.parametrize("dtype", [KVDtype.NVFP4, KVDtype.FP8, KVDtype.BF16])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_extend_gpu_long(dtype: KVDtype, d: int) -> None:
    assert _run(dtype, [0, 1000, 4099], [300, 17, 129], [0, 64, 33], 8, 4, d) <= 1e-2
    assert _run(dtype, [0, 1000, 4099], [300, 17, 129], [0, 64, 33], 8, 4, d, num_splits=5) <= 1e-2
    # the own-chunk loop pipelined apart (1 stage), with a deeper prefix pipeline where it fits
    stages = 7 if d <= 128 and dtype != KVDtype.BF16 else 3
    kw = {"own_stages": 1, "num_stages": stages}
    assert _run(dtype, [0, 1000, 4099], [300, 17, 129], [0, 64, 33], 8, 4, d, **kw) <= 1e-2
    # registers capped for 3 programs per SM (spills, but must stay correct)
    assert _run(dtype, [0, 1000, 4099], [300, 17, 129], [0, 64, 33], 8, 4, d, max_registers=168) <= 1e-2
    # short chunks in a 16-row block (chunk x GQA 4 <= 16 rows: the default 64-row block is 3/4 padding)
    assert _run(dtype, [0, 1000, 4099], [4, 1, 3], [0, 64, 33], 8, 4, d, block_m=16) <= 1e-2
    # 128-row blocks on 8 warps: long chunks re-read the prefix half as often
    assert _run(dtype, [0, 1000, 4099], [300, 17, 129], [0, 64, 33], 8, 4, d, block_m=128, num_warps=8) <= 1e-2


@pytest.mark.parametrize("dtype", [KVDtype.NVFP4, KVDtype.FP8, KVDtype.BF16])
def test_extend_128_row_blocks(dtype: KVDtype) -> None:
    # a chunk of 40 tokens x GQA 4 = 160 rows: one full 128-row block and one mostly padding
    assert _run(dtype, [5, 40], [40, 3], [0, 17], 1, 4, 64, block_m=128, num_warps=8) <= 1e-2


def test_auto_extend_splits_only_for_grids_smaller_than_the_gpu() -> None:
    from nibblekv.kernels.extend.paged import auto_extend_splits

    sms = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132
    assert auto_extend_splits(sms + 1) == 1 and auto_extend_splits(10 * sms) == 1
    assert auto_extend_splits(sms) == 2 and auto_extend_splits(1) == 8
    assert 2 <= auto_extend_splits(sms // 2) <= 8
