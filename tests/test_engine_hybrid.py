"""The engine on a tiny random hybrid (Gated DeltaNet + gated attention) model: continuous batching, chunked
prefill, preemption and abort with the linear-attention state pool; KV dtypes fp32 and nvfp4."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from nibblekv import Engine, SamplingParams
from nibblekv.engine.cuda_graph import CudaGraphRunner
from nibblekv.model import ByteTokenizer, DenseAttention, ModelConfig, load_model
from nibblekv.model.fp8 import Fp8Linear, QuantMethod, quantize_model
from nibblekv.model.hybrid import HybridCausalLM

TINY: dict[str, Any] = {
    "model_type": "qwen3_5", "vocab_size": 300, "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4, "full_attention_interval": 4, "partial_rotary_factor": 0.25,
    "rope_theta": 10000.0, "eos_token_id": 2,
}  # fmt: skip
PROMPTS = [[5 + (7 * i + 3 * j) % 250 for j in range(n)] for i, n in enumerate((40, 9, 70, 23))]
GREEDY = SamplingParams(max_new_tokens=10, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def model() -> HybridCausalLM:
    lm = HybridCausalLM(ModelConfig.from_hf(TINY)).float()
    lm.init_dummy(seed=0, std=0.2)  # larger weights than dummy's 0.02: logits with clear winners
    return lm.eval()


@pytest.fixture(scope="module")
def reference(model: HybridCausalLM) -> list[list[int]]:
    """24 greedy tokens per prompt by whole-sequence forwards (no cache, no state pool)."""
    out = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = list(prompt)
            for _ in range(24):
                h = model(torch.tensor(ids), torch.arange(len(ids)), DenseAttention.single(len(ids)))
                ids.append(int(model.compute_logits(h[-1:]).argmax()))
            out.append(ids[len(prompt) :])
    return out


def _engine(model: HybridCausalLM, **kw: Any) -> Engine:
    opts: dict[str, Any] = {"device": "cpu", "max_total_tokens": 2048, "decode_log_interval": 0, **kw}
    return Engine(loaded=(model, ByteTokenizer(300)), **opts)


def _no_leak(engine: Engine) -> None:
    assert engine.states is not None and engine.states.num_used == 0
    assert engine.pool.used_tokens() == 0


def test_batched_chunked_generation_equals_reference(
    model: HybridCausalLM, reference: list[list[int]], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="nibblekv"):
        engine = _engine(model, chunked_prefill_size=16)  # prompts span several chunks, carried in the state
    assert "32 slots + 32 prefix-cache snapshots (+1 scratch)" in caplog.text
    outs = engine.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == [r[:10] for r in reference]
    _no_leak(engine)


def test_preemption_recomputes_state(model: HybridCausalLM, reference: list[list[int]]) -> None:
    tiny = _engine(model, max_total_tokens=112, chunked_prefill_size=32, page_size=16)
    outs = tiny.generate(PROMPTS, SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True))
    assert tiny.scheduler.num_preemptions > 0
    assert [o.token_ids for o in outs] == reference
    _no_leak(tiny)


def test_abort_frees_the_state_slot_and_slots_are_reused(
    model: HybridCausalLM, reference: list[list[int]]
) -> None:
    engine = _engine(model, max_running_requests=2)
    rid = engine.add_request(PROMPTS[2], SamplingParams(max_new_tokens=50, ignore_eos=True))
    engine.step()
    assert engine.states is not None and engine.states.num_used == 1
    engine.abort(rid)
    _no_leak(engine)
    # 4 requests through 2 slots, each starting from a zeroed state: same tokens as alone
    outs = engine.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == [r[:10] for r in reference]
    _no_leak(engine)


def test_nvfp4_kv_stays_close(model: HybridCausalLM) -> None:
    """Every KV token in NVFP4 (no bf16 window or sink): prompt log-probs close to the fp32-KV engine's."""
    params = SamplingParams(max_new_tokens=1, prompt_logprobs=0)
    exact = _engine(model).generate(PROMPTS, params)
    quant = _engine(model, kv_cache_dtype="nvfp4", kv_recent_window=0, kv_sink_pages=0).generate(
        PROMPTS, params
    )
    for a, b in zip(exact, quant):
        assert a.prompt_logprobs is not None and b.prompt_logprobs is not None
        la = torch.tensor([lp.logprob for lp in a.prompt_logprobs])
        lb = torch.tensor([lp.logprob for lp in b.prompt_logprobs])
        assert not torch.equal(la, lb)  # the quantized path really ran
        assert (la - lb).abs().mean() < 0.05, (la - lb).abs().mean()


