"""CUDA-only engine checks: decode through CUDA graphs gives the same greedy tokens as eager decode."""

from __future__ import annotations

import random

import pytest
import torch

from nibblekv.engine import Engine, SamplingParams
from nibblekv.engine.cuda_graph import capture_sizes

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_capture_sizes() -> None:
    assert capture_sizes(1) == [1]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert capture_sizes(32) == [1, 2, 4, 8, 16, 24, 32]


@pytest.fixture(scope="module")
def dummy_smollm2():  # -> (CausalLM, Tokenizer), bf16 random weights on the GPU
    from nibblekv.model import load_model

    return load_model("smollm2-135m", load_format="dummy", device="cuda", seed=0)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("graphs", [True, False])
def test_overlap_schedule_equals_sync_on_gpu(dummy_smollm2, graphs: bool) -> None:
    # the placeholders are filled on the device (graph inputs or eager ids) while the host runs ahead
    rng = random.Random(1)
    prompts = [[rng.randrange(10, 30000) for _ in range(n)] for n in (37, 53, 61, 29, 17)]
    params = [SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True) for n in (40, 1, 2, 23, 40)]
    common: dict = {
        "loaded": dummy_smollm2, "kv_cache_dtype": "nvfp4", "max_total_tokens": 4096, "max_running_requests": 8,
        "kv_recent_window": 16, "decode_log_interval": 0, "disable_cuda_graph": not graphs,
    }  # fmt: skip
    ref = Engine(**common).generate(prompts, params)
    over = Engine(enable_overlap_schedule=True, **common)
    got = over.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in ref]
    assert over.runner.last_used_graph == graphs and over.pool.all_free()


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("policy", ["write_back", "write_through"])
def test_overlap_schedule_with_the_host_tier_equals_sync_on_gpu(dummy_smollm2, policy: str) -> None:
    # pinned host pages copied on the side stream while decode steps run ahead of the host: rounds of up
    # to 4 concurrent requests in a 32-page pool; a shared 4-page prefix goes to the host tier (8 fillers
    # of 7 pages each pass through) and comes back
    rng = random.Random(2)
    prefix = [rng.randrange(10, 30000) for _ in range(64)]
    rounds = [
        [prefix + [rng.randrange(10, 30000) for _ in range(n)] for n in (3, 9, 17, 1)],
        [[rng.randrange(10, 30000) for _ in range(80)] for _ in range(8)],
        [prefix + [rng.randrange(10, 30000) for _ in range(n)] for n in (5, 2, 11, 30)],
    ]
    params = SamplingParams(temperature=0, max_new_tokens=24, ignore_eos=True)
    common: dict = {
        "loaded": dummy_smollm2, "kv_cache_dtype": "nvfp4", "max_total_tokens": 512, "max_running_requests": 4,
        "kv_recent_window": 16, "decode_log_interval": 0, "enable_hierarchical_cache": True,
        "hicache_size": 0.05, "hicache_write_policy": policy,
    }  # fmt: skip
    res = []
    for overlap in (False, True):
        e = Engine(enable_overlap_schedule=overlap, **common)
        outs = [[(o.token_ids, o.cached_tokens) for o in e.generate(r, params)] for r in rounds]
        assert e.pool.all_free()
        res.append((outs, e.scheduler.cache.tree.num_loaded_back))
    assert res[1] == res[0] and res[0][1] > 0


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("kv", ["bf16", "fp8_e4m3", "nvfp4"])
def test_cuda_graph_decode_equals_eager(dummy_smollm2, kv: str) -> None:
    rng = random.Random(0)
    # Odd prompt lengths; 4 requests with equal output lengths decode as one batch of 4, a captured size,
    # so eager and graph run the same matmul shapes.
    prompts = [[rng.randrange(10, 30000) for _ in range(n)] for n in (37, 53, 61, 29)]
    params = SamplingParams(temperature=0, max_new_tokens=40, ignore_eos=True)
    common: dict = {
        "loaded": dummy_smollm2, "kv_cache_dtype": kv, "max_total_tokens": 4096, "max_running_requests": 8,
        "kv_recent_window": 16, "decode_log_interval": 0,
    }  # fmt: skip
    eager = Engine(disable_cuda_graph=True, **common)
    ref = eager.generate(prompts, params)
    assert not eager.runner.last_used_graph
    graph = Engine(cuda_graph_max_bs=4, **common)
    assert graph.runner.graphs is not None and graph.runner.graphs.sizes == [1, 2, 4]
    got = graph.generate(prompts, params)
    assert graph.runner.last_used_graph
    assert [o.token_ids for o in got] == [o.token_ids for o in ref]
    assert eager.pool.all_free() and graph.pool.all_free()
    # Batches of 8 (more than the largest graph) decode eagerly.
    many = graph.generate(prompts * 3, SamplingParams(temperature=0, max_new_tokens=4, ignore_eos=True))
    assert len(many) == 12 and graph.pool.all_free()


@pytest.mark.gpu
@needs_cuda
def test_graphs_recaptured_after_another_engine_folds_the_model() -> None:
    # a bf16 engine captured its graphs on an unfolded model; an nvfp4 engine then folds the Hadamard
    # rotation into the shared o_proj: the bf16 engine's graphs must follow (re-capture), matching eager
    from nibblekv.model import load_model

    loaded = load_model("smollm2-135m", load_format="dummy", device="cuda", seed=4)
    rng = random.Random(2)
    prompts = [[rng.randrange(10, 30000) for _ in range(n)] for n in (31, 45, 12, 60)]
    params = SamplingParams(temperature=0, max_new_tokens=24, ignore_eos=True)
    common: dict = {"loaded": loaded, "kv_cache_dtype": "bf16", "max_total_tokens": 4096, "decode_log_interval": 0}
    graph = Engine(cuda_graph_max_bs=4, **common)
    graph.generate(prompts[:1], params)
    assert not loaded[0].output_rotation_folded
    Engine(**{**common, "kv_cache_dtype": "nvfp4"})
    assert loaded[0].output_rotation_folded
    got = graph.generate(prompts, params)
    assert graph.runner.last_used_graph
    ref = Engine(disable_cuda_graph=True, **common).generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in ref]
