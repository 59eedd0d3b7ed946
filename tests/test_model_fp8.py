"""FP8 weights on CPU: ``--quantization fp8`` against the unquantized twin, synthetic FP8 HF folders in both
checkpoint formats (block-scaled ``fp8`` and compressed-tensors per-channel / per-tensor), TP shards of
their scales, and the errors for malformed checkpoints."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from model_helpers import random_causal_lm

from nibblekv.attention.paged import hadamard_matrix
from nibblekv.formats.fp8_weights import (
    Fp8Input,
    dequantize_weight,
    quantize_weight_block,
    quantize_weight_channel,
)
from nibblekv.model import ByteTokenizer, CausalLM, DenseAttention, ModelConfig, load_model
from nibblekv.model import loader as loader_mod
from nibblekv.model.fp8 import (
    Fp8Linear,
    QuantMethod,
    _fp8_twin,
    parse_quantization_config,
    quantize_model,
    weight_bytes,
)
from nibblekv.model.parallel import TPContext, dummy_hf_weights

# kv_size = 128 and q_size = 256: fused q/k/v and gate/up parts start on 128-row blocks, as in real models
CFG: dict[str, Any] = {
    "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 384,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 300,
    "max_position_embeddings": 256, "tie_word_embeddings": False, "eos_token_id": 2,
}  # fmt: skip
BLOCK_QC = {  # Qwen3-*-FP8's quantization_config
    "quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128],
}  # fmt: skip
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# the fused-path tests: the Triton interpreter on CPU (conftest), the GPU where there is one
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _ct_qc(strategy: str) -> dict[str, Any]:
    """compressed-tensors ``quantization_config`` of an ``-FP8-dynamic`` checkpoint (llm-compressor's)."""
    return {
        "quant_method": "compressed-tensors", "format": "float-quantized",
        "quantization_status": "compressed",
        "ignore": ["lm_head"], "kv_cache_scheme": None,
        "config_groups": {"group_0": {
            "targets": ["Linear"], "output_activations": None,
            "weights": {"num_bits": 8, "type": "float", "strategy": strategy, "dynamic": False,
                        "symmetric": True},
            "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True,
                                  "symmetric": True},
        }},
    }  # fmt: skip


def _logits(model: CausalLM, n: int = 10) -> torch.Tensor:
    ids = torch.arange(5, 5 + n, device=model.device)
    pos = torch.arange(n, device=model.device)
    with torch.no_grad():
        return model.compute_logits(model(ids, pos, DenseAttention.single(n)))


def _greedy(model: CausalLM, prompt: list[int], steps: int) -> list[int]:
    ids = torch.tensor(prompt, device=model.device)
    for _ in range(steps):
        n = len(ids)
        with torch.no_grad():
            logits = model.compute_logits(model(ids, torch.arange(n, device=model.device), DenseAttention.single(n)))
        ids = torch.cat([ids, logits[-1:].argmax(-1)])
    return ids[len(prompt) :].tolist()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def test_quantization_fp8_agrees_with_bf16_twin() -> None:
    """Per-channel FP8 weights + per-token FP8 activations: logits within 15% (relative L2) of the bf16
    model, the same top-1 at every prompt position and the same greedy tokens for a short prompt.

    NOTE: e4m3 keeps 3 mantissa bits: one FP8 linear layer is ~3.7% (relative L2) off its bf16 result
    (weights and activations rounded); a random 2-layer model compounds that to ~10%."""
    cfg = ModelConfig.from_hf(CFG)
    bf16 = random_causal_lm(cfg, std=0.04, seed=3).to(torch.bfloat16)
    fp8 = copy.deepcopy(bf16)
    quantize_model(fp8)
    assert all(isinstance(layer.mlp.down_proj, Fp8Linear) for layer in fp8.model.layers)
    assert fp8.lm_head.weight.dtype == fp8.model.embed_tokens.weight.dtype == torch.bfloat16
    assert fp8.model.layers[0].input_layernorm.weight.dtype == torch.bfloat16
    a, b = _logits(fp8), _logits(bf16)
    assert _rel(a, b) < 0.15 and torch.equal(a.argmax(-1), b.argmax(-1))
    assert _greedy(fp8, [7, 11, 3, 5], 6) == _greedy(bf16, [7, 11, 3, 5], 6)


