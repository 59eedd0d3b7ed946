"""The accuracy options in the engine path: --kv-hadamard and --kv-quant-4over6 (phase 2 edits)."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest
import torch

from nibblekv.attention.paged import PagedAttentionBackend, PagedMetadata, hadamard_matrix
from nibblekv.cache import KVPool, PoolSpec
from nibblekv.config import EngineConfig, add_engine_args
from nibblekv.engine import Engine, SamplingParams
from nibblekv.formats import KVDtype, nvfp4
from nibblekv.formats.kv_view import TailDemotion
from nibblekv.formats.layer_kv import LayerKV
from nibblekv.formats.sm_words import to_sm
from nibblekv.kernels.reference import demote_pages_ref, write_kv_ref


def _spec(dtype: KVDtype, **kw: bool) -> PoolSpec:
    return PoolSpec(2, 2, 64, 4, dtype, KVDtype.FP32, 8, 4, 4, **kw)


def test_flags_reach_engine_config() -> None:
    p = argparse.ArgumentParser()
    add_engine_args(p)
    cfg = EngineConfig.from_args(p.parse_args(["--kv-hadamard", "--kv-quant-4over6"]))
    assert cfg.kv_hadamard and cfg.kv_quant_4over6
    d = EngineConfig.from_args(p.parse_args([]))
    assert d.kv_hadamard is None and d.kv_quant_4over6 is None  # the per-dtype default
    off = EngineConfig.from_args(p.parse_args(["--no-kv-hadamard", "--no-kv-quant-4over6"]))
    assert off.kv_hadamard is False and off.kv_quant_4over6 is False


def test_nvfp4_default_options_and_scales_file_check(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from nibblekv.cache.pool import load_kv_scales
    from nibblekv.engine.setup import resolve_kv_options

    def check_scales_file(path: str | None, hadamard: bool) -> None:
        load_kv_scales(path, 1, "cpu", hadamard)

    auto = EngineConfig()
    assert resolve_kv_options(auto, KVDtype.NVFP4, 64) == (True, True)
    assert resolve_kv_options(auto, KVDtype.NVFP4, 80) == (False, True)  # no Sylvester Hadamard of 80
    assert resolve_kv_options(auto, KVDtype.FP8, 128) == (False, False)
    assert resolve_kv_options(auto, KVDtype.BF16, 128) == (False, False)
    off = EngineConfig(kv_hadamard=False, kv_quant_4over6=False)
    assert resolve_kv_options(off, KVDtype.NVFP4, 64) == (False, False)
    assert resolve_kv_options(EngineConfig(kv_hadamard=True), KVDtype.FP8, 64) == (True, False)
    plain = tmp_path / "plain.json"
    plain.write_text('{"k_scale": [1.0], "v_scale": [1.0], "hadamard": false}')
    check_scales_file(str(plain), False)
    check_scales_file(None, True)
    with pytest.raises(ValueError, match="calibrated without the Hadamard rotation"):
        check_scales_file(str(plain), True)
    bare = tmp_path / "bare.json"  # a file from elsewhere (no "hadamard" field) is taken as is
    bare.write_text('{"k_scale": [1.0], "v_scale": [1.0]}')
    check_scales_file(str(bare), True)


def test_engine_nvfp4_pool_defaults(smollm2) -> None:  # type: ignore[no-untyped-def]
    kw = {"loaded": smollm2, "max_total_tokens": 256, "decode_log_interval": 0}
    nv = Engine(kv_cache_dtype="nvfp4", **kw)  # SmolLM2: head_dim 64
    assert nv.pool.spec.hadamard and nv.runner.backend.qkv_rotation is not None
    assert nv.pool.spec.four_over_six and nv.runner.backend.four_over_six
    assert "hadamard: True, 4over6: True" in nv.pool.startup_lines(4, 256)[0]
    fp8 = Engine(kv_cache_dtype="fp8_e4m3", **kw)
    assert not fp8.pool.spec.hadamard and fp8.runner.backend.qkv_rotation is None
    assert Engine(kv_cache_dtype="nvfp4", kv_hadamard=False, **kw).runner.backend.qkv_rotation is None


def test_rotating_engine_folds_o_proj_and_a_plain_engine_stays_exact(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # nvfp4's Hadamard rotation is folded into the model's o_proj (no un-rotation matmul per layer); a
    # bf16-cache engine sharing that model rotates its own attention output into the folded basis
    import json

    from test_engine_api import TINY

    from nibblekv.model import load_model

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TINY, "max_position_embeddings": 512}))
    tiny = load_model(str(path), load_format="dummy", device="cpu", seed=5)
    model = tiny[0]
    kw = {"loaded": tiny, "max_total_tokens": 512, "decode_log_interval": 0}
    prompts = [[5 + (i * 11 + j) % 200 for j in range(7 + 6 * i)] for i in range(3)]
    greedy = SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True, logprobs=1)
    plain = Engine(kv_cache_dtype="bf16", **kw)
    before = plain.generate(prompts, greedy)
    assert not model.output_rotation_folded
    w = model.model.layers[1].self_attn.o_proj.weight.clone()
    Engine(kv_cache_dtype="nvfp4", **kw)
    assert model.output_rotation_folded and not torch.equal(model.model.layers[1].self_attn.o_proj.weight, w)
    after = plain.generate(prompts, greedy)
    assert [o.token_ids for o in after] == [o.token_ids for o in before]
    for a, b in zip(after, before):
        got = torch.tensor([lp.logprob for lp in a.logprobs])
        want = torch.tensor([lp.logprob for lp in b.logprobs])
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_reference_write_and_demote_use_4over6() -> None:
    torch.manual_seed(0)
    layout = _spec(KVDtype.NVFP4).layout
    cache = LayerKV.allocate(layout, 4, "cpu")
    k, v = torch.randn(6, 2, 64) * 3, torch.randn(6, 2, 64)
    slots = torch.arange(4, 10)
    write_kv_ref(k, v, cache, slots, four_over_six=True)
    packed, scales = nvfp4.quantize(k, four_over_six=True)
    pages, offs = slots // 4, slots % 4
    assert torch.equal(cache.k_data[pages, :, offs], to_sm(packed)) and torch.equal(
        cache.k_scale[pages, :, offs].float(), scales.float()
    )
    plain = nvfp4.quantize(k)
    assert not torch.equal(plain[1].float(), scales.float())  # 4over6 changed some block scales
    tail = LayerKV.allocate(_spec(KVDtype.NVFP4).tail_layout, 3, "cpu")
    tail.k_data[1], tail.v_data[1] = k[:4].transpose(0, 1), v[:4].transpose(0, 1)
    demote_pages_ref(TailDemotion(tail, torch.tensor([1]), cache, torch.tensor([3])), four_over_six=True)
    assert torch.equal(cache.v_data[3], to_sm(nvfp4.quantize(v[:4].transpose(0, 1), four_over_six=True)[0]))


def _decode_out(spec: PoolSpec, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Write 3 tokens of one request into page 1 via decode steps and return the last step's output."""
    pool = KVPool(spec, "cpu", torch.ones(2, 2))
    backend = PagedAttentionBackend(pool)
    i32 = lambda x: torch.tensor(x, dtype=torch.int32)
    i64 = lambda x: torch.tensor(x, dtype=torch.int64)
    out = torch.empty(0)
    for t in range(3):
        meta = PagedMetadata(
            True,
            i32([[1]]),
            i32([t + 1]),
            i32([[0]]),
            i32([0]),
            i64([4 + t]),
            i64([-1]),
            None,
            i64([]),
            i64([]),
        )
        backend.bind(meta)
        out = backend.forward(0, q[t : t + 1], k[t : t + 1], v[t : t + 1])
    return out


