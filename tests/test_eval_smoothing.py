"""Fake-quant study: K/V mean smoothing (``_smk`` / ``_smv``), the prefill window (``_pw``) and the
blockwise :class:`FakeQuantAttention`, checked against hand-written float64 references (no model
load; the calibration test builds a seeded 2-layer model of a few thousand parameters)."""

from __future__ import annotations

from itertools import pairwise

import pytest
import torch
from model_helpers import random_causal_lm

from nibblekv.eval import fakequant
from nibblekv.eval.calibrate import MeanRecorder, calibrate_means
from nibblekv.eval.cli import SmoothingSource
from nibblekv.eval.configs import KVConfig, parse_config
from nibblekv.eval.fakequant import FakeQuantAttention
from nibblekv.eval.metrics import summarize
from nibblekv.eval.quant import fake_quantize, hadamard
from nibblekv.eval.study import run_study
from nibblekv.model import CausalLM, DenseAttention
from nibblekv.model.config import ModelConfig

HQ, HKV, D = 6, 2, 32  # GQA: 3 query heads per KV head
CU = [0, 21, 54]  # two sequences of different lengths


def _qkv(seed: int, t: int = CU[-1], d: int = D) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(t, HQ, d, generator=g),
        torch.randn(t, HKV, d, generator=g),
        torch.randn(t, HKV, d, generator=g),
    )


