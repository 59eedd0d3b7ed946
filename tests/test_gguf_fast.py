"""``gguf_fast``: the faster GGUF reader and dequantizers against the ``gguf`` package's own (bit-exact)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from model_helpers import random_causal_lm  # noqa: E402

from nibblekv.model import ModelConfig  # noqa: E402
from nibblekv.model.gguf_fast import dequantize, fast_reader_class  # noqa: E402
from nibblekv.model.weights import load_hf_weights  # noqa: E402

QTYPES = ("F32", "F16", "Q8_0", "Q4_0", "Q4_1")


def _write(path: Path) -> dict[str, np.ndarray]:
    """A GGUF with every metadata kind the readers parse and one tensor per quantization type (odd rows)."""
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("t.u32", 7)
    w.add_float32("t.f32", 0.25)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo")
    w.add_array("t.ints", list(range(3000)))
    w.add_array("t.floats", [0.5, -1.25, 3.0])
    w.add_array("t.strs", ["a", "", "ünï", "x" * 300] * 700)
    w.add_array("t.empty", [])
    src = {}
    for i, name in enumerate(QTYPES):
        qtype = getattr(gguf.GGMLQuantizationType, name)
        x = (rng.standard_normal((5, 64)) * (i + 1)).astype(np.float32)
        src[name] = x
        if name == "F32":
            w.add_tensor(name, x)
        elif name == "F16":
            w.add_tensor(name, x.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(x, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return src


def test_fast_reader_fields_and_tensors_match_stock(tmp_path: Path) -> None:
    path = tmp_path / "t.gguf"
    src = _write(path)
    stock, fast = gguf.GGUFReader(str(path)), fast_reader_class()(str(path))
    assert list(fast.fields) == list(stock.fields)
    for key, field in stock.fields.items():
        assert fast.fields[key].contents() == field.contents(), key
    assert fast.fields["t.strs"].contents()[2] == "ünï" and len(fast.fields["t.ints"].contents()) == 3000
    assert [(t.name, t.tensor_type, list(t.shape)) for t in fast.tensors] == [
        (t.name, t.tensor_type, list(t.shape)) for t in stock.tensors
    ]
    for t in fast.tensors:
        ours = dequantize(t.data, t.tensor_type)
        ref = gguf.quants.dequantize(t.data, t.tensor_type)
        assert ours.dtype == torch.float32 and tuple(ours.shape) == ref.shape == src[t.name].shape
        ref_bits = np.ascontiguousarray(ref, np.float32).view(np.uint32)
        assert np.array_equal(ours.numpy().view(np.uint32), ref_bits)
        # the quantized ones are lossy; the round trip still has to land near the source
        assert np.abs(ours.numpy() - src[t.name]).max() < 0.6 * (QTYPES.index(t.name) + 1)


def test_adopt_keeps_whole_tensors_and_copies_fused_rows() -> None:
    config = ModelConfig(
        architecture="llama", num_layers=2, hidden_size=64, intermediate_size=96, num_heads=4, num_kv_heads=2,
        head_dim=16, vocab_size=300, max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=10000.0,
    )
    model = random_causal_lm(config, 0.1)
    state = {k: v.detach().clone() for k, v in _hf_state(model).items()}
    fresh = {k: v.clone() for k, v in state.items()}
    load_hf_weights(model, fresh.items(), adopt=True)
    params = dict(model.named_parameters())
    norm = next(k for k in fresh if k.endswith("input_layernorm.weight"))
    assert params[norm].data_ptr() == fresh[norm].data_ptr()  # adopted, not copied
    q = next(k for k in fresh if k.endswith("q_proj.weight"))
    fused = q.replace("q_proj", "qkv_proj")
    assert params[fused].data_ptr() != fresh[q].data_ptr()
    assert torch.equal(params[fused][: fresh[q].shape[0]], state[q])
    for k, v in state.items():
        if k in params:
            assert torch.equal(params[k], v), k


def _hf_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's parameters under HF names (fused projections split back)."""
    cfg = model.config  # type: ignore[attr-defined]
    out: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        if ".qkv_proj." in name:
            q, k, v = p.split((cfg.q_size, cfg.kv_size, cfg.kv_size))
            for part, t in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
                out[name.replace("qkv_proj", part)] = t
        elif ".gate_up_proj." in name:
            g, u = p.split(cfg.intermediate_size)
            out[name.replace("gate_up_proj", "gate_proj")] = g
            out[name.replace("gate_up_proj", "up_proj")] = u
        else:
            out[name] = p
    return out
