"""Eval building blocks without the model: configs, 4over6, Hadamard, fake-quant attention, metrics."""

from __future__ import annotations

import pytest
import torch

from nibblekv.eval.configs import DEFAULT_NVFP4, FULL_RUN, KVConfig, parse_config
from nibblekv.eval.fakequant import FakeQuantAttention
from nibblekv.eval.metrics import WindowAccumulator, compare, summarize
from nibblekv.eval.quant import fake_quantize, hadamard
from nibblekv.formats import nvfp4
from nibblekv.model import DenseAttention


def test_parse_config_names() -> None:
    c = parse_config("nvfp4_w32_s4_cal_4o6_had")
    assert (c.window, c.sinks, c.calibrated, c.four_over_six, c.hadamard) == (32, 4, True, True, True)
    assert parse_config("nvfp4") == DEFAULT_NVFP4
    assert parse_config("nvfp4_plain") == KVConfig("nvfp4_plain")
    assert parse_config("fp8_e4m3").kv_dtype == "fp8_e4m3" and not parse_config("bf16").quantized
    for bad in ("nvfp4_x", "fp4", "nvfp4_w"):
        with pytest.raises(ValueError):
            parse_config(bad)
    with pytest.raises(ValueError):
        KVConfig("x", kv_dtype="fp8_e4m3", window=64)
    assert all(parse_config(n).name == n for n in FULL_RUN)


def test_hadamard_is_orthogonal_and_symmetric() -> None:
    h = hadamard(64)
    assert torch.allclose(h @ h, torch.eye(64), atol=1e-6)
    assert torch.equal(h, h.T)
    with pytest.raises(ValueError):
        hadamard(48)


def _block_err(x: torch.Tensor, xq: torch.Tensor) -> torch.Tensor:
    return ((x - xq) ** 2).reshape(*x.shape[:-1], -1, nvfp4.BLOCK).sum(-1)


def test_4over6_never_worse_per_block_and_sometimes_better() -> None:
    torch.manual_seed(0)
    x = torch.randn(256, 64) * torch.rand(256, 1) * 5
    x[:8, :16] *= 40  # a few outlier blocks
    plain = nvfp4.fake_quantize(x)
    fos = nvfp4.dequantize(*nvfp4.quantize(x, four_over_six=True))
    e_plain, e_fos = _block_err(x, plain), _block_err(x, fos)
    assert bool((e_fos <= e_plain + 1e-9).all())
    assert float(e_fos.sum()) < 0.95 * float(e_plain.sum())
    # a block whose values sit on the standard grid is kept exactly with the standard scale
    on_grid = torch.tensor([[6.0, 4.0, 3.0, 2.0, 1.5, 1.0, 0.5, 0.0] * 2])
    packed, scales = nvfp4.quantize(on_grid, four_over_six=True)
    assert torch.equal(nvfp4.dequantize(packed, scales), on_grid)
    assert torch.equal(fake_quantize(on_grid, "nvfp4", four_over_six=True), on_grid)