def _means(seed: int, layers: int = 1, scale: float = 3.0, d: int = D) -> torch.Tensor:
    """Arbitrary (not the data's) means ``[layers, 2, HKV, D]``."""
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(layers, 2, HKV, d, generator=g)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _causal_ref(cu: list[int], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Plain causal attention per sequence, by hand in float64."""
    group = q.shape[1] // k.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64)
    for s0, s1 in pairwise(cu):
        n = s1 - s0
        qs = q[s0:s1].double().transpose(0, 1)  # [Hq, n, D]
        ks = k[s0:s1].double().repeat_interleave(group, 1).transpose(0, 1)
        vs = v[s0:s1].double().repeat_interleave(group, 1).transpose(0, 1)
        scores = qs @ ks.transpose(1, 2) / q.shape[-1] ** 0.5
        scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
        out[s0:s1] = (torch.softmax(scores, -1) @ vs).transpose(0, 1)
    return out


def _fakequant_ref(
    cu: list[int],
    cfg: KVConfig,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    chunk: int = 0,
    means: torch.Tensor | None = None,
) -> torch.Tensor:
    """What :class:`FakeQuantAttention` should compute (layer 0), one query at a time in float64.

    Query ``i`` reads key ``j <= i`` exact if ``j`` is a sink, or (decode) ``i - j < window``, or
    (chunked prefill) ``j >= c0 - window`` (``- chunk`` with the prefill window) for ``i``'s chunk
    ``[c0, c0 + chunk)``; otherwise the fake-quantized copy. Smoothing subtracts the means first and
    adds the V mean back; the rotation (if any) is applied to q/k/v and undone on the output.
    """
    kf, vf, qf = k.float(), v.float(), q.float()
    mu_v = torch.zeros(HKV, k.shape[-1])
    if cfg.smooth_k:
        kf = kf - means[0, 0]
    if cfg.smooth_v:
        vf, mu_v = vf - means[0, 1], means[0, 1]
    rot = hadamard(k.shape[-1]) if cfg.hadamard else torch.eye(k.shape[-1])
    qf, kf, vf = qf @ rot, kf @ rot, vf @ rot
    kq = fake_quantize(kf, cfg.kv_dtype, 1.0, cfg.four_over_six)
    vq = fake_quantize(vf, cfg.kv_dtype, 1.0, cfg.four_over_six)
    group = q.shape[1] // k.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64)
    for s0, s1 in pairwise(cu):
        for i in range(s1 - s0):
            j = torch.arange(i + 1)
            if chunk:
                c0 = i - i % chunk
                exact = j >= c0 - cfg.window - (chunk if cfg.prefill_window else 0)
            else:
                exact = i - j < cfg.window
            exact = (exact | (j < cfg.sink_tokens))[:, None, None]
            keys = torch.where(exact, kf[s0 : s0 + i + 1], kq[s0 : s0 + i + 1]).double()
            vals = torch.where(exact, vf[s0 : s0 + i + 1], vq[s0 : s0 + i + 1]).double()
            keys, vals = keys.repeat_interleave(group, 1), vals.repeat_interleave(group, 1)  # [i+1, Hq, D]
            p = torch.softmax(torch.einsum("hd,jhd->hj", qf[s0 + i].double(), keys) / q.shape[-1] ** 0.5, -1)
            out[s0 + i] = torch.einsum("hj,jhd->hd", p, vals)
    out = out @ rot.double()
    return out + mu_v.double().repeat_interleave(group, 0)


# --- 1. smoothing is exact when nothing is quantized ------------------------------------------------


@pytest.mark.parametrize("chunk", [0, 16])
@pytest.mark.parametrize("name", ["nvfp4_w64_smk_smv", "nvfp4_w64_4o6_had_sink_smk_smv", "nvfp4_w64_s4_smk"])
def test_smoothing_exact_when_every_key_is_exact(name: str, chunk: int) -> None:
    q, k, v = _qkv(0)
    cfg = parse_config(name)
    assert cfg.window > max(b - a for a, b in pairwise(CU))  # every key in the bf16 tail
    plain_cfg = KVConfig("unsmoothed", window=cfg.window, sinks=cfg.sinks, four_over_six=cfg.four_over_six,
                         hadamard=cfg.hadamard, sink_pages=cfg.sink_pages)  # fmt: skip
    mu = _means(1)
    smoothed = FakeQuantAttention(CU, cfg, chunk=chunk, means=mu).forward(0, q, k, v)
    unsmoothed = FakeQuantAttention(CU, plain_cfg, chunk=chunk).forward(0, q, k, v)
    ref = _causal_ref(CU, q, k, v)
    assert smoothed.shape == q.shape and smoothed.dtype == q.dtype
    assert _rel(smoothed, unsmoothed) < 1e-5
    assert _rel(smoothed, ref) < 1e-5
    assert _rel(unsmoothed, ref) < 1e-5
    # the means are large enough to matter: a missing V mean add-back would show
    assert _rel(DenseAttention(CU).forward(0, q, k, v - mu[0, 1]), ref) > 0.1


def test_smoothing_is_subtract_quantize_add_back() -> None:
    """In the quantized regime, smoothing is quantizing ``k - mu_k`` / ``v - mu_v`` (and adding mu_v
    back): the same outputs as the unsmoothed config on shifted inputs. Zero means change nothing."""
    q, k, v = _qkv(2)
    mu = _means(3)
    for extra in ("", "_had", "_4o6_had"):
        smk, smv, both = (parse_config(f"nvfp4{extra}{s}") for s in ("_smk", "_smv", "_smk_smv"))
        base = KVConfig("base", hadamard=smk.hadamard, four_over_six=smk.four_over_six)
        fq_base = FakeQuantAttention(CU, base)
        out_k = FakeQuantAttention(CU, smk, means=mu).forward(0, q, k, v)
        assert _rel(out_k, fq_base.forward(0, q, k - mu[0, 0], v)) < 1e-5
        out_v = FakeQuantAttention(CU, smv, means=mu).forward(0, q, k, v)
        shifted = fq_base.forward(0, q, k, v - mu[0, 1]) + mu[0, 1].repeat_interleave(HQ // HKV, 0)
        assert _rel(out_v, shifted) < 1e-5
        zero = FakeQuantAttention(CU, both, means=torch.zeros(1, 2, HKV, D)).forward(0, q, k, v)
        assert torch.equal(zero, fq_base.forward(0, q, k, v))
        # the quantized regime does differ from exact attention (the test is not vacuous)
        assert _rel(out_k, _causal_ref(CU, q, k, v)) > 1e-3


def test_means_are_per_layer() -> None:
    """``means[layer_id]`` is used: a layer's smoothing with another layer's means differs."""
    q, k, v = _qkv(4)
    mu = _means(5, layers=3)
    cfg = parse_config("nvfp4_smk_smv")
    fq = FakeQuantAttention(CU, cfg, means=mu)
    for layer in range(3):
        one = FakeQuantAttention(CU, cfg, means=mu[layer : layer + 1]).forward(0, q, k, v)
        assert torch.equal(fq.forward(layer, q, k, v), one)
    assert not torch.allclose(fq.forward(0, q, k, v), fq.forward(1, q, k, v))


# --- 2. smoothing helps when K (or V) has a DC offset -----------------------------------------------


@pytest.mark.parametrize(("base", "smoothed"), [("nvfp4_plain", "nvfp4_smk"), ("nvfp4_had", "nvfp4_had_smk"),
                                                 ("nvfp4_4o6", "nvfp4_4o6_smk")])  # fmt: skip
def test_smoothing_k_helps_with_a_dc_offset(base: str, smoothed: str) -> None:
    g = torch.Generator().manual_seed(6)
    t, d = 192, 64
    cu = [0, 80, t]
    q = 2.0 * torch.randn(t, HQ, d, generator=g)
    offset = 4.0 * torch.randn(HKV, d, generator=g)  # a large constant vector per KV head
    k = torch.randn(t, HKV, d, generator=g) + offset
    v = torch.randn(t, HKV, d, generator=g)
    exact = _causal_ref(cu, q, k, v)
    mu = torch.stack((k.mean(0), torch.zeros(HKV, d)))[None]  # the true K means; V not smoothed
    plain = FakeQuantAttention(cu, parse_config(base)).forward(0, q, k, v)
    smk = FakeQuantAttention(cu, parse_config(smoothed), means=mu).forward(0, q, k, v)
    e_plain, e_smk = _rel(plain, exact), _rel(smk, exact)
    assert e_smk < 0.7 * e_plain, (e_smk, e_plain)
    # the offset is what costs: the same keys without it quantize about as well as smoothed ones
    k0 = k - offset
    plain0 = FakeQuantAttention(cu, parse_config(base)).forward(0, q, k0, v)
    assert _rel(plain0, _causal_ref(cu, q, k0, v)) < 0.7 * e_plain


def test_smoothing_v_helps_with_a_dc_offset() -> None:
    g = torch.Generator().manual_seed(7)
    t, d = 160, 64
    cu = [0, 64, t]
    q = torch.randn(t, HQ, d, generator=g)
    k = torch.randn(t, HKV, d, generator=g)
    v = torch.randn(t, HKV, d, generator=g) + 4.0 * torch.randn(HKV, d, generator=g)
    exact = _causal_ref(cu, q, k, v)
    mu = torch.stack((torch.zeros(HKV, d), v.mean(0)))[None]
    plain = FakeQuantAttention(cu, parse_config("nvfp4_plain")).forward(0, q, k, v)
    smv = FakeQuantAttention(cu, parse_config("nvfp4_smv"), means=mu).forward(0, q, k, v)
    e_plain, e_smv = float((plain.double() - exact).norm()), float((smv.double() - exact).norm())
    assert e_smv < 0.7 * e_plain, (e_smv, e_plain)


# --- 3. the means: MeanRecorder and calibrate_means -------------------------------------------------


class _Echo(DenseAttention):
    """Dense attention that remembers every (layer, k, v) it was handed."""

    def __init__(self, cu: list[int]) -> None:
        super().__init__(cu)
        self.seen: list[tuple[int, torch.Tensor, torch.Tensor]] = []

    def forward(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.seen.append((layer_id, k.clone(), v.clone()))
        return super().forward(layer_id, q, k, v)


def test_mean_recorder_per_layer_per_head_means() -> None:
    g = torch.Generator().manual_seed(8)
    calls = []  # two passes over 2 layers, different token counts, per-head offsets
    for t in (13, 29):
        for layer in range(2):
            off = torch.arange(HKV * D, dtype=torch.float32).reshape(HKV, D) * (layer + 1) / 10
            k = torch.randn(t, HKV, D, generator=g) + off
            v = torch.randn(t, HKV, D, generator=g) * 2 - off
            calls.append((layer, torch.randn(t, HQ, D, generator=g), k, v))
    rec = MeanRecorder(DenseAttention([0, 13]), num_layers=2)
    for layer, q, k, v in calls[:2]:
        out = rec.forward(layer, q, k, v)
        assert torch.equal(out, DenseAttention([0, 13]).forward(layer, q, k, v))  # a pass-through
    rec.inner = DenseAttention([0, 29])
    for layer, q, k, v in calls[2:]:
        rec.forward(layer, q, k, v)
    m = rec.result()
    assert m.num_tokens == 42
    for layer in range(2):
        ks = torch.cat([k for lid, _, k, _ in calls if lid == layer]).double()
        vs = torch.cat([v for lid, _, _, v in calls if lid == layer]).double()
        torch.testing.assert_close(m.k[layer].double(), ks.mean(0), atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(m.v[layer].double(), vs.mean(0), atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(m.k_sq[layer].double(), ks.square().mean(0), atol=1e-5, rtol=1e-6)
        torch.testing.assert_close(m.v_sq[layer].double(), vs.square().mean(0), atol=1e-5, rtol=1e-6)
    assert m.k.shape == (2, HKV, D) and m.k.dtype == torch.float32
    # the layout FakeQuantAttention takes: [layers, 2 (K, V), kv_heads, D]
    mt = m.tensor()
    assert mt.shape == (2, 2, HKV, D) and torch.equal(mt[:, 0], m.k) and torch.equal(mt[:, 1], m.v)
    # dc_ratio: ||mean|| / rms over head_dim, per layer and KV head, [layers, kv_heads, 2 (K, V)]
    r = m.dc_ratio()
    assert r.shape == (2, HKV, 2)
    want = m.k[1, 0].norm() / m.k_sq[1, 0].sum().sqrt()
    assert float(r[1, 0, 0]) == pytest.approx(float(want), rel=1e-6)
    assert bool((r > 0).all()) and bool((r <= 1 + 1e-6).all())  # Cauchy-Schwarz: mean^2 <= mean sq
    # a layer that saw no tokens is an error
    half = MeanRecorder(DenseAttention([0, 13]), num_layers=2)
    half.forward(*calls[0])
    with pytest.raises(ValueError):
        half.result()


def _tiny_model() -> CausalLM:
    """A seeded random 2-layer Llama-shaped model (hidden 64, heads 6/2, head_dim 16)."""
    config = ModelConfig(
        architecture="llama", num_layers=2, hidden_size=64, intermediate_size=96, num_heads=6,
        num_kv_heads=2, head_dim=16, vocab_size=100, max_position_embeddings=128, rms_norm_eps=1e-6,
        rope_theta=10000.0,
    )  # fmt: skip
    return random_causal_lm(config, 0.3)


def test_calibrate_means_of_post_rope_k_and_v(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NIBBLEKV_KERNELS", "reference")
    model = _tiny_model()
    windows = torch.randint(0, 100, (3, 24), generator=torch.Generator().manual_seed(9))
    m = calibrate_means(model, windows)
    # what the attention backend is handed (K after RoPE) for the same windows, one forward each
    seen: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {0: [], 1: []}
    with torch.inference_mode():
        for row in windows:
            echo = _Echo([0, 24])
            model.forward(row, torch.arange(24), echo)
            for layer, k, v in echo.seen:
                seen[layer].append((k, v))
    assert m.num_tokens == 72 and m.k.shape == (2, 2, 16)
    for layer in range(2):
        ks = torch.cat([k for k, _ in seen[layer]]).double()
        vs = torch.cat([v for _, v in seen[layer]]).double()
        torch.testing.assert_close(m.k[layer].double(), ks.mean(0), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(m.v[layer].double(), vs.mean(0), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(m.k_sq[layer].double(), ks.square().mean(0), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(m.k[0], m.k[1])
    with pytest.raises(ValueError):
        calibrate_means(model, torch.zeros(0, 24, dtype=torch.int64))


class _NoScales:
    """The parts of a ScaleSource that SmoothingSource uses; no configuration here is calibrated."""

    def __init__(self, model: CausalLM, windows: torch.Tensor) -> None:
        self.model, self._windows = model, windows

    def windows(self) -> torch.Tensor:
        return self._windows

    def __call__(self, config: KVConfig) -> torch.Tensor | None:
        assert not config.calibrated
        return None


def test_study_with_calibrated_means(monkeypatch: pytest.MonkeyPatch) -> None:
    """run_study passes a smoothed config its means: with every key exact, smoothing costs nothing;
    SmoothingSource zeroes the side a config does not smooth."""
    monkeypatch.setenv("NIBBLEKV_KERNELS", "reference")
    model = _tiny_model()
    windows = torch.randint(0, 100, (2, 20), generator=torch.Generator().manual_seed(10))
    src = SmoothingSource(_NoScales(model, windows))  # type: ignore[arg-type]
    src.stats = calibrate_means(model, windows)
    full = src.stats.tensor()
    assert src.means(parse_config("nvfp4_w32")) is None
    mk, mv = src.means(parse_config("nvfp4_smk")), src.means(parse_config("nvfp4_smv"))
    assert torch.equal(mk[:, 0], full[:, 0]) and not mk[:, 1].any()
    assert torch.equal(mv[:, 1], full[:, 1]) and not mv[:, 0].any()
    assert torch.equal(src.means(parse_config("nvfp4_smk_smv")), full)
    configs = [parse_config(n) for n in ("bf16", "nvfp4_w32_smk_smv", "nvfp4_smk_smv", "nvfp4_plain")]
    accs = run_study(model, windows, configs, src, batch=2, means=src.means)
    s = {c.name: summarize(accs[c.name], accs["bf16"]) for c in configs}
    assert s["nvfp4_w32_smk_smv"]["kl"] < 1e-6  # window 32 > 19 tokens: all exact, smoothing exact
    assert s["nvfp4_smk_smv"]["kl"] > 1e-5 and s["nvfp4_plain"]["kl"] > 1e-5
    with pytest.raises(ValueError):  # a smoothed config and no means
        run_study(model, windows, configs[:2], src, batch=2)


# --- 4. names -----------------------------------------------------------------------------------------


def test_parse_smoothing_and_prefill_window_names() -> None:
    c = parse_config("nvfp4_w64_4o6_had_sink_smk_smv")
    assert c.name == "nvfp4_w64_4o6_had_sink_smk_smv"
    assert (c.kv_dtype, c.window, c.four_over_six, c.hadamard, c.sink_pages) == ("nvfp4", 64, True, True, 1)
    assert (c.smooth_k, c.smooth_v, c.smoothed, c.prefill_window, c.sinks, c.calibrated) == (
        True, True, True, False, 0, False,
    )  # fmt: skip
    p = parse_config("nvfp4_w64_pw")
    assert p.name == "nvfp4_w64_pw" and (p.window, p.prefill_window, p.smoothed) == (64, True, False)
    assert (parse_config("nvfp4_smk").smooth_k, parse_config("nvfp4_smk").smooth_v) == (True, False)
    assert (parse_config("nvfp4_smv").smooth_k, parse_config("nvfp4_smv").smooth_v) == (False, True)
    assert not parse_config("nvfp4_w64_s4").smoothed and parse_config("nvfp4_w64_s4").sinks == 4
    assert parse_config("nvfp4").prefill_window  # the default has the prefill window
    for bad in ("nvfp4_pw", "nvfp4_smk_pw", "fp8_e4m3_smk", "fp8_e4m3_smv", "nvfp4_sm", "nvfp4_smkv"):
        with pytest.raises(ValueError):
            parse_config(bad)
    for kw in ({"smooth_k": True}, {"smooth_v": True}):
        with pytest.raises(ValueError):
            KVConfig("x", kv_dtype="fp8_e4m3", **kw)
        with pytest.raises(ValueError):
            KVConfig("x", kv_dtype="auto", **kw)
    with pytest.raises(ValueError):
        KVConfig("x", prefill_window=True)


def test_smoothed_config_needs_means() -> None:
    for name in ("nvfp4_smk", "nvfp4_smv", "nvfp4_w64_4o6_had_sink_smk_smv"):
        with pytest.raises(ValueError, match="means"):
            FakeQuantAttention(CU, parse_config(name))
    FakeQuantAttention(CU, parse_config("nvfp4_w64_pw"))  # neither smoothed nor calibrated: fine


# --- 5. the prefill window, and the blockwise attention against a per-query reference --------------


def test_prefill_window_reads_previous_chunk_exact() -> None:
    c, t = 32, 112  # chunks [0, 32), [32, 64), [64, 96), [96, 112)
    cu = [0, 40, 40 + t]  # a short sequence (1 chunk and a bit) and a long one
    q, k, v = _qkv(11, t=cu[-1])
    pw = FakeQuantAttention(cu, parse_config("nvfp4_w16_pw"), chunk=c).forward(0, q, k, v)
    w48 = FakeQuantAttention(cu, parse_config("nvfp4_w48"), chunk=c).forward(0, q, k, v)
    w16 = FakeQuantAttention(cu, parse_config("nvfp4_w16"), chunk=c).forward(0, q, k, v)
    assert torch.equal(pw, w48)  # the tail before a chunk: chunk + W = 48 tokens
    # by hand: a query in chunk 2 (position 64 + 9) reads keys 16.. exact, 0..15 quantized
    s0, i = cu[1], 64 + 9
    kk, vv = k[s0 : s0 + i + 1, 0].clone(), v[s0 : s0 + i + 1, 0].clone()
    kk[:16], vv[:16] = fake_quantize(kk[:16], "nvfp4"), fake_quantize(vv[:16], "nvfp4")
    p = torch.softmax(kk @ q[s0 + i, 0] / D**0.5, 0)
    torch.testing.assert_close(pw[s0 + i, 0], p @ vv, atol=1e-5, rtol=1e-5)
    # the first chunk reads only itself (exact): _pw changes nothing there, nor in the short sequence's
    # first chunk; from chunk 1 on it differs (chunk 1 reads all of chunk 0 exact with _pw)
    ref = _causal_ref(cu, q, k, v)
    for a in (0, s0):
        assert torch.equal(pw[a : a + c], w16[a : a + c])
        assert _rel(pw[a : a + c], ref[a : a + c]) < 1e-5
    assert _rel(pw[s0 + 32 : s0 + 64], ref[s0 + 32 : s0 + 64]) < 1e-5  # chunk 1: all exact with _pw
    assert _rel(w16[s0 + 32 : s0 + 64], ref[s0 + 32 : s0 + 64]) > 1e-3
    assert _rel(pw[s0 + 64 :], ref[s0 + 64 :]) > 1e-4


def test_prefill_window_changes_nothing_in_decode_mode() -> None:
    q, k, v = _qkv(12, t=CU[-1])
    for a, b in (("nvfp4_w16_pw", "nvfp4_w16"), ("nvfp4_w16_4o6_had_sink_pw", "nvfp4_w16_4o6_had_sink")):
        out_a = FakeQuantAttention(CU, parse_config(a)).forward(0, q, k, v)
        out_b = FakeQuantAttention(CU, parse_config(b)).forward(0, q, k, v)
        assert torch.equal(out_a, out_b)
    # and with a chunk as long as the sequences, everything is one first chunk: exact either way
    out = FakeQuantAttention(CU, parse_config("nvfp4_w16_pw"), chunk=64).forward(0, q, k, v)
    assert _rel(out, _causal_ref(CU, q, k, v)) < 1e-5


@pytest.mark.parametrize(
    ("name", "chunk"),
    [
        ("nvfp4_plain", 0),
        ("nvfp4_w8", 0),
        ("nvfp4_w5_s3", 0),
        ("nvfp4_w16_4o6_had_sink_smk_smv", 0),
        ("nvfp4_w4", 8),
        ("nvfp4_w4_pw", 8),
        ("nvfp4_w8_s2_smk_smv", 8),
        ("nvfp4_w8_had_pw_smk_smv", 8),
        ("nvfp4_w8_4o6_sink_pw", 4),
        ("nvfp4_smk_smv", 12),
    ],
)
def test_blockwise_matches_per_query_reference(
    name: str, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The blockwise masks against a one-query-at-a-time reference; decode mode in blocks of 8
    queries (so blocks start mid-sequence and the tail straddles them)."""
    monkeypatch.setattr(fakequant, "_DECODE_BLOCK", 8)
    q, k, v = _qkv(13)
    cfg = parse_config(name)
    mu = _means(14) if cfg.smoothed else None
    out = FakeQuantAttention(CU, cfg, chunk=chunk, means=mu).forward(0, q, k, v)
    ref = _fakequant_ref(CU, cfg, q, k, v, chunk, mu)
    assert _rel(out, ref) < 1e-5
    assert _rel(out, _causal_ref(CU, q, k, v)) > 1e-4  # something was quantized


def test_decode_block_size_does_not_matter(monkeypatch: pytest.MonkeyPatch) -> None:
    q, k, v = _qkv(15)
    cfg = parse_config("nvfp4_w6_s2_4o6_smk_smv")
    mu = _means(16)
    outs = []
    for block in (1, 5, 256):
        monkeypatch.setattr(fakequant, "_DECODE_BLOCK", block)
        outs.append(FakeQuantAttention(CU, cfg, means=mu).forward(0, q, k, v))
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0], atol=1e-5, rtol=1e-5)


def test_bf16_inputs_keep_their_dtype() -> None:
    q, k, v = (t.bfloat16() for t in _qkv(17))
    out = FakeQuantAttention(CU, parse_config("nvfp4_w64_smk_smv"), means=_means(18)).forward(0, q, k, v)
    assert out.dtype == torch.bfloat16
    assert _rel(out.float(), _causal_ref(CU, q.float(), k.float(), v.float())) < 1e-2