def test_fused_kernels_hand_fp8_layers_their_inputs_quantized(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the fused path the RMSNorms and SiLU * mul quantize for the FP8 layer after them (qkv, gate/up,
    down; o_proj quantizes its own input): logits bit for bit those of quantizing inside each layer."""
    model = random_causal_lm(ModelConfig.from_hf(CFG), std=0.04, seed=3).to(DEVICE, torch.bfloat16)
    quantize_model(model)
    assert all(layer.input_layernorm.fp8_out == Fp8Input(None) for layer in model.model.layers)
    monkeypatch.setenv("NIBBLEKV_KERNELS", "triton")  # the fused path (on CPU: the Triton interpreter)
    seen: list[str] = []
    gemm = Fp8Linear._gemm

    def spy(self: Fp8Linear, x: Any, bias: torch.Tensor | None) -> torch.Tensor:
        seen.append(type(x).__name__)
        return gemm(self, x, bias)

    monkeypatch.setattr(Fp8Linear, "_gemm", spy)
    fused = _logits(model)
    assert seen == ["QuantizedRows", "Tensor", "QuantizedRows", "QuantizedRows"] * 2
    for layer in model.model.layers:
        layer.input_layernorm.fp8_out = layer.post_attention_layernorm.fp8_out = None
    monkeypatch.setattr(Fp8Linear, "fp8_input", None)  # SiLU * mul: unfused too
    seen.clear()
    unfused = _logits(model)
    assert seen == ["Tensor"] * 8
    assert torch.equal(fused, unfused)


class _RotatingAttention(DenseAttention):
    """Dense attention behind a Hadamard ``qkv_rotation``, as an nvfp4 cache's backend: q, k, v arrive rotated
    and the output leaves in the rotated basis (scores are unchanged: ``R`` is orthogonal)."""

    def __init__(self, n: int, d: int, dtype: torch.dtype = torch.bfloat16, device: str = DEVICE) -> None:
        super().__init__([0, n])
        self.qkv_rotation = hadamard_matrix(d, device, dtype)

    def forward_rotated(
        self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        return self.forward(layer_id, q, k, v)


@pytest.mark.parametrize("block", [None, 64])
def test_fp8_o_proj_takes_its_input_rotated_back_and_quantized_in_one_kernel(
    monkeypatch: pytest.MonkeyPatch, block: int | None
) -> None:
    """Behind a rotating backend an FP8 o_proj cannot absorb ``R``: on the fused path one kernel rotates the
    attention output back and quantizes it (``rotate_quant_fp8``), within rounding of the matmul + quant it
    replaces and of the unrotated forward."""
    from nibblekv.kernels.fused import rotate_quant

    cfg = {**CFG, "torch_dtype": "bfloat16"}
    model = random_causal_lm(ModelConfig.from_hf(cfg), std=0.04, seed=5).to(DEVICE, torch.bfloat16)
    o_weights = [layer.self_attn.o_proj.weight.detach().clone() for layer in model.model.layers]
    quantize_model(model)
    if block is not None:  # block-scaled o_proj (a 64-column token group: one head)
        for layer, w in zip(model.model.layers, o_weights):
            o_proj = _fp8_twin(layer.self_attn.o_proj, block)
            o_proj.weight.data, o_proj.weight_scale.data = quantize_weight_block(w, block)
            layer.self_attn.o_proj = o_proj
    n, d = 10, model.config.head_dim
    ids, pos = torch.arange(5, 5 + n, device=DEVICE), torch.arange(n, device=DEVICE)
    monkeypatch.setenv("NIBBLEKV_KERNELS", "triton")
    calls: list[int | None] = []
    kernel = rotate_quant.rotate_quant_fp8
    spy = lambda x, r, g: (calls.append(g), kernel(x, r, g))[1]  # noqa: E731
    monkeypatch.setattr(rotate_quant, "rotate_quant_fp8", spy)
    with torch.no_grad():
        fused = model.compute_logits(model(ids, pos, _RotatingAttention(n, d))).float()
        assert calls == [block] * model.config.num_layers
        monkeypatch.setattr(rotate_quant, "rotate_quant_supported", lambda *a: False)
        eager = model.compute_logits(model(ids, pos, _RotatingAttention(n, d))).float()
        plain = model.compute_logits(model(ids, pos, DenseAttention.single(n))).float()
    assert len(calls) == model.config.num_layers  # the eager forward took the matmul + quant path
    # the eager matmul rounds the same fp32 sums to bf16: equal here; the unrotated forward quantizes o_proj's
    # input in another basis (other e4m3 roundings, 5% apart)
    assert _rel(fused, eager) < 1e-2, _rel(fused, eager)
    assert _rel(fused, plain) < 0.1, _rel(fused, plain)


def test_kv_rotation_is_folded_into_o_proj_before_it_is_quantized(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``load_model(..., kv_rotation=True)`` (an nvfp4 engine's load): o_proj's FP8 codes are those of
    ``W_o blockdiag(H)``, quantized once, and behind a rotating backend no layer rotates its output back
    (the eager path's matmuls by ``H``: q, k, v only; an FP8 o_proj loaded unfolded adds the output's); the
    logits stay within FP8 rounding of the plain model's."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CFG))
    kw: dict[str, Any] = {"load_format": "dummy", "seed": 1}  # CPU: the eager path, whose matmuls we count
    ref, _ = load_model(str(path), **kw)
    fp8, _ = load_model(str(path), quantization=QuantMethod.FP8, kv_rotation=True, **kw)
    unfolded, _ = load_model(str(path), quantization=QuantMethod.FP8, **kw)  # the default: kv_rotation=False
    d, layers = ref.config.head_dim, ref.config.num_layers
    h = hadamard_matrix(d, "cpu", ref.dtype)
    for plain, folded in zip(ref.model.layers, fp8.model.layers):
        attn = folded.self_attn
        assert attn.o_rotation is not None and isinstance(attn.o_proj, Fp8Linear)
        w = plain.self_attn.o_proj.weight
        wq, ws = quantize_weight_channel((w.view(w.shape[0], -1, d) @ h).reshape(w.shape))
        assert torch.equal(attn.o_proj.weight.view(torch.uint8), wq.view(torch.uint8))
        assert torch.equal(attn.o_proj.weight_scale, ws)
    assert unfolded.model.layers[0].self_attn.o_rotation is None
    n = 10
    ids, pos = torch.arange(5, 5 + n), torch.arange(n)
    by_h: list[int] = []
    real_matmul = torch.Tensor.__matmul__

    def spy(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        by_h.append(int(b.shape == (d, d) and torch.equal(b, h)))
        return real_matmul(a, b)

    monkeypatch.setattr(torch.Tensor, "__matmul__", spy)
    with torch.no_grad():
        got = fp8.compute_logits(fp8(ids, pos, _RotatingAttention(n, d, ref.dtype, "cpu"))).float()
        folded_count, by_h[:] = sum(by_h), []
        back = unfolded.compute_logits(unfolded(ids, pos, _RotatingAttention(n, d, ref.dtype, "cpu"))).float()
    monkeypatch.setattr(torch.Tensor, "__matmul__", real_matmul)
    assert (folded_count, sum(by_h)) == (3 * layers, 4 * layers)
    assert _rel(got, _logits(ref).float()) < 0.15
    assert _rel(got, back) < 0.15


def test_load_model_quantization_flag_on_dummy(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CFG))
    ref, _ = load_model(str(path), load_format="dummy", seed=1)
    fp8, _ = load_model(str(path), load_format="dummy", seed=1, quantization=QuantMethod.FP8)
    attn = fp8.model.layers[1].self_attn
    assert isinstance(attn.qkv_proj, Fp8Linear) and attn.qkv_proj.weight.dtype == torch.float8_e4m3fn
    assert attn.qkv_proj.weight_scale.shape == (256 + 2 * 128,)
    linear = sum(p.numel() for n, p in ref.named_parameters() if "proj" in n)
    assert weight_bytes(ref) - weight_bytes(fp8) == linear * 3 - 4 * sum(  # fp32 -> 1 byte + fp32 row scales
        m.weight_scale.numel() for m in fp8.modules() if isinstance(m, Fp8Linear)
    )
    assert _rel(_logits(fp8), _logits(ref)) < 0.15
    # a TP rank's shard: row-parallel projections become FP8 layers that all-reduce, then add their bias
    shard, _ = load_model(str(path), load_format="dummy", quantization=QuantMethod.FP8, tp=TPContext(1, 2))
    o_proj = shard.model.layers[0].self_attn.o_proj
    assert isinstance(o_proj, Fp8Linear) and o_proj.reduce and o_proj.weight.shape == (256, 128)


def _write_folder(
    folder: Path, qc: dict[str, Any], scheme: str, hf_cfg: dict[str, Any] = CFG, keep: tuple[str, ...] = ()
) -> dict[str, torch.Tensor]:
    """An HF folder of ``hf_cfg``'s shape with FP8 projections under ``scheme`` (``block``, ``channel``,
    ``tensor``) and the tensor names real checkpoints use. Returns every projection's dequantized weight."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    config = ModelConfig.from_hf(hf_cfg)
    tensors: dict[str, torch.Tensor] = {}
    dequant: dict[str, torch.Tensor] = {}
    for name, t in dummy_hf_weights(config, 0, 0.08, torch.float32, torch.device("cpu")):
        base = name[: -len(".weight")]
        if not (name.endswith(".weight") and base.endswith(PROJ)) or base in keep:
            tensors[name] = t.contiguous()
            continue
        if scheme == "block":
            q, s = quantize_weight_block(t, 128)
            tensors[f"{base}.weight_scale_inv"] = s
            dequant[name] = dequantize_weight(q, s, 128)
        else:
            q, s = quantize_weight_channel(t)
            if scheme == "tensor":  # one scale for the whole matrix: requantize under the largest row scale
                s = s.max().reshape(1)
                q = (t / s).clamp(-448, 448).to(torch.float8_e4m3fn)
            s = s.to(torch.bfloat16)  # compressed-tensors stores scales in the model dtype
            tensors[f"{base}.weight_scale"] = s[:, None] if scheme == "channel" else s
            dequant[name] = q.float() * s.float()[:, None]
        tensors[name] = q
    cfg = {**hf_cfg, "torch_dtype": "bfloat16", "quantization_config": qc}
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file(tensors, str(folder / "model.safetensors"))
    return dequant