def test_fakequant_attention_limits() -> None:
    torch.manual_seed(1)
    t, hq, hkv, d = 24, 4, 2, 64
    q, k, v = torch.randn(t, hq, d), torch.randn(t, hkv, d), torch.randn(t, hkv, d)
    cu = [0, 10, 24]
    dense = DenseAttention(cu).forward(0, q, k, v)
    # a tail as long as the sequence keeps everything exact; so does an unquantized dtype
    assert torch.allclose(
        FakeQuantAttention(cu, KVConfig("w", window=32)).forward(0, q, k, v), dense, atol=1e-5
    )
    assert torch.allclose(
        FakeQuantAttention(cu, KVConfig("r", hadamard=True, window=32)).forward(0, q, k, v), dense, atol=1e-5
    )
    plain = FakeQuantAttention(cu, KVConfig("p")).forward(0, q, k, v)
    assert float((plain - dense).abs().max()) > 1e-2
    # a tail of w tokens: query i sees exact keys j > i - w only, so the first w rows are exact
    tail = FakeQuantAttention(cu, KVConfig("t", window=4)).forward(0, q, k, v)
    assert torch.allclose(tail[:4], dense[:4], atol=1e-5) and torch.allclose(
        tail[10:14], dense[10:14], atol=1e-5
    )
    assert float((tail[20:] - dense[20:]).abs().max()) > 1e-3
    # manual check of one query: exact sinks and tail, quantized middle
    cfg = KVConfig("s", window=2, sinks=1)
    out = FakeQuantAttention([0, 8], cfg).forward(0, q[:8], k[:8], v[:8])
    kk, vv = k[:8, 0].clone(), v[:8, 0].clone()
    kk[1:6], vv[1:6] = nvfp4.fake_quantize(kk[1:6]), nvfp4.fake_quantize(vv[1:6])
    p = torch.softmax(kk @ q[7, 0] / d**0.5, 0)
    assert torch.allclose(out[7, 0], p @ vv, atol=1e-5)
    # chunked prefill (chunk 4, tail 2): query 7 (chunk [4, 8)) reads keys >= 2 exact, 0..1 quantized;
    # the first chunk reads only itself, exact
    ch = FakeQuantAttention([0, 8], KVConfig("c", window=2), chunk=4).forward(0, q[:8], k[:8], v[:8])
    kk, vv = k[:8, 0].clone(), v[:8, 0].clone()
    kk[:2], vv[:2] = nvfp4.fake_quantize(kk[:2]), nvfp4.fake_quantize(vv[:2])
    p = torch.softmax(kk @ q[7, 0] / d**0.5, 0)
    assert torch.allclose(ch[7, 0], p @ vv, atol=1e-5)
    assert torch.allclose(ch[:4], DenseAttention([0, 8]).forward(0, q[:8], k[:8], v[:8])[:4], atol=1e-5)


def test_metrics_kl_top1_ppl_and_intervals() -> None:
    torch.manual_seed(2)
    logits = torch.randn(50, 11)
    targets = torch.randint(0, 11, (50,))
    ref_lp = torch.log_softmax(logits, -1)
    same = compare(ref_lp, logits, targets)
    assert float(same.kl.abs().max()) < 1e-6 and float(same.agree.mean()) == 1.0
    noisy = logits + torch.randn(50, 11)
    other = compare(ref_lp, noisy, targets)
    assert float(other.kl.min()) > 0 and float(other.agree.mean()) < 1.0
    p, lq = ref_lp[3].exp(), torch.log_softmax(noisy[3], -1)
    assert torch.isclose((p * (ref_lp[3] - lq)).sum(), other.kl[3], atol=1e-6)
    assert torch.isclose(other.nll[3], -lq[targets[3]])
    assert bool(other.agree[3]) == bool(noisy[3].argmax() == logits[3].argmax())
    ref, acc = WindowAccumulator(5), WindowAccumulator(5)
    for w in range(5):
        ref.add(
            w,
            compare(
                ref_lp[w * 10 : w * 10 + 10], logits[w * 10 : w * 10 + 10], targets[w * 10 : w * 10 + 10]
            ),
        )
        acc.add(
            w,
            type(other)(
                other.kl[w * 10 : w * 10 + 10],
                other.agree[w * 10 : w * 10 + 10],
                other.nll[w * 10 : w * 10 + 10],
            ),
        )
    s, s0 = summarize(acc, ref), summarize(ref, ref)
    assert s["kl_ci"][0] <= s["kl"] <= s["kl_ci"][1] and s["tokens"] == 50 and s["windows"] == 5
    assert s0["ppl_delta"] == 0.0 and s0["ppl_delta_ci"] == [0.0, 0.0] and s0["top1"] == 1.0
    assert s["ppl"] == pytest.approx(float(other.nll.double().mean().exp()))
