"""A split-K FP8 GEMM's partials handed unsummed (``defer_sum``) to the fused kernel after it -- add + RMSNorm
and SiLU * mul add them as they load: bit for bit the sum kernel's output fed to the same kernel (the
interpreter on CPU, see conftest; the GPU where there is one)."""

from __future__ import annotations

import pytest
import torch

from nibblekv.formats.fp8_weights import (
    PartialSums,
    QuantizedRows,
    quantize_weight_block,
    quantize_weight_channel,
)
from nibblekv.kernels.fp8.gemm import GemmTile, fp8_block_gemm, fp8_rowwise_gemm
from nibblekv.kernels.fp8.quant import quant_fp8_groups
from nibblekv.kernels.fused.elementwise import add_rms_norm, add_rms_norm_fp8, silu_and_mul, silu_and_mul_fp8

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SPLIT3 = GemmTile(16, 64, 4, 2, split_k=3)  # 5 k-blocks of 128 -> splits of 2, 2, 1


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view({1: torch.int8, 2: torch.int16, 4: torch.int32}[x.element_size()])


def _same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype
    assert torch.equal(_bits(a), _bits(b))


def _gemm(m: int, n: int, dtype: torch.dtype, bias: bool, block: bool, seed: int = 0
          ) -> tuple[torch.Tensor, PartialSums]:  # fmt: skip
    """An FP8 GEMM ``[m, 640] x [n, 640]^T`` in 3 k-splits: (summed by the sum kernel, unsummed partials)."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, 640, generator=g) * 2).to(DEVICE, dtype)
    w = (torch.randn(n, 640, generator=g) * 0.05).to(DEVICE, dtype)
    b = (torch.randn(n, generator=g) * 0.5).to(DEVICE, dtype) if bias else None
    wq, ws = quantize_weight_block(w, 128) if block else quantize_weight_channel(w)
    xq, xs = quant_fp8_groups(x, 128 if block else None)

    def run(defer: bool) -> torch.Tensor | PartialSums:
        if block:
            return fp8_block_gemm(xq, xs, wq, ws, 128, dtype, b, SPLIT3, defer)
        return fp8_rowwise_gemm(xq, xs, wq, ws.reshape(-1), dtype, b, SPLIT3, defer)

    summed, parts = run(False), run(True)
    assert isinstance(summed, torch.Tensor) and isinstance(parts, PartialSums)
    assert parts.parts.shape == (3, m, n) and parts.shape == (m, n) and parts.dtype == dtype
    return summed, parts


@pytest.mark.parametrize("block", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_deferred_partials_are_what_the_sum_kernel_adds(block: bool, bias: bool) -> None:
    summed, parts = _gemm(3, 200, torch.float32, bias, block)
    _same(parts.summed(), summed)
    one = fp8_rowwise_gemm(*quant_fp8_groups(torch.ones(2, 640, device=DEVICE), None),
                           *quantize_weight_channel(torch.ones(8, 640, device=DEVICE)), torch.float32,
                           tile=GemmTile(16, 64, 4, 2), defer_sum=True)  # fmt: skip
    assert isinstance(one, torch.Tensor)  # no k-split: nothing to defer


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("residual", [True, False])
@pytest.mark.parametrize(("bias", "block"), [(False, False), (True, True)])
@pytest.mark.parametrize("group", [0, None, 128])
def test_add_rms_norm_adds_partials_as_it_loads(
    dtype: torch.dtype, residual: bool, bias: bool, block: bool, group: int | None
) -> None:
    """``group`` 0: the bf16 / fp32 output; else quantized for an FP8 layer per ``group`` (None: per row)."""
    summed, parts = _gemm(5, 264, dtype, bias, block, seed=1)
    r = (torch.randn(5, 264) * 3).to(DEVICE, dtype) if residual else None
    w = (torch.rand(264) + 0.5).to(DEVICE, dtype)
    if group == 0:
        outs = [add_rms_norm(x, r, w, 1e-6) for x in (summed, parts)]
        _same(outs[1][0], outs[0][0])
    else:
        q = [add_rms_norm_fp8(x, r, w, 1e-6, group) for x in (summed, parts)]
        assert isinstance(q[1][0], QuantizedRows) and q[1][0].dtype == dtype
        _same(q[1][0].q, q[0][0].q)
        _same(q[1][0].scale, q[0][0].scale)
        outs = q  # type: ignore[assignment]
    _same(outs[1][1], outs[0][1])  # the new residual stream: x + r (x itself without r)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("t", "inter"), [(3, 40), (2, 1536)])
@pytest.mark.parametrize("group", [0, None, 128])
@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
def test_silu_and_mul_adds_partials_as_it_loads(
    dtype: torch.dtype, t: int, inter: int, group: int | None
) -> None:
    """1,536 columns quantized per row at 2 rows: the two-kernel row split (``_silu_and_mul_rows_split``)."""
    summed, parts = _gemm(t, 2 * inter, dtype, True, False, seed=2)
    if group == 0:
        _same(silu_and_mul(parts), silu_and_mul(summed))
    else:
        a, b = silu_and_mul_fp8(parts, group), silu_and_mul_fp8(summed, group)
        _same(a.q, b.q)
        _same(a.scale, b.scale)


def test_partials_are_checked() -> None:
    p = torch.zeros(2, 3, 8, device=DEVICE)
    with pytest.raises(ValueError, match="partial sums must be contiguous float32"):
        add_rms_norm(PartialSums(p.half(), None, torch.bfloat16), None, torch.ones(8, device=DEVICE), 1e-6)
    with pytest.raises(ValueError, match="bias must be contiguous"):
        silu_and_mul(PartialSums(p, torch.zeros(4, device=DEVICE), torch.float32))
    with pytest.raises(ValueError, match="residual must match x"):
        r = torch.zeros(3, 8, device=DEVICE, dtype=torch.bfloat16)
        add_rms_norm(PartialSums(p, None, torch.float32), r, torch.ones(8, device=DEVICE), 1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rotate", [False, True])
def test_rope_qk_adds_partials_as_it_loads(dtype: torch.dtype, rotate: bool) -> None:
    """qkv with a bias (Qwen2's): 4 q heads, 2 k, 2 v of 32 dims; the rotated kernel splits output columns."""
    from nibblekv.attention.paged import hadamard_matrix
    from nibblekv.kernels.fused.rope import rope_qk

    t, d = 3, 32
    summed, parts = _gemm(t, 8 * d, dtype, True, False, seed=3)
    pos = torch.arange(t).float()[:, None] * (1.0 / 10000 ** (torch.arange(0, d, 2).float() / d))
    emb = torch.cat((pos, pos), dim=-1)[:, None, :]
    cos, sin = emb.cos().to(DEVICE, dtype), emb.sin().to(DEVICE, dtype)
    rot = hadamard_matrix(d, DEVICE, dtype) if rotate else None
    for a, b in zip(rope_qk(parts, cos, sin, 4, 2, d, rot), rope_qk(summed, cos, sin, 4, 2, d, rot)):
        _same(a, b)