@pytest.fixture(autouse=True)
def _byte_tokenizer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The synthetic folders carry no tokenizer: a byte tokenizer spares loading transformers."""

    class _Tok:
        @staticmethod
        def from_folder(folder: Path, eos: list[int]) -> ByteTokenizer:
            return ByteTokenizer(CFG["vocab_size"])

    monkeypatch.setattr(loader_mod, "HFTokenizer", _Tok)


@pytest.mark.parametrize(("scheme", "qc"), [("block", BLOCK_QC), ("channel", _ct_qc("channel")),
                                            ("tensor", _ct_qc("tensor"))])  # fmt: skip
def test_fp8_checkpoint_loads_and_matches_dequantized_reference(
    tmp_path: Path, scheme: str, qc: dict[str, Any]
) -> None:
    dequant = _write_folder(tmp_path / "fp8", qc, scheme)
    model, _ = load_model(str(tmp_path / "fp8"), dtype=torch.float32)
    layer = model.model.layers[0]
    qkv = layer.self_attn.qkv_proj
    assert isinstance(qkv, Fp8Linear) and qkv.block == (128 if scheme == "block" else None)
    # the loaded codes and scales are the checkpoint's, bit for bit
    want = torch.cat([dequant[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(dequantize_weight(qkv.weight, qkv.weight_scale, qkv.block), want)
    # and the model runs, close to the dequantized weights served unquantized (the error left: activations)
    from safetensors.torch import load_file, save_file

    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    tensors = load_file(str(tmp_path / "fp8" / "model.safetensors"))
    plain = {n: t for n, t in tensors.items() if not n.endswith(("weight_scale", "weight_scale_inv"))}
    save_file({**plain, **dequant}, str(ref_dir / "model.safetensors"))
    (ref_dir / "config.json").write_text(json.dumps(CFG))
    ref, _ = load_model(str(ref_dir), dtype=torch.float32)
    assert _rel(_logits(model), _logits(ref)) < 0.15


def test_checkpoint_ignore_list_keeps_those_layers_unquantized(tmp_path: Path) -> None:
    """compressed-tensors ``ignore`` (exact names and ``re:`` patterns) and ``modules_to_not_convert``
    (substrings): those projections load in the model dtype, the rest in FP8; a fused part alone is refused."""
    keep = ("model.layers.1.mlp.down_proj", "model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj")
    qc = {**_ct_qc("channel"), "ignore": ["lm_head", keep[0], "re:.*layers[.]0[.]mlp[.](gate|up)_proj"]}
    dequant = _write_folder(tmp_path / "ct", qc, "channel", keep=keep)
    model, _ = load_model(str(tmp_path / "ct"), dtype=torch.float32)
    l0, l1 = model.model.layers
    assert not isinstance(l1.mlp.down_proj, Fp8Linear) and not isinstance(l0.mlp.gate_up_proj, Fp8Linear)
    assert isinstance(l0.mlp.down_proj, Fp8Linear) and isinstance(l1.mlp.gate_up_proj, Fp8Linear)
    assert torch.isfinite(_logits(model)).all() and len(dequant) == 7 * 2 - 3
    block_qc = {**BLOCK_QC, "modules_to_not_convert": ["lm_head", "layers.1.mlp.down_proj"]}
    _write_folder(tmp_path / "blk", block_qc, "block", keep=keep[:1])
    model, _ = load_model(str(tmp_path / "blk"), dtype=torch.float32)
    assert not isinstance(model.model.layers[1].mlp.down_proj, Fp8Linear)
    assert isinstance(model.model.layers[0].mlp.down_proj, Fp8Linear)
    # one part of a fused projection: nibblekv cannot serve q in bf16 and k, v in FP8 as one layer
    part = {**_ct_qc("channel"), "ignore": ["model.layers.0.self_attn.q_proj"]}
    _write_folder(tmp_path / "part", part, "channel", keep=("model.layers.0.self_attn.q_proj",))
    with pytest.raises(ValueError, match=r"layer 0's self_attn.q_proj unquantized but not the rest"):
        load_model(str(tmp_path / "part"), dtype=torch.float32)


def test_tp_shards_keep_their_scales(tmp_path: Path) -> None:
    """Each rank's FP8 codes and block scales dequantize to its slice of the full weight."""
    cfg = {**CFG, "head_dim": 128, "intermediate_size": 512}  # per rank: 2 q heads, 1 kv head, 256 of MLP
    folder = tmp_path / "tp"
    dequant = _write_folder(folder, BLOCK_QC, "block", cfg)
    for rank in range(2):
        model, _ = load_model(str(folder), dtype=torch.float32, tp=TPContext(rank, 2))
        attn, mlp = model.model.layers[1].self_attn, model.model.layers[1].mlp
        q = dequant["model.layers.1.self_attn.q_proj.weight"][rank * 256 : (rank + 1) * 256]
        k = dequant["model.layers.1.self_attn.k_proj.weight"][rank * 128 : (rank + 1) * 128]
        v = dequant["model.layers.1.self_attn.v_proj.weight"][rank * 128 : (rank + 1) * 128]
        got = dequantize_weight(attn.qkv_proj.weight, attn.qkv_proj.weight_scale, 128)
        assert torch.equal(got, torch.cat([q, k, v]))
        down = dequant["model.layers.1.mlp.down_proj.weight"][:, rank * 256 : (rank + 1) * 256]
        assert torch.equal(dequantize_weight(mlp.down_proj.weight, mlp.down_proj.weight_scale, 128), down)
        assert isinstance(mlp.down_proj, Fp8Linear) and mlp.down_proj.reduce and attn.o_proj.reduce
    _write_folder(tmp_path / "tp64", BLOCK_QC, "block")  # head_dim 64: one KV head per rank is half a block
    with pytest.raises(ValueError, match="does not fall on the checkpoint's 128-wide FP8 scale blocks"):
        load_model(str(tmp_path / "tp64"), dtype=torch.float32, tp=TPContext(0, 2))