def test_kv_pool_holds_only_full_attention_layers(model: HybridCausalLM) -> None:
    engine = _engine(model)
    assert engine.pool.spec.num_layers == 1
    # one slot per running request, as many prefix-cache snapshots and the scratch slot of CUDA graphs'
    # padding rows (the last)
    assert engine.states is not None and engine.states.conv.shape[:2] == (3, 2 * engine.max_running + 1)
    assert engine.states.scratch_slot == 2 * engine.max_running
    off = _engine(model, disable_radix_cache=True)
    assert off.states is not None and off.states.conv.shape[:2] == (3, off.max_running + 1)


def test_padded_graph_buffers_keep_each_request_state(
    model: HybridCausalLM, reference: list[list[int]]
) -> None:
    """The CUDA-graph decode path, run eagerly on its static buffers (``capture=False``): 3 then 2 then 1
    requests replay the 4-row buffers, the padding rows reading and writing the scratch state slot, never a
    running request's; the greedy tokens are the cache-free reference's."""
    engine = _engine(model, max_running_requests=4)
    r = engine.runner
    r.graphs = CudaGraphRunner(
        r.model, r.backend, engine.pool, r.page_table, [1, 2, 4], capture=False, states=engine.states
    )
    assert engine.states is not None
    scratch = engine.states.recurrent[:, engine.states.scratch_slot].clone()
    lens = (24, 6, 15)
    outs = engine.generate(PROMPTS[:3], [SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True)
                                         for n in lens])  # fmt: skip
    assert r.last_used_graph
    assert [o.token_ids for o in outs] == [ref[:n] for ref, n in zip(reference, lens)]
    assert not torch.equal(engine.states.recurrent[:, engine.states.scratch_slot], scratch)  # padding ran
    _no_leak(engine)


