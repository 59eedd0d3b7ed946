"""Hybrid Gated-DeltaNet models (Qwen3-Next, Qwen3.5 dense): config parsing, the torch twin of the gated
delta rule, and ours vs transformers' implementation with the same weights (saved as safetensors)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from nibblekv.kernels.linear import gated_delta_rule_decode
from nibblekv.kernels.linear.reference import decay_and_beta, recurrent_gated_delta_rule
from nibblekv.model import DenseAttention, ModelConfig, load_model
from nibblekv.model.gated_deltanet import TorchGatedDeltaRule, chunked_gated_delta_rule
from nibblekv.model.hybrid import HybridCausalLM

transformers = pytest.importorskip("transformers")

# 4 layers, 3 linear + 1 full; value heads twice the key heads (grouped values); head_dim 32 with a quarter rotated
TINY: dict[str, Any] = {
    "vocab_size": 300, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6, "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
    "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4, "full_attention_interval": 4,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
}  # fmt: skip
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3_next": ("Qwen3NextConfig", {"num_experts": 0}),
    "qwen3_5": ("Qwen3_5TextConfig", {}),
}


def _hf_model(name: str) -> Any:
    cls_name, extra = CASES[name]
    config = getattr(transformers, cls_name)(**{**TINY, **extra})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():  # norms, decays and conv randomised so that a skipped or misread one shows
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.copy_(0.2 * torch.randn_like(p) + (1.0 if "linear_attn.norm" in pname else 0.0))
            elif pname.endswith(("dt_bias", "A_log")):
                p.copy_(0.5 * torch.randn_like(p))
            elif "conv1d" in pname:
                p.copy_(0.3 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Any, HybridCausalLM]:
    hf = _hf_model(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(str(folder))
    ours, _ = load_model(str(folder), load_format="safetensors", dtype=torch.float32)
    assert isinstance(ours, HybridCausalLM)
    return hf, ours


def test_logits_match_transformers(pair: tuple[Any, HybridCausalLM]) -> None:
    hf, ours = pair
    ids = torch.randint(3, 200, (1, 150), generator=torch.Generator().manual_seed(1))  # > one 64-token chunk
    with torch.no_grad():
        ref = hf(ids).logits[0]
        hidden = ours(ids[0], torch.arange(150), DenseAttention.single(150))
        got = ours.compute_logits(hidden)
    assert torch.allclose(got, ref, atol=2e-4, rtol=1e-4), (got - ref).abs().max()


def test_greedy_tokens_match_transformers(pair: tuple[Any, HybridCausalLM]) -> None:
    """Our engine (paged bf16 ... here fp32 KV, state pool, decode path) vs HF's generate, greedy."""
    from nibblekv import Engine, SamplingParams

    hf, ours = pair
    prompt = [5, 17, 42, 99, 7, 3, 150, 11]
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)[
            0, len(prompt) :
        ].tolist()
    eng = Engine(loaded=(ours, _tokenizer(ours)), device="cpu", kv_cache_dtype="auto", max_total_tokens=1024)
    out = eng.generate(prompt, SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True))[0]
    assert out.token_ids == ref


def _tokenizer(model: HybridCausalLM) -> Any:
    from nibblekv.model import ByteTokenizer

    return ByteTokenizer(model.config.vocab_size)


def test_qwen3_5_vision_language_checkpoint_loads(tmp_path: Path) -> None:
    """A published Qwen3.5 folder: decoder under ``model.language_model.``, a vision tower and an MTP head
    beside it (skipped), the decoder's config in ``text_config``."""
    from safetensors.torch import save_file

    hf = _hf_model("qwen3_5")
    tensors = {
        n.replace("model.", "model.language_model.", 1): p.detach().contiguous()
        for n, p in hf.state_dict().items()
    }
    tensors |= {
        "model.visual.blocks.0.attn.qkv.weight": torch.zeros(4, 4),
        "mtp.fc.weight": torch.zeros(4, 4),
    }
    save_file(tensors, str(tmp_path / "model.safetensors"))
    text = {**TINY, "model_type": "qwen3_5_text"}
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_5", "text_config": text}))
    ours, _ = load_model(str(tmp_path), load_format="safetensors", dtype=torch.float32)
    ids = torch.tensor([[5, 9, 77, 3, 41, 8]])
    with torch.no_grad():
        ref = hf(ids).logits[0]
        got = ours.compute_logits(ours(ids[0], torch.arange(6), DenseAttention.single(6)))
    assert torch.allclose(got, ref, atol=2e-4, rtol=1e-4)


