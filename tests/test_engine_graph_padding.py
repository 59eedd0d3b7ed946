"""The CUDA-graph decode path's padding on CPU: ``CudaGraphRunner(capture=False)`` runs the same padded
static buffers eagerly -- padding rows, the ``active`` row count and the per-row demotion slots (dst -1
skipped) -- and must give the tokens of the plain eager path."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from nibblekv.engine import Engine, SamplingParams
from nibblekv.engine.cuda_graph import CudaGraphRunner, capture_sizes

TINY = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96, "num_hidden_layers": 2,
    "vocab_size": 301, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "torch_dtype": "float32",
}  # fmt: skip


@pytest.mark.parametrize("kv", ["nvfp4", "bf16"])
def test_padded_graph_buffers_decode_like_eager(tmp_path: Path, kv: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    rng = random.Random(3)
    # 5 requests (the 8-row buffers, 3 padding rows), then 4, 3, 1 as they finish; contexts cross 16-token
    # pages every few steps, so aged tail pages (window 16) demote through the per-row slots
    prompts = [[rng.randrange(10, 300) for _ in range(n)] for n in (37, 21, 50, 8, 29)]
    params = [SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True) for n in (40, 9, 23, 30, 17)]
    common = {
        "model": str(path), "load_format": "dummy", "device": "cpu", "seed": 1, "kv_cache_dtype": kv,
        "kv_recent_window": 16, "max_total_tokens": 4096, "decode_log_interval": 0,
    }  # fmt: skip
    ref = Engine(**common).generate(prompts, params)
    engine = Engine(**common)
    r = engine.runner
    r.graphs = CudaGraphRunner(r.model, r.backend, engine.pool, r.page_table, capture_sizes(8), capture=False)
    demoted: list[int] = []
    fill = r.graphs._fill
    r.graphs._fill = lambda lists, bs, size, src, dst: (demoted.append(len(src)), fill(lists, bs, size, src, dst))[1]  # type: ignore[method-assign]
    got = engine.generate(prompts, params)
    assert r.last_used_graph
    assert sum(demoted) > 0 if kv == "nvfp4" else sum(demoted) == 0  # bf16: no tail pool
    assert [o.token_ids for o in got] == [o.token_ids for o in ref]
    assert engine.pool.all_free()
