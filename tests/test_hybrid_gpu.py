"""CUDA-only checks of hybrid models: fla-core's chunked gated-delta-rule kernel and the in-place decode
kernels against the torch twins, and the engine at head_dim 256 (the published models' attention heads)
with bf16 and nvfp4 KV."""

from __future__ import annotations

from typing import Any

import pytest
import torch

# fla-core itself is checked by the fixtures (importorskip): a CUDA machine without it skips too
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# Qwen3.5-shaped attention (head_dim 256, 4 KV heads, GQA 6, a quarter rotated) on a few small layers
CONFIG: dict[str, Any] = {
    "model_type": "qwen3_5", "vocab_size": 512, "hidden_size": 256, "intermediate_size": 512,
    "num_hidden_layers": 4, "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "linear_num_key_heads": 4,
    "linear_num_value_heads": 8, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4, "full_attention_interval": 4, "partial_rotary_factor": 0.25,
    "rope_theta": 10000000.0, "eos_token_id": 2,
}  # fmt: skip


@pytest.fixture(scope="module")
def fla_rule() -> Any:
    pytest.importorskip("fla")
    from nibblekv.model.gated_deltanet import FlaGatedDeltaRule

    return FlaGatedDeltaRule()


def _inputs(t: int, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    hk, hv, dk, dv = 4, 8, 128, 128
    q = torch.randn(t, hk, dk, generator=gen, device="cuda").to(dtype)
    k = torch.randn(t, hk, dk, generator=gen, device="cuda").to(dtype)
    v = torch.randn(t, hv, dv, generator=gen, device="cuda").to(dtype)
    g = -torch.rand(t, hv, generator=gen, device="cuda") * 0.5
    beta = torch.rand(t, hv, generator=gen, device="cuda").to(dtype)
    return q, k, v, g, beta


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fla_extend_matches_the_torch_twin(fla_rule: Any, dtype: torch.dtype) -> None:
    from nibblekv.model.gated_deltanet import TorchGatedDeltaRule

    twin = TorchGatedDeltaRule()
    cu = [0, 1, 70, 200, 203]  # lengths 1, 69, 130, 3: within, across and past one 64-token chunk
    q, k, v, g, beta = _inputs(cu[-1], dtype)
    s0 = torch.randn(4, 8, 128, 128, device="cuda") * 0.1
    o_ref, s_ref = twin.extend(q, k, v, g, beta, cu, s0)
    o, s = fla_rule.extend(q, k, v, g, beta, cu, s0)
    tol = 1e-2 if dtype == torch.float32 else 5e-2  # fp32 dots run as TF32 in the kernels
    assert torch.allclose(o.float(), o_ref.float(), atol=tol, rtol=tol), (
        (o.float() - o_ref.float()).abs().max()
    )
    assert torch.allclose(s, s_ref, atol=tol, rtol=tol), (s - s_ref).abs().max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_kernels_match_the_twins_at_qwen35_heads(dtype: torch.dtype) -> None:
    """The in-place conv and gated-delta-rule decode kernels at Qwen3.5-27B's linear heads (16 key heads, 48
    value heads of 128), 5 requests on a 9-slot pool, against their twins; other slots untouched."""
    from nibblekv.kernels.linear.decode import conv_decode_triton, gated_delta_rule_decode_triton
    from nibblekv.kernels.linear.reference import conv_decode_ref, gated_delta_rule_decode_ref
    from nibblekv.kernels.testing import rel_rms

    gen = torch.Generator(device="cuda").manual_seed(3)
    n, h, hv, d, c = 5, 16, 48, 128, 2 * 16 * 128 + 48 * 128
    slots = torch.tensor([7, 0, 3, 8, 1], device="cuda")
    x = torch.randn(n, c, generator=gen, device="cuda").to(dtype)
    weight = torch.randn(c, 4, generator=gen, device="cuda").to(dtype)
    conv = torch.randn(9, c, 3, generator=gen, device="cuda").to(dtype)
    conv_ref = conv.clone()
    y = conv_decode_triton(x, weight, conv, slots)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert rel_rms(y, conv_decode_ref(x, weight, conv_ref, slots)) < tol
    assert torch.equal(conv, conv_ref)
    q, k, v = y.split([h * d, h * d, hv * d], dim=-1)
    q, k, v = q.reshape(n, h, d), k.reshape(n, h, d), v.reshape(n, hv, d)
    a, b = (torch.randn(n, hv, generator=gen, device="cuda").to(dtype) for _ in range(2))
    A_log, dt_bias = torch.rand(hv, device="cuda"), torch.randn(hv, device="cuda").to(dtype)
    state = torch.randn(9, hv, d, d, generator=gen, device="cuda") * 0.05
    state_ref = state.clone()
    o = gated_delta_rule_decode_triton(q, k, v, a, b, A_log, dt_bias, state, slots)
    o_ref = gated_delta_rule_decode_ref(q, k, v, a, b, A_log, dt_bias, state_ref, slots)
    assert rel_rms(o, o_ref) < (1e-4 if dtype == torch.float32 else 1e-2)
    assert rel_rms(state, state_ref) < 1e-4
    assert torch.equal(state[[2, 4, 5, 6]], state_ref[[2, 4, 5, 6]])


@pytest.fixture(scope="module")
def gpu_model() -> Any:
    pytest.importorskip("fla")
    from nibblekv.model import ModelConfig
    from nibblekv.model.hybrid import HybridCausalLM

    with torch.device("meta"):
        lm = HybridCausalLM(ModelConfig.from_hf(CONFIG))
    lm = lm.to(dtype=torch.bfloat16).to_empty(device="cuda").eval()
    lm.rotary.prepare(lm.device)
    lm.init_dummy(seed=0, std=0.05)
    return lm


def _ref_logits(model: Any, ids: list[int]) -> torch.Tensor:
    """float32 logits ``[len(ids), vocab]`` of one cache-free forward (fla's chunked kernel, SDPA)."""
    from nibblekv.model import DenseAttention

    with torch.no_grad():
        h = model(torch.tensor(ids, device="cuda"), torch.arange(len(ids), device="cuda"),
                  DenseAttention.single(len(ids)))  # fmt: skip
        return model.compute_logits(h).float().cpu()


def test_engine_head_dim_256_bf16_and_nvfp4(gpu_model: Any) -> None:
    """Chunked prefill over fla's kernels (the state carried across chunks), decode through the in-place
    decode kernels (in CUDA graphs) and the paged KV at head_dim 256 (GQA 6): each greedy token is the
    cache-free forward's argmax up to bf16 near-ties, and prompt log-probs agree; nvfp4 KV stays close to
    bf16."""
    from nibblekv import Engine, SamplingParams
    from nibblekv.model import ByteTokenizer

    prompts = [[5 + (11 * i + 7 * j) % 500 for j in range(n)] for i, n in enumerate((300, 17, 129))]
    opts: dict[str, Any] = {"device": "cuda", "max_total_tokens": 8192, "chunked_prefill_size": 128,
                            "decode_log_interval": 0}  # fmt: skip
    params = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True, prompt_logprobs=0)
    bf16 = Engine(loaded=(gpu_model, ByteTokenizer(512)), kv_cache_dtype="auto", **opts)
    outs = bf16.generate(prompts, params)
    for prompt, out in zip(prompts, outs):
        ref = _ref_logits(gpu_model, prompt + out.token_ids).log_softmax(-1)
        n = len(prompt)
        gaps = (
            ref[n - 1 : -1].max(-1).values
            - ref[n - 1 : -1].gather(1, torch.tensor(out.token_ids)[:, None])[:, 0]
        )
        assert gaps.max() < 0.1, gaps  # decode picked the reference's best token (or a bf16 tie)
        assert out.prompt_logprobs is not None
        got = torch.tensor([lp.logprob for lp in out.prompt_logprobs])
        want = ref[: n - 1].gather(1, torch.tensor(prompt[1:])[:, None])[:, 0]
        assert (got - want).abs().mean() < 0.05, (got - want).abs().mean()
    assert bf16.states is not None and bf16.states.num_used == 0
    assert bf16.runner.graphs is not None and bf16.runner.last_used_graph  # decode replayed CUDA graphs
    lp = SamplingParams(max_new_tokens=1, prompt_logprobs=0)
    exact = bf16.generate(prompts, lp)
    quant = Engine(loaded=(gpu_model, ByteTokenizer(512)), kv_cache_dtype="nvfp4", **opts).generate(
        prompts, lp
    )
    for a, b in zip(exact, quant):
        assert a.prompt_logprobs is not None and b.prompt_logprobs is not None
        la = torch.tensor([x.logprob for x in a.prompt_logprobs])
        lb = torch.tensor([x.logprob for x in b.prompt_logprobs])
        assert (la - lb).abs().mean() < 0.1, (la - lb).abs().mean()