def test_backend_hadamard_is_exact_unquantized_and_changes_nvfp4() -> None:
    torch.manual_seed(1)
    q, k, v = torch.randn(3, 4, 64), torch.randn(3, 2, 64), torch.randn(3, 2, 64)
    base = _decode_out(PoolSpec(2, 2, 64, 4, KVDtype.FP32, KVDtype.FP32, 8, 0, 0), q, k, v)
    rot = _decode_out(PoolSpec(2, 2, 64, 4, KVDtype.FP32, KVDtype.FP32, 8, 0, 0, hadamard=True), q, k, v)
    assert torch.allclose(rot, base, atol=1e-5)
    plain = _decode_out(PoolSpec(2, 2, 64, 4, KVDtype.NVFP4, KVDtype.FP32, 8, 0, 0), q, k, v)
    had = _decode_out(PoolSpec(2, 2, 64, 4, KVDtype.NVFP4, KVDtype.FP32, 8, 0, 0, hadamard=True), q, k, v)
    assert not torch.allclose(had, plain, atol=1e-4)
    assert torch.allclose(hadamard_matrix(64) @ hadamard_matrix(64), torch.eye(64), atol=1e-6)


def test_4over6_accepted_on_cuda() -> None:
    # the Triton write/demote kernels implement 4over6: the backend no longer refuses it on CUDA
    fake_pool = SimpleNamespace(spec=_spec(KVDtype.NVFP4, four_over_six=True), device=torch.device("cuda"))
    assert PagedAttentionBackend(fake_pool).four_over_six  # type: ignore[arg-type]


