"""Fused add + RMSNorm, SiLU * mul and RoPE kernels against their twins (the interpreter on CPU, see
conftest), and the model forward with them against the eager forward."""

from __future__ import annotations

import pytest
import torch
from model_helpers import random_causal_lm

from nibblekv.kernels.fp8.quant import quant_fp8_groups
from nibblekv.kernels.fused.elementwise import add_rms_norm, add_rms_norm_fp8, silu_and_mul, silu_and_mul_fp8
from nibblekv.kernels.fused.reference import add_rms_norm_ref, rope_qk_ref, silu_and_mul_ref
from nibblekv.kernels.fused.rope import rope_qk
from nibblekv.kernels.testing import rel_rms
from nibblekv.model import CausalLM, DenseAttention, ModelConfig
from nibblekv.model.rope import apply_rope

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int16 if x.element_size() == 2 else torch.int32)


def _assert_bit_exact(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    diff = (_bits(got) != _bits(want)).nonzero()
    assert diff.numel() == 0, f"{diff.shape[0]} elements differ, first at {diff[0].tolist()}"


def _assert_close(got: torch.Tensor, want: torch.Tensor, ulps: int = 1) -> None:
    """bf16: at most ``ulps`` bf16 ulps apart (ulp of the larger magnitude); float32: rtol 1e-5, atol 1e-5
    (a 128-term fp32 dot in another order differs by ~1e-6 where its terms cancel)."""
    assert got.shape == want.shape and got.dtype == want.dtype
    assert not got.isnan().any()
    g, w = got.float(), want.float()
    if got.dtype == torch.float32:
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
        return
    mag = torch.maximum(g.abs(), w.abs()).clamp_min(2.0**-120)
    ulp = torch.exp2(torch.floor(torch.log2(mag)) - 7)
    bad = ((g - w).abs() > ulps * ulp).nonzero()
    assert bad.numel() == 0, f"{bad.shape[0]} elements over {ulps} ulp, first at {bad[0].tolist()}"


def _cos_sin(t: int, d: int, dtype: torch.dtype, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[T, 1, D]`` for random positions, computed as ``RotaryEmbedding.cos_sin``."""
    pos = torch.randint(0, 4096, (t,)).float()
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d))
    emb = torch.cat((pos[:, None] * inv, pos[:, None] * inv), dim=-1)[:, None, :]
    return emb.cos().to(dtype).to(device), emb.sin().to(dtype).to(device)


# ----------------------------------------------------------------------------- add + RMSNorm


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("h", [72, 576, 4096])
@pytest.mark.parametrize("t", [1, 3, 17])
@pytest.mark.parametrize("with_residual", [True, False])
def test_add_rms_norm(dtype: torch.dtype, h: int, t: int, with_residual: bool) -> None:
    torch.manual_seed(h + t)
    x = (torch.randn(t, h) * 2).to(dtype).to(DEVICE)
    res = torch.randn(t, h).to(dtype).to(DEVICE) if with_residual else None
    w = (1 + 0.2 * torch.randn(h)).to(dtype).to(DEVICE)
    out, new_res = add_rms_norm(x, res, w, 1e-6)
    want, want_res = add_rms_norm_ref(x, res, w, 1e-6)
    _assert_bit_exact(new_res, want_res)  # the add is plain elementwise
    _assert_close(out, want)
    if res is None:
        assert new_res is x


def test_add_rms_norm_strided_rows_and_mixed_weight() -> None:
    # rows with a larger stride than H; an fp32 weight promotes the output to fp32 (as torch does)
    torch.manual_seed(1)
    base = torch.randn(5, 100).to(torch.bfloat16).to(DEVICE)
    x, res = base[:, :72], base[:, 20:92]
    w = (1 + 0.2 * torch.randn(72)).to(DEVICE)
    out, new_res = add_rms_norm(x, res, w, 1e-5)
    want, want_res = add_rms_norm_ref(x, res, w, 1e-5)
    assert out.dtype == torch.float32 and new_res.is_contiguous()
    _assert_bit_exact(new_res, want_res)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- SiLU * mul


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("t", "inter"), [(1, 40), (3, 40), (5, 1536), (2, 14336)])
@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")  # numpy exp(90) = inf
def test_silu_and_mul(dtype: torch.dtype, t: int, inter: int) -> None:
    torch.manual_seed(inter + t)
    gate_up = (torch.randn(t, 2 * inter) * 4).to(dtype).to(DEVICE)
    gate_up[0, :4] = torch.tensor([0.0, -0.0, 90.0, -90.0])  # exp overflow / underflow
    out = silu_and_mul(gate_up)
    want = silu_and_mul_ref(gate_up)
    # expf differs from torch's CPU exp by an ulp at times: float32 rtol 1e-5, bf16 one ulp
    _assert_close(out, want)


# ----------------------------------------------------------------------------- FP8 layer inputs


def _assert_same_quant(rows: object, out: torch.Tensor, group: int | None) -> None:
    """``rows`` (a QuantizedRows) is bit for bit ``quant_fp8_groups(out, group)``."""
    q, s = quant_fp8_groups(out, group)
    assert rows.group == group and rows.dtype == out.dtype  # type: ignore[attr-defined]
    assert torch.equal(rows.q.view(torch.uint8), q.view(torch.uint8))  # type: ignore[attr-defined]
    assert torch.equal(rows.scale, s)  # type: ignore[attr-defined]


@pytest.mark.parametrize("group", [None, 128, 64])
@pytest.mark.parametrize(("t", "h"), [(1, 72), (3, 576), (2, 4096)])
def test_add_rms_norm_fp8_is_the_norm_then_its_quantization(group: int | None, t: int, h: int) -> None:
    """The fused norm's e4m3 rows and scales equal the norm's bf16 output quantized by quant_fp8_groups
    (per row, per 128 / 64 columns; 72 columns: a partial group, or one group for the whole row)."""
    torch.manual_seed(h + t)
    x = (torch.randn(t, h) * 3).to(torch.bfloat16).to(DEVICE)
    res = torch.randn(t, h).to(torch.bfloat16).to(DEVICE)
    w = (torch.rand(h) + 0.5).to(torch.bfloat16).to(DEVICE)
    rows, new_res = add_rms_norm_fp8(x, res, w, 1e-6, group)
    out, want_res = add_rms_norm(x, res, w, 1e-6)
    _assert_same_quant(rows, out, group)
    _assert_bit_exact(new_res, want_res)


@pytest.mark.parametrize("group", [None, 128])
# (3, 1536) / (1, 14336) per row: rows split in tiles over two kernels (fewer rows than SMs); (133, 1536) one
# program a row
@pytest.mark.parametrize(("t", "inter"), [(2, 40), (3, 1536), (1, 14336), (133, 1536)])
@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
def test_silu_and_mul_fp8_is_silu_mul_then_its_quantization(group: int | None, t: int, inter: int) -> None:
    torch.manual_seed(inter + t)
    gate_up = (torch.randn(t, 2 * inter) * 4).to(torch.bfloat16).to(DEVICE)
    gate_up[0, 0] = 0.0
    _assert_same_quant(silu_and_mul_fp8(gate_up, group), silu_and_mul(gate_up), group)


# ----------------------------------------------------------------------------- RoPE


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("d", [16, 64, 128])
@pytest.mark.parametrize(("hq", "hkv"), [(9, 3), (4, 1), (32, 8)])
@pytest.mark.parametrize("t", [1, 5])
def test_rope_qk_bit_exact(dtype: torch.dtype, d: int, hq: int, hkv: int, t: int) -> None:
    torch.manual_seed(d * hq + t)
    qkv = (torch.randn(t, (hq + 2 * hkv) * d) * 3).to(dtype).to(DEVICE)
    cos, sin = _cos_sin(t, d, dtype, DEVICE)
    q, k, v = rope_qk(qkv, cos, sin, hq, hkv, d)
    wq, wk, wv = rope_qk_ref(qkv, cos, sin, hq, hkv, d)
    for got, want in ((q, wq), (k, wk), (v, wv)):
        assert got.is_contiguous()
        _assert_bit_exact(got, want)
    # the twin is the model's own apply_rope
    _assert_bit_exact(q, apply_rope(qkv[:, : hq * d].reshape(t, hq, d), cos, sin))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    ("d", "hq", "hkv", "t"),
    [(32, 9, 3, 1), (64, 4, 1, 3), (32, 32, 8, 2), (128, 4, 2, 1), (64, 9, 3, 65), (128, 6, 2, 67)],
)
def test_rope_qk_rotated(dtype: torch.dtype, d: int, hq: int, hkv: int, t: int) -> None:
    # the KV cache's Hadamard rotation fused in: q, k after RoPE and v, each times H (head groups of 16
    # rows: 15 and 6 heads leave masked rows; 48 heads fill three groups); below 64 tokens the output
    # columns split over programs (d 64: 2, d 128: 4), from 64 on whole rows (from 512 on: the next test)
    from nibblekv.attention.paged import hadamard_matrix

    torch.manual_seed(d + hq + t)
    qkv = (torch.randn(t, (hq + 2 * hkv) * d) * 3).to(dtype).to(DEVICE)
    cos, sin = _cos_sin(t, d, dtype, DEVICE)
    h = hadamard_matrix(d, DEVICE, dtype)
    got = rope_qk(qkv, cos, sin, hq, hkv, d, h)
    for g, want, plain in zip(
        got, rope_qk_ref(qkv, cos, sin, hq, hkv, d, h), rope_qk_ref(qkv, cos, sin, hq, hkv, d)
    ):
        assert g.is_contiguous()
        _assert_close(g, want)
        assert not torch.allclose(g.float(), plain.float())  # it did rotate
    with pytest.raises(ValueError, match="head_dim >= 32"):
        rope_qk(
            qkv[:, : (hq + 2 * hkv) * 16], cos[..., :16], sin[..., :16], hq, hkv, 16, h[:16, :16].contiguous()
        )
    with pytest.raises(ValueError, match="rotation"):
        rope_qk(qkv, cos, sin, hq, hkv, d, h.t())  # not contiguous


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("d", "hq", "hkv", "t"), [(64, 9, 3, 9), (128, 4, 2, 20)])
def test_rope_qk_rotated_prefill_gemm(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, d: int, hq: int,
                                      hkv: int, t: int) -> None:  # fmt: skip
    # long prefill chunks: the plain kernel into one q | k | v buffer, then one GEMM (the switch lowered from 512
    # tokens to 8 here): contiguous views, the reference's values, the fused path's values up to rounding
    from nibblekv.attention.paged import hadamard_matrix
    from nibblekv.kernels.fused import rope

    torch.manual_seed(d + t)
    qkv = (torch.randn(t, (hq + 2 * hkv) * d) * 3).to(dtype).to(DEVICE)
    cos, sin = _cos_sin(t, d, dtype, DEVICE)
    h = hadamard_matrix(d, DEVICE, dtype)
    fused_out = rope_qk(qkv, cos, sin, hq, hkv, d, h)
    monkeypatch.setattr(rope, "_ROT_FUSED_MAX_TOKENS", 8)
    got = rope_qk(qkv, cos, sin, hq, hkv, d, h)
    for g, want, f, n in zip(got, rope_qk_ref(qkv, cos, sin, hq, hkv, d, h), fused_out, (hq, hkv, hkv)):
        assert g.is_contiguous() and g.shape == (t, n, d)
        _assert_close(g, want)
        _assert_close(g, f)
    assert got[0].untyped_storage().data_ptr() == got[2].untyped_storage().data_ptr()  # one GEMM's output


def test_rope_qk_rotation_switch_in_cuda_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    # while a CUDA graph is captured (decode batches), the GEMM path from _ROT_FUSED_MAX_TOKENS_GRAPH tokens
    from nibblekv.kernels.fused import rope

    x = torch.empty(1, device=DEVICE)
    t_graph, t_eager = rope._ROT_FUSED_MAX_TOKENS_GRAPH, rope._ROT_FUSED_MAX_TOKENS
    assert t_graph < t_eager
    monkeypatch.setattr(rope, "_capturing", lambda _: True)
    assert not rope._rotation_by_gemm(t_graph - 1, x) and rope._rotation_by_gemm(t_graph, x)
    monkeypatch.setattr(rope, "_capturing", lambda _: False)
    assert not rope._rotation_by_gemm(t_eager - 1, x) and rope._rotation_by_gemm(t_eager, x)
    assert not rope._capturing(torch.empty(1))  # a CPU tensor is never in a capture


@cuda_only
def test_rope_qk_rotated_in_cuda_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    # decode batches of >= _ROT_FUSED_MAX_TOKENS_GRAPH tokens: the GEMM path captured and replayed
    from nibblekv.attention.paged import hadamard_matrix
    from nibblekv.kernels.fused import rope

    hq, hkv, d = 6, 2, 128
    for t in (rope._ROT_FUSED_MAX_TOKENS_GRAPH - 1, rope._ROT_FUSED_MAX_TOKENS_GRAPH, 130):
        torch.manual_seed(t)
        qkv = (torch.randn(t, (hq + 2 * hkv) * d, device="cuda") * 3).to(torch.bfloat16)
        cos, sin = _cos_sin(t, d, torch.bfloat16, "cuda")
        h = hadamard_matrix(d, "cuda", torch.bfloat16)
        for limit in (0, 1 << 30):  # both paths compiled (and cuBLAS set up) outside the capture
            with monkeypatch.context() as m:
                m.setattr(rope, "_ROT_FUSED_MAX_TOKENS", limit)
                rope_qk(qkv, cos, sin, hq, hkv, d, h)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = rope_qk(qkv, cos, sin, hq, hkv, d, h)
        qkv.copy_(qkv * -0.5)  # new inputs, replayed
        graph.replay()
        for g, want in zip(got, rope_qk_ref(qkv, cos, sin, hq, hkv, d, h)):
            _assert_close(g, want)


def test_rope_qk_strided_rows_and_odd_half() -> None:
    # head_dim 24 (half 12: a masked tile), rows with a larger stride than the qkv width
    torch.manual_seed(2)
    base = torch.randn(3, 6 * 24 + 8).to(torch.bfloat16).to(DEVICE)
    qkv = base[:, : 6 * 24]
    cos, sin = _cos_sin(3, 24, torch.bfloat16, DEVICE)
    for got, want in zip(rope_qk(qkv, cos, sin, 2, 2, 24), rope_qk_ref(qkv, cos, sin, 2, 2, 24)):
        _assert_bit_exact(got, want)


def test_launch_checks() -> None:
    x = torch.randn(3, 8, device=DEVICE)
    with pytest.raises(ValueError, match="residual must match"):
        add_rms_norm(x, x.to(torch.bfloat16), torch.ones(8, device=DEVICE), 1e-6)
    with pytest.raises(ValueError, match="weight"):
        add_rms_norm(x, None, torch.ones(9, device=DEVICE), 1e-6)
    with pytest.raises(ValueError, match="unit last stride"):
        silu_and_mul(x.t())
    with pytest.raises(ValueError, match="even number"):
        silu_and_mul(torch.randn(2, 7, device=DEVICE))
    cos, sin = _cos_sin(3, 4, torch.float32, DEVICE)
    with pytest.raises(ValueError, match="columns"):
        rope_qk(torch.randn(3, 20, device=DEVICE), cos, sin, 2, 1, 4)
    with pytest.raises(ValueError, match="cos must be"):
        rope_qk(torch.randn(3, 16, device=DEVICE), cos.to(torch.bfloat16), sin, 2, 1, 4)


# ----------------------------------------------------------------------------- the model


def _tiny_model(qk_norm: bool, dtype: torch.dtype, head_dim: int = 16) -> CausalLM:
    """A seeded random 2-layer Llama-shaped model (hidden 64, heads 4/2, head_dim 16)."""
    config = ModelConfig(
        architecture="qwen3" if qk_norm else "llama", num_layers=2, hidden_size=64, intermediate_size=96,
        num_heads=4, num_kv_heads=2, head_dim=head_dim, vocab_size=300, max_position_embeddings=256,
        rms_norm_eps=1e-6, rope_theta=10000.0, attention_bias=qk_norm, qk_norm=qk_norm,
    )  # fmt: skip
    return random_causal_lm(config, 0.1).to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("qk_norm", [False, True])
def test_model_forward_fused_matches_eager(
    dtype: torch.dtype, qk_norm: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _tiny_model(qk_norm, dtype)
    ids = torch.randint(0, 300, (7,), device=DEVICE)
    positions = torch.tensor([0, 1, 2, 3, 0, 1, 2], device=DEVICE)
    attn = DenseAttention([0, 4, 7])
    with torch.no_grad():
        monkeypatch.setenv("NIBBLEKV_KERNELS", "reference")
        eager = model(ids, positions, attn)
        monkeypatch.setenv("NIBBLEKV_KERNELS", "triton")
        fused = model(ids, positions, attn)
    assert fused.dtype == dtype and not fused.isnan().any()
    if dtype == torch.float32:
        torch.testing.assert_close(fused, eager, rtol=1e-5, atol=1e-5)
    else:  # RMSNorm's bf16 ulps (reduction order) propagate through the layers
        torch.testing.assert_close(fused, eager, rtol=2e-2, atol=2e-2)
        assert (fused.float() - eager.float()).abs().mean() < 2e-3


class _RotatedDense(DenseAttention):
    """Dense attention that declares a Hadamard ``qkv_rotation`` (as the paged backend does for nvfp4)
    and counts which entry the model used."""

    def __init__(self, cu: list[int], rotation: torch.Tensor) -> None:
        super().__init__(cu)
        self.qkv_rotation = rotation
        self.calls: list[str] = []

    def forward(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.calls.append("forward")
        return super().forward(layer_id, q, k, v)

    def forward_rotated(
        self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        self.calls.append("rotated")
        # attention is invariant under a shared orthogonal rotation of q and k; v's stays in the output
        return super().forward(layer_id, q, k, v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_model_forward_fused_rotation(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    # the fused path hands the backend pre-rotated q, k, v (rotation inside the RoPE kernel): same output
    from nibblekv.attention.paged import hadamard_matrix

    model = _tiny_model(False, dtype, head_dim=32)
    ids = torch.randint(0, 300, (7,), device=DEVICE)
    positions = torch.tensor([0, 1, 2, 3, 0, 1, 2], device=DEVICE)
    attn = _RotatedDense([0, 4, 7], hadamard_matrix(32, DEVICE, dtype))
    with torch.no_grad():
        monkeypatch.setenv("NIBBLEKV_KERNELS", "reference")
        eager = model(ids, positions, DenseAttention([0, 4, 7]))
        monkeypatch.setenv("NIBBLEKV_KERNELS", "triton")
        fused = model(ids, positions, attn)
    assert attn.calls == ["rotated", "rotated"]
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(fused, eager, rtol=tol, atol=tol)


@pytest.mark.parametrize("kernels", ["reference", "triton"])
@pytest.mark.parametrize("backend_rotates", [False, True])
def test_output_rotation_folded_into_o_proj(
    kernels: str, backend_rotates: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # W_o <- W_o blockdiag(H): o_proj takes H-basis attention output (no un-rotation matmul); a backend
    # that does not rotate gets its output rotated into that basis instead. Same function either way.
    from nibblekv.attention.paged import hadamard_matrix

    model = _tiny_model(False, torch.float32, head_dim=32)
    h = hadamard_matrix(32, DEVICE, torch.float32)
    ids = torch.randint(0, 300, (7,), device=DEVICE)
    positions = torch.tensor([0, 1, 2, 3, 0, 1, 2], device=DEVICE)

    def attn() -> DenseAttention:
        return _RotatedDense([0, 4, 7], h) if backend_rotates else DenseAttention([0, 4, 7])

    with torch.no_grad():
        monkeypatch.setenv("NIBBLEKV_KERNELS", "reference")
        want = model(ids, positions, DenseAttention([0, 4, 7]))
        w_before = model.model.layers[0].self_attn.o_proj.weight.clone()
        for layer in model.model.layers:
            layer.self_attn.fold_output_rotation(h)
            layer.self_attn.fold_output_rotation(h)  # idempotent
        w = model.model.layers[0].self_attn.o_proj.weight
        assert not torch.equal(w, w_before)
        torch.testing.assert_close(w.view(w.shape[0], -1, 32) @ h, w_before.view(w.shape[0], -1, 32))
        monkeypatch.setenv("NIBBLEKV_KERNELS", kernels)
        backend = attn()
        got = model(ids, positions, backend)
    if backend_rotates:
        assert backend.calls == ["rotated", "rotated"]  # type: ignore[attr-defined]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- GPU, Llama-8B sizes


@cuda_only
@pytest.mark.parametrize("t", [1, 7, 300])
def test_gpu_llama8b_sizes(t: int) -> None:
    torch.manual_seed(t)
    bf = torch.bfloat16
    x, res = torch.randn(t, 4096, device="cuda", dtype=bf), torch.randn(t, 4096, device="cuda", dtype=bf)
    w = (1 + 0.2 * torch.randn(4096, device="cuda")).to(bf)
    out, new_res = add_rms_norm(x, res, w, 1e-5)
    want, want_res = add_rms_norm_ref(x, res, w, 1e-5)
    _assert_bit_exact(new_res, want_res)
    _assert_close(out, want)
    gate_up = torch.randn(t, 2 * 14336, device="cuda", dtype=bf) * 4
    _assert_close(silu_and_mul(gate_up), silu_and_mul_ref(gate_up))
    qkv = torch.randn(t, 48 * 128, device="cuda", dtype=bf) * 3
    cos, sin = _cos_sin(t, 128, bf, "cuda")
    for got, want in zip(rope_qk(qkv, cos, sin, 32, 8, 128), rope_qk_ref(qkv, cos, sin, 32, 8, 128)):
        _assert_bit_exact(got, want)
    from nibblekv.attention.paged import hadamard_matrix

    h = hadamard_matrix(128, "cuda", bf)
    for got, want in zip(rope_qk(qkv, cos, sin, 32, 8, 128, h), rope_qk_ref(qkv, cos, sin, 32, 8, 128, h)):
        _assert_close(got, want)


@cuda_only
def test_gpu_float32_rope_bit_exact_silu_within_an_ulp() -> None:
    # no FMA contraction in RoPE; SiLU uses libdevice expf + IEEE division like torch's CUDA kernel
    # (expected bit-exact, asserted to an ulp)
    torch.manual_seed(3)
    qkv = torch.randn(9, 48 * 128, device="cuda") * 3
    cos, sin = _cos_sin(9, 128, torch.float32, "cuda")
    for got, want in zip(rope_qk(qkv, cos, sin, 32, 8, 128), rope_qk_ref(qkv, cos, sin, 32, 8, 128)):
        _assert_bit_exact(got, want)
    gate_up = torch.randn(9, 2 * 14336, device="cuda") * 4
    got, want = silu_and_mul(gate_up), silu_and_mul_ref(gate_up)
    assert (_bits(got) - _bits(want)).abs().max() <= 1


# ----------------------------------------------------------------------------- rotation + FP8 quantization


@pytest.mark.parametrize(("m", "heads", "d", "group"), [(1, 3, 16, None), (17, 4, 32, None), (5, 4, 32, 64),
                                                        (20, 2, 128, 128), (3, 4, 64, 128)])  # fmt: skip
def test_rotate_quant_fp8_matches_twin(m: int, heads: int, d: int, group: int | None) -> None:
    """Each head times the Hadamard matrix, rounded to bf16, quantized per token or per group of whole heads:
    the twin's codes and scales (a bf16 sum taken in another order may move a code by one step)."""
    from nibblekv.attention.paged import hadamard_matrix
    from nibblekv.formats.fp8_weights import dequantize_act_groups
    from nibblekv.kernels.fused.reference import rotate_quant_fp8_ref
    from nibblekv.kernels.fused.rotate_quant import rotate_quant_fp8

    gen = torch.Generator().manual_seed(m * 7 + d)
    wide = torch.randn(m, heads * d + 8, generator=gen).to(DEVICE, torch.bfloat16)
    x = wide[:, 8:]  # a strided view, as an attention output slice may be
    x[0, :d] *= 30.0  # one token with a large head: its scale differs from the others'
    rot = hadamard_matrix(d, DEVICE, torch.bfloat16)
    got = rotate_quant_fp8(x, rot, group)
    want_q, want_s = rotate_quant_fp8_ref(x, rot, group)
    assert got.group == group and got.dtype == torch.bfloat16 and got.scale.shape == want_s.shape
    assert not got.scale.isnan().any()
    torch.testing.assert_close(got.scale, want_s, rtol=1e-2, atol=0)
    same = (got.q.view(torch.uint8) == want_q.view(torch.uint8)).float().mean()
    assert same > 0.98, same
    g = heads * d if group is None else group
    deq = dequantize_act_groups(got.q, got.scale, g)
    assert rel_rms(deq, dequantize_act_groups(want_q, want_s, g)) < 5e-3


def test_rotate_quant_fp8_refuses_what_it_cannot_take() -> None:
    from nibblekv.kernels.fused.rotate_quant import rotate_quant_fp8, rotate_quant_supported

    rot = torch.eye(32, dtype=torch.bfloat16)
    x = torch.zeros(2, 96, dtype=torch.bfloat16)
    assert rotate_quant_supported(x, rot, None) and rotate_quant_supported(x, rot, 32)
    assert not rotate_quant_supported(x, rot, 48)  # a group splitting a head
    assert not rotate_quant_supported(x.float(), rot, None)
    assert not rotate_quant_supported(torch.zeros(2, 32 * 5, dtype=torch.bfloat16), rot, None)  # 5 heads
    with pytest.raises(ValueError, match="whole heads a group"):
        rotate_quant_fp8(x, rot, 48)