@pytest.mark.parametrize("kv", ["auto", "nvfp4"])
def test_engine_prefix_hit_restores_the_state_snapshot(gpu_model: Any, kv: str) -> None:
    """A second turn (the first prompt, its answer, a new message) reuses the first prompt up to its state
    snapshot (fla's chunked kernel starting from the copied state, decode in CUDA graphs): each greedy token
    is the cache-free forward's argmax up to bf16 near-ties (nvfp4: its quantization error), and the first
    one's log-prob is the cache-free forward's."""
    from nibblekv import Engine, SamplingParams
    from nibblekv.model import ByteTokenizer

    opts: dict[str, Any] = {"device": "cuda", "max_total_tokens": 8192, "chunked_prefill_size": 128,
                            "decode_log_interval": 0, "kv_cache_dtype": kv}  # fmt: skip
    params = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True, logprobs=0)
    first = [5 + (11 * j) % 500 for j in range(300)]
    warm = Engine(loaded=(gpu_model, ByteTokenizer(512)), **opts)
    answer = warm.generate([first], params)[0].token_ids
    second = first + answer + [7 + (5 * j) % 400 for j in range(40)]
    out = warm.generate([second], params)[0]
    point = warm.scheduler.cache.snapshot_point(len(first))  # type: ignore[attr-defined]
    assert out.cached_tokens == point > 0
    ref = _ref_logits(gpu_model, second + out.token_ids).log_softmax(-1)
    n, tol = len(second), 0.1 if kv == "auto" else 0.3
    picked = ref[n - 1 : -1].gather(1, torch.tensor(out.token_ids)[:, None])[:, 0]
    assert (ref[n - 1 : -1].max(-1).values - picked).max() < tol
    assert out.logprobs is not None and abs(out.logprobs[0].logprob - float(picked[0])) < tol
    assert warm.states is not None and warm.states.num_used == 0
