"""The persistent TMA FP8 GEMM (kernels.fp8.gemm_tma) against its twin (fp8.reference): both formats, odd
shapes (partial row / column tiles, K past the last whole 128-step, uneven k-splits, more units than
programs), bias; bad operands refused."""

from __future__ import annotations

import pytest
import torch

from nibblekv.formats.fp8_weights import quantize_weight_block, quantize_weight_channel
from nibblekv.kernels.fp8.gemm import fp8_block_gemm, fp8_rowwise_gemm
from nibblekv.kernels.fp8.gemm_tma import fp8_tma_gemm, tma_loads
from nibblekv.kernels.fp8.quant import quant_fp8_groups
from nibblekv.kernels.fp8.reference import fp8_gemm_ref
from nibblekv.kernels.fp8.tiles import TMA_MAX_M, TmaTile, tma_tile
from nibblekv.kernels.testing import rel_rms

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cuda" and torch.cuda.get_device_capability() < (9, 0):
    pytest.skip("TMA and FP8 tensor cores need an sm_90 GPU", allow_module_level=True)
# NOTE: the interpreter sums in fp32; Hopper's FP8 MMAs accumulate in reduced precision between promotions
GEMM_RMS = 2e-3 if DEVICE == "cuda" else 1e-5
CASES = [  # (m, k, n, tile)
    (37, 400, 200, TmaTile(32, 64, split_k=2)),  # 2 x 4 tiles, K = 3 steps + 16: splits of 2 and 2
    (70, 272, 96, TmaTile(64, 32, split_k=3, programs_per_sm=1)),  # 3 splits of 1 step (the last partial)
    (5, 512, 130, TmaTile(16, 128)),  # a partial column tile, no split
    (3, 400, 200, TmaTile(16, 64, split_k=3, swap_ab=True)),  # swapped: the weight tile the MMA's M side
] if DEVICE == "cpu" else [
    (64, 4096, 6144, TmaTile(64, 128)), (128, 4096, 4096, TmaTile(128, 128, split_k=2, num_warps=8)),
    (200, 14336, 4096, TmaTile(128, 64, split_k=3, num_warps=8)),
    (37, 1040, 264, TmaTile(64, 64, 2, 4, 6, 2)), (1, 4096, 6144, TmaTile(16, 64, split_k=4, swap_ab=True)),
    (30, 1040, 264, TmaTile(32, 128, 2, swap_ab=True)),
]  # fmt: skip


@pytest.mark.parametrize("block", [None, 128])
@pytest.mark.parametrize(("m", "k", "n", "tile"), CASES)
def test_tma_gemm_matches_reference(
    m: int, k: int, n: int, tile: TmaTile, block: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(m + k)
    empty = torch.empty

    def nan_empty(*args: object, **kwargs: object) -> torch.Tensor:  # the output and split-K partials
        t = empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", nan_empty)  # NOTE: every element the kernels leave unwritten shows
    w = torch.randn(n, k, device=DEVICE) * 0.05
    wq, ws = quantize_weight_channel(w) if block is None else quantize_weight_block(w, block)
    xq, xs = quant_fp8_groups(torch.randn(m, k, device=DEVICE).to(torch.bfloat16), block)
    bias = torch.randn(n, device=DEVICE).to(torch.bfloat16)
    for b in (None, bias):
        got = fp8_tma_gemm(xq, xs, wq, ws, block, torch.float32, tile, b)
        want = fp8_gemm_ref(xq, xs, wq, ws, block, torch.float32, b)
        assert got.shape == (m, n) and rel_rms(got, want) < GEMM_RMS, rel_rms(got, want)


def test_tma_gemm_refuses_what_tma_cannot_load() -> None:
    wq, ws = quantize_weight_channel(torch.randn(64, 200, device=DEVICE))
    xq, xs = quant_fp8_groups(torch.randn(3, 200, device=DEVICE).to(torch.bfloat16), None)
    with pytest.raises(ValueError, match="multiple of 16"):  # 200-byte rows: not 16-byte aligned
        fp8_tma_gemm(xq, xs, wq, ws, None, torch.float32, TmaTile(16, 64))
    wq, ws = quantize_weight_block(torch.randn(256, 256, device=DEVICE), 128)
    xq, xs = quant_fp8_groups(torch.randn(3, 256, device=DEVICE).to(torch.bfloat16), 128)
    with pytest.raises(ValueError, match="block_n <= 128"):  # a tile wider than a weight block
        fp8_tma_gemm(xq, xs, wq, ws, 128, torch.float32, TmaTile(16, 256))
    with pytest.raises(ValueError, match="powers of two"):
        TmaTile(48, 64)


@pytest.mark.parametrize("block", [None, 128])
def test_small_batches_take_the_tma_gemm_by_default(block: int | None) -> None:
    """Up to TMA_MAX_M tokens the FP8 GEMMs run the TMA GEMM with tma_tile's launch (bit for bit), past it
    the grid GEMM; operands TMA cannot load (K not a multiple of 16) stay on the grid GEMM."""
    torch.manual_seed(3)
    wq, ws = (quantize_weight_channel if block is None else lambda w: quantize_weight_block(w, 128))(
        torch.randn(200, 384, device=DEVICE) * 0.05
    )
    for m, tma in ((1, True), (TMA_MAX_M, True), (TMA_MAX_M + 1, False)):
        xq, xs = quant_fp8_groups(torch.randn(m, 384, device=DEVICE).to(torch.bfloat16), block)
        if block is None:
            got = fp8_rowwise_gemm(xq, xs, wq, ws, torch.float32)
        else:
            got = fp8_block_gemm(xq, xs, wq, ws, 128, torch.float32)
        tile = tma_tile(m, 200, 3, block is not None)
        assert (tile is not None) == tma and tma_loads(xq, wq)
        if tma:
            assert torch.equal(got, fp8_tma_gemm(xq, xs, wq, ws, block, torch.float32, tile))
        assert rel_rms(got, fp8_gemm_ref(xq, xs, wq, ws, block, torch.float32)) < GEMM_RMS
    xq, xs = quant_fp8_groups(torch.randn(2, 200, device=DEVICE).to(torch.bfloat16), None)
    assert not tma_loads(xq, quantize_weight_channel(torch.randn(8, 200, device=DEVICE))[0])
    if block is not None:  # blocks of 64: the TMA GEMM takes 128 only, so the grid GEMM serves even 1 token
        wq, ws = quantize_weight_block(torch.randn(200, 384, device=DEVICE) * 0.05, 64)
        xq, xs = quant_fp8_groups(torch.randn(1, 384, device=DEVICE).to(torch.bfloat16), 64)
        got = fp8_block_gemm(xq, xs, wq, ws, 64, torch.float32)
        assert rel_rms(got, fp8_gemm_ref(xq, xs, wq, ws, 64, torch.float32)) < GEMM_RMS