def test_chunked_rule_equals_recurrent() -> None:
    gen = torch.Generator().manual_seed(0)
    h, length, dk, dv = 3, 150, 16, 8
    q = torch.nn.functional.normalize(torch.randn(h, length, dk, generator=gen), dim=-1) * dk**-0.5
    k = torch.nn.functional.normalize(torch.randn(h, length, dk, generator=gen), dim=-1)
    v = torch.randn(h, length, dv, generator=gen)
    g = -torch.rand(h, length, generator=gen)
    beta = torch.rand(h, length, generator=gen)
    s0 = torch.randn(h, dk, dv, generator=gen)
    o_rec, s_rec = recurrent_gated_delta_rule(q, k, v, g, beta, s0)
    for chunk in (16, 64):
        o_chk, s_chk = chunked_gated_delta_rule(q, k, v, g, beta, s0, chunk=chunk)
        assert torch.allclose(o_chk, o_rec, atol=1e-4), (o_chk - o_rec).abs().max()
        assert torch.allclose(s_chk, s_rec, atol=1e-4)


def test_extend_then_decode_equals_one_extend() -> None:
    """A prefix as one extend (the chunked rule), its last token as a decode step on a state pool (in place,
    at slot 2): the same outputs and state as one extend."""
    gen = torch.Generator().manual_seed(2)
    rule = TorchGatedDeltaRule()
    t, hk, hv, dk, dv = 20, 2, 4, 16, 8
    q, k = torch.randn(t, hk, dk, generator=gen), torch.randn(t, hk, dk, generator=gen)
    v = torch.randn(t, hv, dv, generator=gen)
    a, b = torch.randn(t, hv, generator=gen), torch.randn(t, hv, generator=gen)
    A_log, dt_bias = torch.rand(hv, generator=gen), torch.randn(hv, generator=gen)
    g, beta = decay_and_beta(a, b, A_log, dt_bias)
    s0 = torch.zeros(1, hv, dk, dv)
    o_all, s_all = rule.extend(q, k, v, g, beta, [0, t], s0)
    o_pre, s_pre = rule.extend(q[:-1], k[:-1], v[:-1], g[:-1], beta[:-1], [0, t - 1], s0)
    pool = torch.zeros(3, hv, dk, dv)
    pool[2] = s_pre[0]
    slot = torch.tensor([2])
    o_last = gated_delta_rule_decode(q[-1:], k[-1:], v[-1:], a[-1:], b[-1:], A_log, dt_bias, pool, slot)
    assert torch.allclose(torch.cat([o_pre, o_last]), o_all, atol=1e-5)
    assert torch.allclose(pool[2], s_all[0], atol=1e-5)