@pytest.mark.parametrize(
    ("qc", "match"),
    [
        ({"quant_method": "awq", "bits": 4}, "quant_method 'awq'"),
        ({**BLOCK_QC, "activation_scheme": "static"}, "activation_scheme 'static'"),
        ({**BLOCK_QC, "weight_block_size": [128, 64]}, r"weight_block_size \[128, 64\]"),
        ({**_ct_qc("channel"), "format": "pack-quantized"}, "format 'pack-quantized'"),
    ],
)
def test_unsupported_quantization_config_is_named(qc: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_quantization_config({"quantization_config": qc})


def test_ct_static_activations_refused() -> None:
    qc = _ct_qc("tensor")
    qc["config_groups"]["group_0"]["input_activations"]["dynamic"] = False
    with pytest.raises(ValueError, match="only dynamic 8-bit float activations"):
        parse_quantization_config({"quantization_config": qc})


def test_malformed_checkpoints_give_clear_errors(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    _write_folder(tmp_path / "m", BLOCK_QC, "block")
    path = tmp_path / "m" / "model.safetensors"
    good = load_file(str(path))
    bad_scale = "model.layers.0.mlp.down_proj.weight_scale_inv"
    save_file({**good, bad_scale: good[bad_scale][:, :1].contiguous()}, str(path))
    with pytest.raises(ValueError, match=r"down_proj.weight_scale: checkpoint shape \(2, 1\) != model"):
        load_model(str(tmp_path / "m"), dtype=torch.float32)
    w = "model.layers.0.mlp.up_proj.weight"
    save_file({**good, w: good[w].float()}, str(path))
    with pytest.raises(ValueError, match="up_proj.weight: checkpoint dtype torch.float32 in an FP8 layer"):
        load_model(str(tmp_path / "m"), dtype=torch.float32)
    save_file({**good, "lm_head.weight": good["lm_head.weight"].to(torch.float8_e4m3fn)}, str(path))
    with pytest.raises(ValueError, match="lm_head.weight: an FP8 tensor for a torch.float32 parameter"):
        load_model(str(tmp_path / "m"), dtype=torch.float32)
    save_file({n: t for n, t in good.items() if n != bad_scale}, str(path))
    with pytest.raises(ValueError, match="missing 1 tensors"):
        load_model(str(tmp_path / "m"), dtype=torch.float32)
    # per-channel scales under a block config
    save_file({**{n: t for n, t in good.items() if n != bad_scale},
               "model.layers.0.mlp.down_proj.weight_scale": torch.ones(256, 1)}, str(path))  # fmt: skip
    with pytest.raises(ValueError, match="per-channel scales in a checkpoint whose quantization_config says"):
        load_model(str(tmp_path / "m"), dtype=torch.float32)


def test_engine_and_cli_serve_fp8_weights(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--quantization fp8`` through the engine (paged KV, fp32 and nvfp4 caches) and the CLI: the engine's
    greedy tokens are the dense forward's, the start-up log reports FP8 weights and their size."""
    from nibblekv.cli import main
    from nibblekv.engine import Engine, SamplingParams

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**CFG, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32}))
    caplog.set_level("INFO", logger="nibblekv")
    # NOTE: on the CPU (the reference GEMMs): on a GPU the engine's decode (M=1) and the whole-sequence
    # forward run differently tiled FP8 GEMMs, and a random model's near-tied logits may then pick other tokens
    engine = Engine(
        load_format="dummy", model=str(path), max_total_tokens=256, quantization="fp8", seed=2, device="cpu"
    )
    assert isinstance(engine.model.model.layers[0].mlp.gate_up_proj, Fp8Linear)
    assert "quantization=fp8, mem usage=" in caplog.text
    prompt = [7, 11, 3, 5, 9]
    out = engine.generate([prompt], SamplingParams(temperature=0, max_new_tokens=5, ignore_eos=True))
    assert out[0].token_ids == _greedy(engine.model, prompt, 5)
    argv = ["generate", "hi", "--max-new-tokens", "3", "--load-format", "dummy", "--model", str(path),
            "--max-total-tokens", "256", "--kv-cache-dtype", "nvfp4", "--device", "cpu",
            "--quantization", "fp8"]  # fmt: skip
    assert main(argv) == 0
    with pytest.raises(SystemExit) as exc:
        main([*argv[:-1], "awq"])
    assert exc.value.code == 2 and "--quantization" in capsys.readouterr().err


