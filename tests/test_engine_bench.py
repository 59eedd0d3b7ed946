"""benchmarks/bench_engine.py --smoke: the device benchmark's code path on CPU with tiny sizes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_engine.py"


def test_bench_engine_smoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # NOTE: the smoke's long requests are 102 tokens with an fp32 tail of W=16: there the nvfp4 default's
    # bf16 sink page (16 fp32 tokens per request) costs more than NVFP4 saves over FP8 in the main pool,
    # so nvfp4 would hold fewer requests than fp8 (31 vs 32) -- a smoke-size artifact (at the benchmark's
    # 32K contexts a sink page is < 0.2% of a request). The capacity check below is about the main-pool
    # format, so the smoke runs without sink pages.
    import nibblekv.engine.setup as setup_mod

    monkeypatch.setattr(setup_mod, "resolve_sink_pages", lambda config, kv_dtype: 0)
    spec = importlib.util.spec_from_file_location("bench_engine", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    argv = ["--smoke", "--throughput-models", "smollm2-135m", "--throughput-repeats", "2", "--out", str(tmp_path)]
    assert bench.main(argv) == 0
    data = json.loads((tmp_path / "bench_engine_smoke.json").read_text())
    assert {"device", "commit", "date", "torch"} <= set(data)
    assert (tmp_path / "bench_engine_smoke.png").stat().st_size > 10_000  # the three panels
    rows = data["rows"]
    thr = [r for r in rows if r["bench"] == "throughput"]
    assert [r["kv_dtype"] for r in thr] == ["bf16", "fp8_e4m3", "nvfp4"]
    assert all(r["output_tok_s"] > 0 and r["num_requests"] == 6 for r in thr)
    assert all(0 < r["prefill_only_s"] and 0 < r["warmup_s"] for r in thr)
    # every timed run prefills its prompts: the repeat finds no prefix of the run before it cached
    assert all(r["cached_prompt_tokens_runs"] == [0, 0] and len(r["seconds_runs"]) == 2 for r in thr)
    long = {(r["mode"], r["kv_dtype"]): r for r in rows if r["bench"] == "long"}
    assert set(long) == {(m, k) for m in ("matched", "capacity") for k in ("bf16", "fp8_e4m3", "nvfp4")}
    for r in long.values():
        for field in ("running_requests", "decode_tok_s", "max_total_num_tokens", "step_ms", "step_floor_ms"):
            assert r[field] > 0
        # NOTE: steady_tok_s is rounded to 0.1 (at the smoke's ~36 tok/s that is up to 1.4e-3 relative)
        want = 1e3 * r["running_requests"] / r["step_ms"]
        assert r["steady_tok_s"] == pytest.approx(want, rel=1e-4, abs=0.06)
    matched = {r["running_requests"] for (m, _), r in long.items() if m == "matched"}
    assert len(matched) == 1  # every dtype ran bf16's count
    assert (
        long[("capacity", "nvfp4")]["max_total_num_tokens"]
        > long[("capacity", "fp8_e4m3")]["max_total_num_tokens"]
    )


def test_bench_engine_quantization_flag_loads_fp8_weights() -> None:
    """--quantization fp8: the shared model has FP8 linear layers and the rows say so (the smoke above runs
    the same code path with bf16 weights); an nvfp4 engine gets it reloaded (the same weights) with the
    cache's rotation folded into o_proj, a fp8_e4m3 one without."""
    from dataclasses import replace

    from nibblekv.model.fp8 import Fp8Linear

    spec = importlib.util.spec_from_file_location("bench_engine", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    args = bench.parse_args(["--smoke", "--quantization", "fp8"])
    models = bench.load(args, "llama-3.1-8b")  # the tiny config under --smoke
    cfg = bench.base_config(args, "x")
    assert cfg.quantization == "fp8"
    plain = models.get(replace(cfg, kv_cache_dtype="fp8_e4m3"))[0]
    assert isinstance(plain.model.layers[0].self_attn.o_proj, Fp8Linear) and not plain.output_rotation_folded
    qkv = plain.model.layers[0].self_attn.qkv_proj.weight.clone()
    assert models.get(replace(cfg, kv_cache_dtype="fp8_e4m3"))[0] is plain
    del plain
    folded = models.get(replace(cfg, kv_cache_dtype="nvfp4"))[0]
    assert folded.output_rotation_folded
    folded_qkv = folded.model.layers[0].self_attn.qkv_proj.weight
    assert torch.equal(folded_qkv.view(torch.uint8), qkv.view(torch.uint8))


def test_fp8_decode_tiles_tool_variants() -> None:
    """benchmarks/tools/fp8_decode_tiles.py: the launch each variant names for <= 16 tokens."""
    import sys

    sys.path.insert(0, str(BENCH.parent))
    path = BENCH.parent / "tools" / "fp8_decode_tiles.py"
    spec = importlib.util.spec_from_file_location("fp8_decode_tiles", path)
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    from nibblekv.kernels.fp8.tiles import GemmTile, gemm_tile

    default = gemm_tile(1, 6144, 32)
    assert tool.variant_tile("default", default, 6144, 32) == default
    assert tool.variant_tile("p2", default, 6144, 32) == GemmTile(16, 64, 4, 5, 3)  # 96 tiles, 132 SMs
    assert tool.variant_tile("p4", default, 28672, 32) == GemmTile(16, 64, 4, 5, 2)
    assert tool.variant_tile("t128w8s4k4", default, 6144, 2) == GemmTile(16, 128, 8, 4, 2)
    assert tool.variant_tile("p4x", default, 6144, 32) == GemmTile(16, 64, 4, 4, 4, swap_ab=True)  # 6 -> 4
    with pytest.raises(SystemExit, match="unknown variant"):
        tool.variant_tile("q4", default, 6144, 32)
    # the override takes gemm_tile's arguments (the block flag too) and keeps its choice above 16 tokens
    tile = tool.override("p2", gemm_tile)
    assert tile(1, 6144, 32, True) == GemmTile(16, 64, 4, 5, 3)
    assert tile(64, 6144, 32, True) == gemm_tile(64, 6144, 32, True)