def test_config_layer_pattern_and_kv_layers() -> None:
    raw = {**TINY, "model_type": "qwen3_next", "num_experts": 0, "num_hidden_layers": 8}
    cfg = ModelConfig.from_hf(raw)
    assert cfg.is_hybrid and cfg.kv_layer_ids == (3, 7) and cfg.num_linear_layers == 6
    assert cfg.rotary_dim == 8 and cfg.qk_norm
    explicit = ModelConfig.from_hf({**raw, "layer_types": ["full_attention", "linear_attention"] * 4})
    assert explicit.kv_layer_ids == (0, 2, 4, 6)
    # Qwen3.5's published layout: the decoder's fields nested in text_config
    nested = ModelConfig.from_hf(
        {"model_type": "qwen3_5", "text_config": {**TINY, "model_type": "qwen3_5_text"}}
    )
    assert nested.architecture == "qwen3_5" and nested.num_kv_layers == 1
    # --json-model-override-args lands on the top level and wins over text_config
    deeper = ModelConfig.from_hf({"model_type": "qwen3_5", "text_config": TINY, "num_hidden_layers": 8})
    assert deeper.num_layers == 8 and deeper.kv_layer_ids == (3, 7)
    la = nested.linear_attention
    assert la is not None and la.conv_dim == 2 * 2 * 16 + 4 * 8
    per_layer = 4 * 16 * 8 * 4 + la.conv_dim * 3 * 2  # fp32 recurrent + bf16 conv window
    assert nested.state_bytes_per_request(torch.bfloat16) == 3 * per_layer


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ({**TINY, "model_type": "qwen3_next"}, "mixture-of-experts"),  # HF's default num_experts is 512
        ({**TINY, "model_type": "qwen3_next", "num_experts": 8}, "num_experts=8"),
        ({**TINY, "model_type": "qwen3_5_moe_text", "num_experts": 8}, "mixture-of-experts"),
        ({"model_type": "qwen3_5_moe", "text_config": {**TINY, "num_experts": 8}}, "mixture-of-experts"),
        ({**TINY, "model_type": "qwen3_5", "layer_types": ["sliding_attention"] * 4}, "layer_types"),
    ],
)
def test_unsupported_hybrid_configs_are_refused(raw: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_hf(raw)


def test_dense_qwen3_next_with_mlp_only_layers_is_accepted() -> None:
    cfg = ModelConfig.from_hf(
        {**TINY, "model_type": "qwen3_next", "num_experts": 8, "mlp_only_layers": [0, 1, 2, 3]}
    )
    assert cfg.is_hybrid


def test_dummy_load_and_qwen3_5_checkpoint_names(tmp_path: Path) -> None:
    """``--load-format dummy`` from a config; a Qwen3.5 vision-language checkpoint's decoder names load."""
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps({"model_type": "qwen3_5", "text_config": {**TINY, "model_type": "qwen3_5_text"}})
    )
    model, _ = load_model(str(path), load_format="dummy", dtype=torch.float32)
    assert isinstance(model, HybridCausalLM)
    with torch.no_grad():
        h = model(torch.tensor([5, 6, 7]), torch.arange(3), DenseAttention.single(3))
    assert torch.isfinite(h).all()
    from nibblekv.model.hybrid import hybrid_checkpoint_name

    assert hybrid_checkpoint_name("model.language_model.layers.0.linear_attn.in_proj_qkv.weight") == (
        "model.layers.0.linear_attn.in_proj_qkv.weight"
    )
    assert hybrid_checkpoint_name("model.visual.blocks.0.attn.qkv.weight") is None
    assert hybrid_checkpoint_name("mtp.fc.weight") is None


def test_forward_over_a_cache_backend_needs_the_states() -> None:
    """Without the engine's LinearStateBatch a cache backend's chunks would restart the linear layers from zeros:
    refused, not silently wrong."""
    from nibblekv.attention.paged import PagedAttentionBackend

    model = HybridCausalLM(ModelConfig.from_hf({**TINY, "model_type": "qwen3_5"})).float()
    backend = object.__new__(PagedAttentionBackend)  # never reached: the guard comes first
    with pytest.raises(ValueError, match="LinearStateBatch"):
        model(torch.arange(4), torch.arange(4), backend)


def test_cu_seqlens_tensors_are_made_once_per_batch_shape() -> None:
    """fla-core's chunked kernel takes the batch's bounds on the device and on the CPU: every linear layer
    of a forward gets the same two tensors (one host -> device copy a forward, not one a layer)."""
    from nibblekv.model.gated_deltanet import cu_seqlens_tensors

    dev, cpu = cu_seqlens_tensors((0, 3, 9), torch.device("cpu"))
    assert dev.tolist() == cpu.tolist() == [0, 3, 9] and dev.dtype == cpu.dtype == torch.long
    assert cu_seqlens_tensors((0, 3, 9), torch.device("cpu"))[0] is dev