def _clone(c: LayerKV) -> LayerKV:
    assert c.k_scale is not None and c.v_scale is not None
    return LayerKV(c.layout, c.k_data.clone(), c.v_data.clone(), c.k_scale.clone(), c.v_scale.clone(),
                   c.global_scale.clone())  # fmt: skip


@pytest.mark.parametrize("kernels", ["reference", "triton"])
def test_backend_writes_and_demotes_4over6(kernels: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The backend passes 4over6 to the dispatching write/demote ops (triton: the interpreter on CPU)."""
    monkeypatch.setenv("NIBBLEKV_KERNELS", kernels)
    dev = "cuda" if kernels == "triton" and torch.cuda.is_available() else "cpu"
    torch.manual_seed(3)
    pool = KVPool(_spec(KVDtype.NVFP4, four_over_six=True), dev, torch.tensor([[0.5, 2.0], [1.0, 1.0]]))
    main, tail = pool.main[0], pool.tail[0]
    tail.k_data.copy_(torch.randn(tail.k_data.shape) * 3)
    tail.v_data.copy_(torch.randn(tail.v_data.shape))
    before = _clone(main)
    k, v = (torch.randn(3, 2, 64) * 3).to(dev), torch.randn(3, 2, 64).to(dev)
    i32 = lambda x: torch.tensor(x, dtype=torch.int32, device=dev)
    i64 = lambda x: torch.tensor(x, dtype=torch.int64, device=dev)
    slots, src, dst = i64([4, 6, -1]), i64([2]), i64([3])
    backend = PagedAttentionBackend(pool)
    # NOTE: an extend's metadata: a decode step with a tail writes only the tail (see PagedAttentionBackend._write)
    backend.bind(PagedMetadata(False, i32([[1, 3]]), i32([3]), i32([[0]]), i32([0]), slots, i64([-1, -1, 1]),
                               i32([0, 3]), src, dst))  # fmt: skip
    backend.demote_layer(0)
    backend._write(k, v, main, tail)
    want, plain = _clone(before), _clone(before)
    demote_pages_ref(TailDemotion(tail, src, want, dst), four_over_six=True)
    write_kv_ref(k, v, want, slots, four_over_six=True)
    demote_pages_ref(TailDemotion(tail, src, plain, dst))
    write_kv_ref(k, v, plain, slots)
    for got, exp, std in (
        (main.k_data, want.k_data, plain.k_data),
        (main.v_scale, want.v_scale, plain.v_scale),
    ):
        got, exp, std = got.view(torch.uint8), exp.view(torch.uint8), std.view(torch.uint8)
        assert torch.equal(got, exp)
        assert not torch.equal(got, std)  # the flag changed what is stored


@pytest.mark.slow
def test_engine_with_options(smollm2) -> None:  # type: ignore[no-untyped-def]
    prompt = smollm2[1].encode("The three primary colors are")
    params = SamplingParams(temperature=0, max_new_tokens=6, ignore_eos=True)
    kw = {"loaded": smollm2, "max_total_tokens": 512, "decode_log_interval": 0}
    ref = Engine(kv_cache_dtype="auto", **kw).generate([prompt], params)[0]
    # an unquantized cache stored rotated gives the same greedy tokens
    rot = Engine(kv_cache_dtype="auto", kv_hadamard=True, **kw)
    assert rot.pool.spec.hadamard and rot.generate([prompt], params)[0].token_ids == ref.token_ids
    both = Engine(kv_cache_dtype="nvfp4", kv_recent_window=0, kv_hadamard=True, kv_quant_4over6=True, **kw)
    assert both.pool.spec.four_over_six and both.runner.backend.four_over_six
    out = both.generate([prompt], params)[0]
    assert len(out.token_ids) == 6 and both.pool.all_free()


def test_gpu_pool_rejects_head_dims_the_kernels_cannot_take(monkeypatch: pytest.MonkeyPatch) -> None:
    """A head_dim the Triton kernels do not build for fails at start-up with the fix named, not with a
    Triton compile error in the first forward (as head_dim 16 did on 2x H200)."""
    from nibblekv.engine.setup import pool_spec
    from nibblekv.kernels import GPU_HEAD_DIMS, check_gpu_head_dim

    monkeypatch.delenv("NIBBLEKV_KERNELS", raising=False)
    model = SimpleNamespace(config=SimpleNamespace(head_dim=16), device=torch.device("cuda"))
    with pytest.raises(ValueError, match=r"head_dim 16 is not supported .*--device cpu"):
        pool_spec(EngineConfig(), model, 8)  # type: ignore[arg-type]
    for d in GPU_HEAD_DIMS:
        check_gpu_head_dim(d)
    with pytest.raises(ValueError, match="head_dim 80"):
        check_gpu_head_dim(80)


def test_cuda_graphs_cover_every_schedulable_batch_by_default() -> None:
    """Decode batches past the largest graph run eagerly (Python-launch bound): by default the graphs go up
    to --max-running-requests (capped at DEFAULT_CUDA_GRAPH_MAX_BS); --cuda-graph-max-bs still lowers it."""
    from nibblekv.config import DEFAULT_CUDA_GRAPH_MAX_BS, cuda_graph_batch_limit

    p = argparse.ArgumentParser()
    add_engine_args(p)
    assert EngineConfig.from_args(p.parse_args([])).cuda_graph_max_bs is None
    assert EngineConfig.from_args(p.parse_args(["--cuda-graph-max-bs", "8"])).cuda_graph_max_bs == 8
    assert cuda_graph_batch_limit(None, 256) == 256
    assert cuda_graph_batch_limit(None, 4096) == DEFAULT_CUDA_GRAPH_MAX_BS
    assert cuda_graph_batch_limit(8, 256) == 8 and cuda_graph_batch_limit(300, 64) == 64
    with pytest.raises(ValueError, match="--cuda-graph-max-bs must be >= 1"):
        EngineConfig(cuda_graph_max_bs=0)


def test_cuda_graph_bs_picks_the_captured_sizes() -> None:
    """SGLang's --cuda-graph-bs: the exact sizes (clamped to --max-running-requests); else 1, 2, 4, 8 and
    every 8 up to the limit."""
    from nibblekv.engine.cuda_graph import graph_sizes

    p = argparse.ArgumentParser()
    add_engine_args(p)
    cfg = EngineConfig.from_args(p.parse_args(["--cuda-graph-bs", "12", "1", "10", "64"]))
    assert cfg.cuda_graph_bs == (12, 1, 10, 64)
    assert graph_sizes(cfg.cuda_graph_bs, None, 32) == [1, 10, 12, 32]
    assert graph_sizes(None, None, 20) == [1, 2, 4, 8, 16, 20]
    assert graph_sizes(None, 8, 256) == [1, 2, 4, 8]
    with pytest.raises(ValueError, match="--cuda-graph-bs sizes must be >= 1"):
        EngineConfig(cuda_graph_bs=(0, 4))
    with pytest.raises(SystemExit):
        p.parse_args(["--cuda-graph-bs", "0"])