@pytest.mark.parametrize(("kv", "hadamard", "folded"), [("nvfp4", None, True), ("nvfp4", False, False),
                                                       ("fp8_e4m3", None, False), ("fp8_e4m3", True, True)])
def test_engine_loads_o_proj_in_its_caches_basis(
    tmp_path: Path, kv: str, hadamard: bool | None, folded: bool
) -> None:
    """An engine whose cache rotates K/V (nvfp4's default, or ``--kv-hadamard``) loads its FP8 o_proj with the
    rotation folded in (``kv_rotation_planned``); the others load it as it is. Either way it serves."""
    from nibblekv.engine import Engine, SamplingParams

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**CFG, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32}))
    engine = Engine(load_format="dummy", model=str(path), max_total_tokens=256, quantization="fp8",
                    kv_cache_dtype=kv, kv_hadamard=hadamard, device="cpu")  # fmt: skip
    assert engine.model.output_rotation_folded is folded
    assert (engine.runner.backend.qkv_rotation is not None) is folded
    assert isinstance(engine.model.model.layers[0].self_attn.o_proj, Fp8Linear)
    out = engine.generate([[7, 11, 3]], SamplingParams(temperature=0, max_new_tokens=3, ignore_eos=True))
    assert len(out[0].token_ids) == 3


