"""FP8 linear kernels (activation quantization, block-scaled GEMM, row-wise ``_scaled_mm``) against their
pure-torch twins: the interpreter on CPU (see conftest), the GPU kernels when CUDA is present."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from nibblekv.formats.fp8_weights import (
    dequantize_weight,
    quantize_act_groups,
    quantize_weight_block,
    quantize_weight_channel,
)
from nibblekv.kernels.fp8.gemm import (
    BLOCK_TRITON_MAX_M,
    fp8_block_gemm,
    fp8_linear_block,
    fp8_linear_rowwise,
    fp8_rowwise_gemm,
)
from nibblekv.kernels.fp8.quant import ROW_TILE_MAX, quant_fp8_groups
from nibblekv.kernels.fp8.reference import fp8_gemm_ref, fp8_linear_ref
from nibblekv.kernels.fp8.scaled_mm import (
    block_scaled_mm_available,
    block_scaled_mm_fits,
    block_scaled_mm_unavailable,
    fp8_block_scaled_mm,
)
from nibblekv.kernels.fp8.tiles import GemmTile
from nibblekv.kernels.fused.elementwise import add_rms_norm_fp8, silu_and_mul_fp8
from nibblekv.kernels.pdl import pdl_available, pdl_launch, use_pdl
from nibblekv.kernels.testing import rel_rms

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# FP8 tensor cores (torch._scaled_mm row-wise, Triton fp8 dots): sm_90; older GPUs run the reference only
if DEVICE == "cuda" and torch.cuda.get_device_capability() < (9, 0):
    pytest.skip("FP8 kernels need an sm_90 GPU", allow_module_level=True)
cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
# NOTE: odd shapes: partial row/column tiles, a partial last K block, a partial last weight block
GPU_SHAPES = [(1, 4096, 6144), (37, 1000, 264), (300, 520, 400)]
SHAPES = [(1, 200, 72), (5, 520, 130)] if DEVICE == "cpu" else GPU_SHAPES
# relative RMS bounds against the fp32 twins. GEMM: the same fp8 operands; the interpreter sums in fp32, but
# Hopper's FP8 MMAs accumulate in reduced precision (~1e-3 of the largest outputs, promoted every 128).
# Layer: bf16 output rounding (2**-9) on top.
GEMM_RMS = 2e-3 if DEVICE == "cuda" else 1e-5
LAYER_RMS = 5e-3


# power-of-two groups and per-token scales (K <= ROW_TILE_MAX, the row one group padded to 2^n; longer rows
# up to LONG_ROW_TILE_MAX_M tokens) take the tiled kernel (one program over several groups: a partial last
# group, groups past the row's, two programs a row at K=2,500); other groups and longer rows past that many
# tokens (long_rows=0 here) the one-group-a-program kernel
@pytest.mark.parametrize(("group", "k", "long_rows"), [
    (128, 300, 256), (64, 300, 256), (128, 2500, 256), (100, 300, 256), (None, 300, 256),
    (None, ROW_TILE_MAX + 100, 256), (None, ROW_TILE_MAX + 100, 0)])  # fmt: skip
def test_quant_groups_bit_exact(
    monkeypatch: pytest.MonkeyPatch, group: int | None, k: int, long_rows: int
) -> None:
    import nibblekv.kernels.fp8.quant as quant

    monkeypatch.setattr(quant, "LONG_ROW_TILE_MAX_M", long_rows)
    if group is None:  # the route taken: the other kernel is not there
        other = "_quant_groups_kernel" if k > ROW_TILE_MAX and not long_rows else "_quant_kernel"
        monkeypatch.setattr(quant, other, None)
    x = torch.randn(7, k, device=DEVICE) * torch.logspace(-3, 2, k, device=DEVICE)
    x[3] = 0.0  # an all-zero row: the EPS floor, codes 0
    q, s = quant_fp8_groups(x.to(torch.bfloat16), group)
    qr, sr = quantize_act_groups(x.to(torch.bfloat16), group or k)
    assert q.dtype == torch.float8_e4m3fn and s.shape == sr.shape == (7, -(-k // (group or k)))
    assert torch.equal(q.view(torch.uint8), qr.view(torch.uint8))
    assert torch.equal(s, sr)


# None: gemm_tile's choice; split-K with an uneven last split (K blocks 2 or 5); a prefill-sized tile; the
# decode tile of 33-256 tokens (six stages, no split), its 4-split form for a long K up to 64 tokens and the
# row-wise 32-wide one there; a tile wider than a weight block (block scales loaded in the step), one with its
# scales loaded in the step by choice, and two swapped (weights as the MMA's M side)
TILES = [None, GemmTile(16, 64, 4, 2, split_k=3), GemmTile(64, 128, 4, 3), GemmTile(64, 64, 4, 6),
         GemmTile(64, 64, 4, 4, split_k=4), GemmTile(64, 32, 4, 8), GemmTile(64, 256, 4, 2),
         GemmTile(64, 64, 4, 6, scale_ahead=False), GemmTile(16, 64, 4, 2, 3, swap_ab=True),
         GemmTile(32, 128, 4, 3, swap_ab=True)]  # fmt: skip


def test_gemm_tile_and_route_by_size() -> None:
    """Decode batches up to 32 tokens: swapped small tiles and k-splits; 33-256: 64x64 tiles, 6 stages, no
    split (but at 33-64 tokens over few output tiles); prefill chunks 64x128. The row-wise layer's Triton
    GEMM serves up to 128 tokens at <= 8,192 outputs, up to 64 above (gate_up), cuBLASLt beyond (bench_fp8's
    H100 sweep)."""
    from nibblekv.kernels.fp8.gemm import rowwise_triton_max_m
    from nibblekv.kernels.fp8.tiles import gemm_tile

    assert gemm_tile(1, 4096, 32).split_k > 1 and gemm_tile(1, 4096, 32).block_m == 16
    # up to 32 tokens swapped (weights as the MMA's M side); splits a power of two for ~3 programs an SM up to
    # 16 tokens (132 SMs): gate_up's 448 output tiles in 1, qkv's 96 in 4 (5 rounded down), down's 64 in 4;
    # ~2 up to 32 (qkv 3 -> 2)
    assert all(gemm_tile(m, 6144, 32).swap_ab for m in (1, 16, 32)) and not gemm_tile(33, 6144, 32).swap_ab
    splits = [gemm_tile(m, n, kb).split_k for m, n, kb in ((16, 28672, 32), (1, 6144, 32), (1, 4096, 112),
                                                           (32, 6144, 32), (32, 4096, 112))]  # fmt: skip
    assert splits == [1, 4, 4, 2, 4]
    assert gemm_tile(65, 4096, 32) == gemm_tile(256, 28672, 32) == GemmTile(64, 64, 4, 6)
    assert gemm_tile(64, 28672, 32) == GemmTile(64, 64, 4, 6)  # gate_up's 448 tiles: 6 stages
    # row-wise at 33-64 tokens over fewer 64-wide tiles than SMs: 8 stages; 32-wide where they fill at most
    # half the SMs (o_proj and down_proj's 64, whatever K; qkv's 96 stay 64-wide)
    assert gemm_tile(64, 4096, 32) == gemm_tile(33, 4096, 112) == GemmTile(64, 32, 4, 8)
    assert gemm_tile(64, 6144, 32) == GemmTile(64, 64, 4, 8)
    # the block-scaled down_proj's long K (112 k-blocks) over 64 output tiles: 4 splits up to 64 tokens
    assert gemm_tile(64, 4096, 112, block=True) == GemmTile(64, 64, 4, 4, 4)
    assert gemm_tile(65, 4096, 112, block=True).split_k == 1
    # the block-scaled GEMM at o_proj's 64 output tiles: 2 splits up to 64 tokens (qkv's 96 tiles: none)
    assert gemm_tile(64, 4096, 32, block=True) == GemmTile(64, 64, 4, 4, 2)
    assert gemm_tile(64, 6144, 32, block=True) == GemmTile(64, 64, 4, 6)
    assert gemm_tile(8192, 4096, 32) == GemmTile(64, 128, 4, 3)
    assert [rowwise_triton_max_m(n) for n in (4096, 8192, 28672)] == [128, 128, 64]


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize(("m", "k", "n"), SHAPES)
def test_block_gemm_matches_reference(m: int, k: int, n: int, tile: GemmTile | None) -> None:
    torch.manual_seed(m)
    w = torch.randn(n, k, device=DEVICE) * 0.05
    wq, ws = quantize_weight_block(w, 128)
    x = torch.randn(m, k, device=DEVICE).to(torch.bfloat16)
    xq, xs = quant_fp8_groups(x, 128)
    bias = torch.randn(n, device=DEVICE).to(torch.bfloat16)
    got = fp8_block_gemm(xq, xs, wq, ws, 128, torch.float32, bias, tile=tile)
    want = fp8_gemm_ref(xq, xs, wq, ws, 128, torch.float32, bias)
    assert rel_rms(got, want) < GEMM_RMS, rel_rms(got, want)
    # and the whole layer, bf16 out, against the reference layer
    got_l = fp8_linear_block(x, wq, ws, 128, bias)
    want_l = fp8_linear_ref(x, wq, ws, 128, bias)
    assert rel_rms(got_l, want_l) < LAYER_RMS, rel_rms(got_l, want_l)


@pytest.mark.skipif(DEVICE != "cpu", reason="the interpreter sums in fp32 in the same order; the GPU's MMAs not")
@pytest.mark.parametrize(
    "tile", [GemmTile(16, 64, 4, 2, split_k=3), GemmTile(64, 128, 4, 3), GemmTile(32, 32, 4, 4, 2)]
)
def test_block_gemm_scales_loaded_a_step_ahead_give_the_same_sums(tile: GemmTile) -> None:
    """``scale_ahead`` loads each k-step's scale product the step before (the last step's prefetch reads
    the last k-block's scales, valid memory, and drops them): bit for bit the in-step result, with uneven
    k-splits, a partial last k-block and column tiles inside one weight block (32-wide: four a block)."""
    torch.manual_seed(7)
    wq, ws = quantize_weight_block(torch.randn(200, 650) * 0.05, 128)
    xq, xs = quant_fp8_groups(torch.randn(37, 650).to(torch.bfloat16), 128)
    on = fp8_block_gemm(xq, xs, wq, ws, 128, torch.float32, tile=tile)
    in_step = dataclasses.replace(tile, scale_ahead=False)
    off = fp8_block_gemm(xq, xs, wq, ws, 128, torch.float32, tile=in_step)
    assert torch.equal(on, off)
    assert rel_rms(on, fp8_gemm_ref(xq, xs, wq, ws, 128, torch.float32)) < GEMM_RMS


def test_block_gemm_rejects_bad_scales() -> None:
    xq, xs = quantize_act_groups(torch.randn(3, 200), 128)
    wq, ws = quantize_weight_block(torch.randn(64, 200), 128)
    with pytest.raises(ValueError, match="do not fit"):
        fp8_block_gemm(xq, xs, wq, ws[:, :1], 128, torch.float32)
    with pytest.raises(ValueError, match="same K"):
        fp8_block_gemm(xq[:, :100], xs, wq, ws, 128, torch.float32)


def test_weight_quantization_error_is_small() -> None:
    w = torch.randn(256, 384) * 0.02
    for wq, ws, block in (*quantize_weight_channel(w), None), (*quantize_weight_block(w, 128), 128):
        rel = (dequantize_weight(wq, ws, block) - w).norm() / w.norm()
        assert rel < 0.04, (block, rel)  # e4m3 keeps 3 mantissa bits: ~2-3% RMS error


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize(("m", "k", "n"), SHAPES)
def test_rowwise_gemm_matches_reference(m: int, k: int, n: int, tile: GemmTile | None) -> None:
    torch.manual_seed(m)
    wq, ws = quantize_weight_channel(torch.randn(n, k, device=DEVICE) * 0.05)
    x = torch.randn(m, k, device=DEVICE).to(torch.bfloat16)
    xq, xs = quant_fp8_groups(x, None)
    bias = torch.randn(n, device=DEVICE).to(torch.bfloat16)
    got = fp8_rowwise_gemm(xq, xs, wq, ws, torch.float32, bias, tile=tile)
    want = fp8_gemm_ref(xq, xs, wq, ws, None, torch.float32, bias)
    assert rel_rms(got, want) < GEMM_RMS, rel_rms(got, want)
    with pytest.raises(ValueError, match="do not fit"):
        fp8_rowwise_gemm(xq, xs, wq, ws[:-1], torch.float32)
    with pytest.raises(ValueError, match="powers of two"):
        GemmTile(48, 64, 4, 2)


@pytest.mark.parametrize(
    ("tile", "block"),
    [(GemmTile(16, 64, 4, 2, split_k=3, swap_ab=True), None), (GemmTile(16, 64, 4, 2, 3, swap_ab=True), 128),
     (GemmTile(64, 32, 4, 3), None), (GemmTile(64, 32, 4, 3), 128), (GemmTile(32, 32, 4, 3, 2), 128)],
)  # fmt: skip
def test_gemm_over_whole_k_steps_matches_reference(tile: GemmTile, block: int | None) -> None:
    """K a whole number of k-steps (512): the loads go unmasked (EVEN_K) in both formats, k-splits and
    swapped tiles included."""
    torch.manual_seed(5)
    w = torch.randn(200, 512, device=DEVICE) * 0.05
    wq, ws = quantize_weight_channel(w) if block is None else quantize_weight_block(w, block)
    xq, xs = quant_fp8_groups(torch.randn(37, 512, device=DEVICE).to(torch.bfloat16), block)
    if block is None:
        got = fp8_rowwise_gemm(xq, xs, wq, ws, torch.float32, tile=tile)
    else:
        got = fp8_block_gemm(xq, xs, wq, ws, block, torch.float32, tile=tile)
    assert rel_rms(got, fp8_gemm_ref(xq, xs, wq, ws, block, torch.float32)) < GEMM_RMS


# 300 tokens: past rowwise_triton_max_m, the GPU runs torch._scaled_mm; 37 and 1 the Triton GEMM
@pytest.mark.parametrize(("m", "k", "n"), [(1, 4096, 6144), (37, 1008, 272), (300, 512, 400)] if DEVICE == "cuda"
                         else [(3, 200, 72), (300, 48, 40)])  # fmt: skip
def test_rowwise_linear_matches_reference(m: int, k: int, n: int) -> None:
    torch.manual_seed(m)
    w = torch.randn(n, k, device=DEVICE) * 0.05
    wq, ws = quantize_weight_channel(w)
    x = torch.randn(m, k, device=DEVICE).to(torch.bfloat16)
    bias = torch.randn(n, device=DEVICE).to(torch.bfloat16)
    got = fp8_linear_rowwise(x, wq, ws[None, :], bias)
    want = fp8_linear_ref(x, wq, ws, None, bias)
    assert rel_rms(got, want) < LAYER_RMS, rel_rms(got, want)


# prefill chunks (past BLOCK_TRITON_MAX_M): cuBLASLt's block-scaled kernel where torch has it (sm_90), M not a
# multiple of 4 (its padding), else the Triton block GEMM (the CPU, the interpreter, 5 k-blocks)
@pytest.mark.parametrize(("m", "k", "n"), [(301, 512, 384), (1030, 1024, 640), (301, 640, 384)]
                         if DEVICE == "cuda"
                         else [(BLOCK_TRITON_MAX_M + 5, 128, 128)])  # fmt: skip
def test_block_linear_prefill_matches_reference(m: int, k: int, n: int) -> None:
    torch.manual_seed(m)
    wq, ws = quantize_weight_block(torch.randn(n, k, device=DEVICE) * 0.05, 128)
    x = torch.randn(m, k, device=DEVICE).to(torch.bfloat16)
    bias = torch.randn(n, device=DEVICE).to(torch.bfloat16)
    got = fp8_linear_block(x, wq, ws, 128, bias)
    want = fp8_linear_ref(x, wq, ws, 128, bias)
    assert got.shape == (m, n) and rel_rms(got, want) < LAYER_RMS, rel_rms(got, want)
    if DEVICE == "cpu":
        assert block_scaled_mm_unavailable(x.device) == "needs CUDA sm_90"
    elif block_scaled_mm_available(x.device) and block_scaled_mm_fits(n, k):  # the layer took cuBLASLt's
        xq, xs = quant_fp8_groups(x, 128)
        assert torch.equal(got, fp8_block_scaled_mm(xq, xs, wq, ws, torch.bfloat16) + bias)


def test_block_scaled_mm_refuses_unaligned_k() -> None:
    """cuBLASLt's block-scaled kernel takes K in whole fours of 128-blocks only (its weight-scale rows 16-byte
    aligned: with 3 or 5 k-blocks it was wrong on the H100 / H200) and N in whole blocks."""
    wq, ws = quantize_weight_block(torch.randn(256, 384, device=DEVICE) * 0.05, 128)
    xq, xs = quant_fp8_groups(torch.randn(300, 384, device=DEVICE).to(torch.bfloat16), 128)
    with pytest.raises(ValueError, match="whole 4s of 128-blocks, got K=384"):
        fp8_block_scaled_mm(xq, xs, wq, ws, torch.bfloat16)
    assert block_scaled_mm_fits(256, 512) and not block_scaled_mm_fits(200, 512)


@cuda_only
def test_block_scaled_mm_matches_reference() -> None:
    why = block_scaled_mm_unavailable(torch.device("cuda", torch.cuda.current_device()))
    if why:
        pytest.skip(f"no block-scaled _scaled_mm on this GPU / torch: {why}")
    for m in (6, 128, 257, 301, 1030):  # decode rows (zero-padded to MIN_ROWS inside) and prefill chunks
        torch.manual_seed(m)
        wq, ws = quantize_weight_block(torch.randn(384, 1024, device="cuda") * 0.05, 128)
        xq, xs = quant_fp8_groups(torch.randn(m, 1024, device="cuda").to(torch.bfloat16), 128)
        got = fp8_block_scaled_mm(xq, xs, wq, ws, torch.bfloat16)
        want = fp8_gemm_ref(xq, xs, wq, ws, 128, torch.float32)
        assert got.shape == (m, 384) and rel_rms(got, want) < LAYER_RMS, (m, rel_rms(got, want))


@cuda_only
def test_block_linear_captures_in_cuda_graph() -> None:
    wq, ws = quantize_weight_block(torch.randn(256, 384, device="cuda") * 0.05, 128)
    x = torch.randn(16, 384, device="cuda").to(torch.bfloat16)
    fp8_linear_block(x, wq, ws, 128, None)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fp8_linear_block(x, wq, ws, 128, None)
    x.copy_(torch.randn_like(x))
    graph.replay()
    want = fp8_linear_ref(x, wq, ws, 128, None).float()
    assert rel_rms(out, want) < LAYER_RMS


def test_pdl_off_on_cpu_and_inside_use_pdl_false() -> None:
    dev = torch.device(DEVICE)
    with use_pdl(False):
        assert not pdl_available(dev) and pdl_launch(dev) == {"PDL": False}
    if DEVICE == "cpu":
        assert not pdl_available(dev) and pdl_launch(dev) == {"PDL": False}
        with pytest.raises(ValueError, match="sm_90"):
            pdl_launch(dev, True)


@cuda_only
def test_decode_mlp_chain_with_pdl_in_a_cuda_graph_is_bit_exact() -> None:
    """norm -> gate_up -> SiLU * mul -> down (split-K) -> norm at 1 and 16 tokens, the FP8 kernels launched
    with programmatic dependent launch inside a CUDA graph: the same bits as plain launches."""
    assert pdl_available(torch.device("cuda"))
    torch.manual_seed(0)
    h, inter = 1024, 3584
    wgu, sgu = quantize_weight_channel(torch.randn(2 * inter, h, device="cuda") * 0.05)
    wd, sd = quantize_weight_channel(torch.randn(h, inter, device="cuda") * 0.05)
    norm_w = torch.rand(h, device="cuda").to(torch.bfloat16) + 0.5

    def chain(x: torch.Tensor, res: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xq, res = add_rms_norm_fp8(x, res, norm_w, 1e-6, None)
        act = silu_and_mul_fp8(fp8_linear_rowwise(xq, wgu, sgu[None, :], None), None)
        y = fp8_linear_rowwise(act, wd, sd[None, :], None)
        out, res = add_rms_norm_fp8(y, res, norm_w, 1e-6, None)
        return torch.cat([out.q.view(torch.uint8).float(), out.scale], 1), res

    for t in (1, 16):
        x = torch.randn(t, h, device="cuda").to(torch.bfloat16)
        res = torch.randn(t, h, device="cuda").to(torch.bfloat16)
        with use_pdl(False):
            want = chain(x, res)
        chain(x, res)  # compile the PDL builds outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = chain(x, res)
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), t