@pytest.mark.parametrize(("input_len", "gib"), [(32768, 70.0), (163840, 70.0), (1048576, 70.0)])
@pytest.mark.parametrize("kv", ["bf16", "fp8_e4m3", "nvfp4"])
@pytest.mark.parametrize("ssm", [None, "bfloat16"])
def test_planner_resident_requests_match_the_engine_for_qwen35_27b(
    input_len: int, gib: float, kv: str, ssm: str | None
) -> None:
    """``nibblekv plan`` and the engine's pool sizing agree for the hybrid preset: KV for 16 of 64 layers,
    each request's 147 MiB of linear-attention state (75 MiB with ``--mamba-ssm-dtype bfloat16``) paid from
    the same budget."""
    from types import SimpleNamespace

    from nibblekv.config import EngineConfig
    from nibblekv.engine.setup import resident_capacity
    from nibblekv.formats import KVDtype
    from nibblekv.model.presets import PRESETS
    from nibblekv.planner.engine_fit import EngineOptions, resident_requests
    from nibblekv.planner.shape import shape_from_config

    name, page = "qwen3.5-27b", 16
    context = input_len + 1024 + page
    per_request = (-(-(input_len + 1024) // page) + 1) * page
    model = SimpleNamespace(
        config=ModelConfig.from_hf(PRESETS[name]), dtype=torch.bfloat16, device=torch.device("cpu")
    )
    cfg = EngineConfig(
        kv_cache_dtype=kv, mem_budget_gib=gib, chunked_prefill_size=8192, mamba_ssm_dtype=ssm
    )
    engine_n = resident_capacity(cfg, model, per_request, context)  # type: ignore[arg-type]
    opts = EngineOptions(page_size=page, kv_recent_window=cfg.kv_recent_window, chunked_prefill_size=8192)
    shape = shape_from_config({**PRESETS[name], **({"mamba_ssm_dtype": ssm} if ssm else {})}, name)
    assert (
        shape.num_kv_layers == 16
        and shape.state_bytes_per_request == model.config.state_bytes_per_request(torch.bfloat16, ssm)
        and shape.state_bytes_per_request == 48 * (48 * 128 * 128 * (2 if ssm else 4) + 10240 * 3 * 2)
    )
    assert resident_requests(shape, KVDtype(kv), int(gib * (1 << 30)), per_request, context, opts) == engine_n
    assert engine_n >= 1


def test_bf16_recurrent_state_serves_close_to_fp32(
    model: HybridCausalLM, caplog: pytest.LogCaptureFixture
) -> None:
    """``--mamba-ssm-dtype bfloat16``: the pool holds half the recurrent bytes; the states are stepped in
    float32 and rounded once a step, so decoding stays close to the float32 pool (log-probs of its tokens)."""
    params = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True, logprobs=0)
    exact = _engine(model).generate(PROMPTS, params)
    with caplog.at_level(logging.INFO, logger="nibblekv"):
        engine = _engine(model, mamba_ssm_dtype="bfloat16", chunked_prefill_size=16)
    assert "recurrent state bfloat16" in caplog.text
    assert engine.states is not None and engine.states.recurrent.dtype == torch.bfloat16
    assert engine.states.nbytes < _engine(model).states.nbytes  # type: ignore[union-attr]
    half = engine.generate(PROMPTS, params)
    for a, b in zip(exact, half):
        assert a.logprobs is not None and b.logprobs is not None
        la = torch.tensor([x.logprob for x in a.logprobs])
        lb = torch.tensor([x.logprob for x in b.logprobs])
        if a.token_ids == b.token_ids:
            assert (la - lb).abs().max() < 0.05, (la - lb).abs().max()
    assert sum(a.token_ids == b.token_ids for a, b in zip(exact, half)) >= 3
    _no_leak(engine)


def test_mamba_ssm_dtype_is_checked() -> None:
    from nibblekv.config import EngineConfig

    with pytest.raises(ValueError, match="--mamba-ssm-dtype must be one of float32, bfloat16, float16"):
        EngineConfig(mamba_ssm_dtype="int8")
    with pytest.raises(ValueError, match="mamba_ssm_dtype 'fp8' is not one of"):
        ModelConfig.from_hf({**TINY, "mamba_ssm_dtype": "fp8"})
    la = ModelConfig.from_hf({**TINY, "mamba_ssm_dtype": "bfloat16"}).linear_attention
    assert la is not None and la.ssm_dtype == "bfloat16"


def test_plan_cli_json_for_the_hybrid_preset(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from nibblekv.cli import main

    assert main(["plan", "--model", "qwen3.5-27b", "--gpu", "H200", "--context", "262144", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    model = doc["model"]
    assert (model["num_layers"], model["num_kv_layers"]) == (64, 16)
    assert model["values_per_token"] == 2 * 16 * 4 * 256
    # per linear layer: fp32 [48, 128, 128] state + bf16 [10240, 3] conv window; 48 linear layers
    assert model["state_bytes_per_request"] == 48 * (48 * 128 * 128 * 4 + 10240 * 3 * 2)
    kv = doc["kv"]["nvfp4"]
    assert kv["gib_per_session"] == pytest.approx(
        (kv["bytes_per_token"] * 262144 + model["state_bytes_per_request"]) / 2**30
    )
    assert doc["engine"]["requests"]["nvfp4"] >= 1.7 * doc["engine"]["requests"]["fp8_e4m3"]
    argv = ["plan", "--model", "qwen3.5-27b", "--gpu", "H200", "--context", "262144", "--json"]
    assert main([*argv, "--mamba-ssm-dtype", "bfloat16"]) == 0
    half = json.loads(capsys.readouterr().out)
    assert half["model"]["state_bytes_per_request"] == 48 * (48 * 128 * 128 * 2 + 10240 * 3 * 2)


def test_quantization_fp8_serves_hybrid_layers(tmp_path: Path) -> None:
    """``--quantization fp8`` on a hybrid model: attention, DeltaNet and MLP projections in FP8 (the beta /
    decay-gate projections stay in the model dtype). Logits within 20% (relative L2) of the fp32 twin's
    (e4m3's ~3.7% per layer compounds over 4 random layers: 12.9% measured); the engine serves the FP8
    model as its own whole-sequence forward computes it.

    NOTE: smaller weights than the module's fixture (std 0.05, not 0.2): at 0.2 the random recurrences
    amplify any rounding (0.40 relative L2 for FP8, a model without clear winners)."""
    ref = HybridCausalLM(ModelConfig.from_hf(TINY)).float()
    ref.init_dummy(seed=0, std=0.05)
    fp8 = copy.deepcopy(ref.eval())
    quantize_model(fp8)
    attn = next(layer.self_attn for layer in fp8.model.layers if layer.self_attn is not None)
    delta = next(layer.linear_attn for layer in fp8.model.layers if layer.linear_attn is not None)
    assert isinstance(attn.qkv_proj, Fp8Linear) and isinstance(attn.o_proj, Fp8Linear)
    assert isinstance(delta.out_proj, Fp8Linear) and isinstance(fp8.model.layers[0].mlp.down_proj, Fp8Linear)
    fp8_in = [n for n, m in delta.named_children() if n.startswith("in_proj") and isinstance(m, Fp8Linear)]
    assert fp8_in in (["in_proj_qkvz"], ["in_proj_qkv", "in_proj_z"])
    assert not isinstance(delta.in_proj_b if hasattr(delta, "in_proj_b") else delta.in_proj_ba, Fp8Linear)
    ids, n = torch.tensor(PROMPTS[2]), len(PROMPTS[2])
    with torch.no_grad():
        want = ref.compute_logits(ref(ids, torch.arange(n), DenseAttention.single(n)))
        got = fp8.compute_logits(fp8(ids, torch.arange(n), DenseAttention.single(n)))
    assert ((got - want).norm() / want.norm()).item() < 0.2
    # the engine (chunked prefill, the state pool, fp32 KV) on the FP8 model: its own forward's log-probs
    out = _engine(fp8, chunked_prefill_size=32).generate(
        [PROMPTS[2]], SamplingParams(max_new_tokens=1, prompt_logprobs=0)
    )[0]
    assert out.prompt_logprobs is not None
    served = torch.tensor([lp.logprob for lp in out.prompt_logprobs])
    own = torch.log_softmax(got.float(), -1)[torch.arange(n - 1), ids[1:]]
    torch.testing.assert_close(served[-len(own) :], own, rtol=0, atol=2e-3)
    # and the loader's --quantization fp8 path for the same architecture (dummy weights)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    loaded, _ = load_model(str(path), load_format="dummy", quantization=QuantMethod.FP8)
    # 4 MLPs, 3 DeltaNets (their in_proj layers + out_proj), 1 gated attention (qkv, o)
    assert sum(isinstance(m, Fp8Linear) for m in loaded.modules()) == 4 * 2 + 3 * (len(fp8_in) + 1) + 2


def test_block_fp8_checkpoint_of_a_hybrid_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Qwen3.5-style FP8 checkpoint (``quant_method: fp8``, 128x128 blocks, ``weight_scale_inv``, the
    DeltaNet's beta / gate projections and the norms in ``modules_to_not_convert``): FP8 codes and scales
    load bit for bit into the fused layers, the model runs close to its dequantized twin, the engine serves
    it."""
    from safetensors.torch import save_file

    from nibblekv.formats.fp8_weights import dequantize_weight, quantize_weight_block
    from nibblekv.model import loader

    byte_tokenizer = staticmethod(lambda folder, eos: ByteTokenizer(300))
    monkeypatch.setattr(loader.HFTokenizer, "from_folder", byte_tokenizer)
    cfg = {**TINY, "num_key_value_heads": 4, "intermediate_size": 128}  # fused parts on 128-row blocks
    src = HybridCausalLM(ModelConfig.from_hf(cfg)).float()
    src.init_dummy(seed=1, std=0.05)
    c = src.config
    parts = {"qkv_proj": ("q_proj", 2 * c.q_size, "k_proj", c.kv_size, "v_proj", c.kv_size),
             "gate_up_proj": ("gate_proj", c.intermediate_size, "up_proj", c.intermediate_size)}  # fmt: skip
    hf: dict[str, torch.Tensor] = {}
    for name, p in src.state_dict().items():
        fused = next((f for f in parts if f".{f}." in name), None)
        if fused is None:
            hf[name] = p.contiguous()
            continue
        split, start = parts[fused], 0
        for sub, rows in zip(split[::2], split[1::2]):
            hf[name.replace(fused, sub)] = p[start : start + rows].contiguous()
            start += rows
    fp8_mods = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "in_proj_qkv",
                "in_proj_z", "out_proj")  # fmt: skip
    tensors, dequant = {}, {}
    for name, t in hf.items():
        if name.endswith(".weight") and name.rsplit(".", 2)[1] in fp8_mods:
            q, s = quantize_weight_block(t, 128)
            tensors[name], tensors[name.replace(".weight", ".weight_scale_inv")] = q, s
            dequant[name] = dequantize_weight(q, s, 128)
        else:
            tensors[name] = t
    deltanet_gates = (f"model.layers.{i}.linear_attn.in_proj_{x}" for i in range(3) for x in "ab")
    not_converted = ["lm_head", "model.layers.0.input_layernorm", *deltanet_gates]
    qc = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
          "weight_block_size": [128, 128], "modules_to_not_convert": not_converted}  # fmt: skip
    fp8_cfg = {**cfg, "quantization_config": qc}
    twins = ((tmp_path / "fp8", tensors, fp8_cfg), (tmp_path / "ref", {**hf, **dequant}, cfg))
    for folder, files, config in twins:
        folder.mkdir()
        save_file(files, str(folder / "model.safetensors"))
        (folder / "config.json").write_text(json.dumps(config))
    model, _ = load_model(str(tmp_path / "fp8"), dtype=torch.float32)
    ref, _ = load_model(str(tmp_path / "ref"), dtype=torch.float32)
    attn = model.model.layers[3].self_attn
    delta = model.model.layers[0].linear_attn
    assert isinstance(attn.qkv_proj, Fp8Linear) and attn.qkv_proj.block == 128
    assert isinstance(delta.in_proj_qkv, Fp8Linear) and not isinstance(delta.in_proj_a, Fp8Linear)
    want = torch.cat([dequant[f"model.layers.3.self_attn.{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(dequantize_weight(attn.qkv_proj.weight, attn.qkv_proj.weight_scale, 128), want)
    ids, n = torch.tensor(PROMPTS[1]), len(PROMPTS[1])
    with torch.no_grad():
        got = model.compute_logits(model(ids, torch.arange(n), DenseAttention.single(n)))
        exp = ref.compute_logits(ref(ids, torch.arange(n), DenseAttention.single(n)))
    rel = ((got - exp).norm() / exp.norm()).item()
    assert 0 < rel < 0.1, rel  # activations rounded to e4m3: the error left
    out = _engine(model, kv_cache_dtype="nvfp4").generate(PROMPTS[:2], GREEDY)
    assert all(len(o.token_ids) == GREEDY.max_new_tokens for o in out)