sm90 = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
    reason="FP8 tensor cores: needs an sm_90 GPU",
)


@sm90
@pytest.mark.parametrize("scheme", ["channel", "block"])
def test_gpu_fp8_model_matches_reference_path(
    tmp_path: Path, scheme: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model on FP8 tensor cores (row-wise _scaled_mm / Triton block GEMM) against the same model on
    the dequantizing reference path (NIBBLEKV_KERNELS=reference)."""
    qc = BLOCK_QC if scheme == "block" else _ct_qc("channel")
    _write_folder(tmp_path / "ckpt", qc, scheme)
    model, _ = load_model(str(tmp_path / "ckpt"), device="cuda")  # bf16
    got = _logits(model, 37)
    monkeypatch.setenv("NIBBLEKV_KERNELS", "reference")
    want = _logits(model, 37)
    # NOTE: the reference path also swaps the fused norm / RoPE kernels for torch ops: their bf16 rounding
    # differences flip e4m3 codes of the activations, which two random layers amplify (0.067 on the H200)
    assert _rel(got, want) < 0.1


@sm90
def test_gpu_engine_fp8_cuda_graph_decode_equals_eager() -> None:
    """--quantization fp8 on the GPU: CUDA-graph decode gives the eager decode's greedy tokens."""
    from nibblekv.engine import Engine, SamplingParams

    loaded = load_model("smollm2-135m", load_format="dummy", device="cuda", quantization=QuantMethod.FP8)
    prompts = [[(7 * i + 3 * j) % 30000 + 10 for j in range(n)] for i, n in enumerate((37, 53, 61, 29))]
    params = SamplingParams(temperature=0, max_new_tokens=24, ignore_eos=True)
    common: dict[str, Any] = {"loaded": loaded, "kv_cache_dtype": "nvfp4", "max_total_tokens": 4096,
                              "max_running_requests": 8, "decode_log_interval": 0}  # fmt: skip
    ref = Engine(disable_cuda_graph=True, **common).generate(prompts, params)
    graph = Engine(cuda_graph_max_bs=4, **common)
    got = graph.generate(prompts, params)
    assert graph.runner.last_used_graph
    assert [o.token_ids for o in got] == [o.token_ids for o in ref]


def test_row_parallel_fp8_linear_all_reduces_then_adds_its_bias(tmp_path: Path) -> None:
    """The row-parallel FP8 layer's forward in a one-rank gloo group: all-reduce (the identity here) of the
    partial product, the bias added once after it."""
    import torch.distributed as dist

    from nibblekv.formats.fp8_weights import quantize_weight_channel as qwc

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        layer = Fp8Linear(96, 40, True, None, torch.float32, reduce=True)
        wq, ws = qwc(torch.randn(40, 96) * 0.05)
        layer.weight.data, layer.weight_scale.data, layer.bias.data = wq, ws, torch.randn(40)
        x = torch.randn(3, 96)
        from nibblekv.kernels.fp8.reference import fp8_linear_ref

        assert torch.equal(layer(x), fp8_linear_ref(x, wq, ws, None, None) + layer.bias)
    finally:
        dist.destroy_process_group()


def test_tp2_engine_with_fp8_weights_runs_like_tp1(tmp_path: Path) -> None:
    """--tp-size 2 --quantization fp8 (gloo, CPU): each rank quantizes its own shards (row-parallel layers
    per K slice, so not bit-equal to tp 1): both runs finish, and each request's first token (from the
    prefill's logits) agrees; later tokens of this random model drift apart."""
    from nibblekv.engine import Engine, SamplingParams

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**CFG, "attention_bias": True}))
    kw: dict[str, Any] = dict(
        model=str(path), load_format="dummy", device="cpu", seed=5, max_total_tokens=1024, quantization="fp8"
    )
    prompts, params = [list(range(1, 40)), [7, 8, 9]], SamplingParams(max_new_tokens=6, temperature=0.0)
    outs = []
    for tp in (1, 2):
        engine = Engine(tp_size=tp, **kw)
        try:
            outs.append([o.token_ids for o in engine.generate(prompts, params)])
        finally:
            engine.shutdown()
    assert [len(o) for o in outs[1]] == [6, 6]
    assert [o[0] for o in outs[0]] == [o[0] for o in outs[1]]
