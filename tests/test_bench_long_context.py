"""benchmarks/bench_long_context.py --smoke: the device benchmark's code path on CPU, tiny sizes, seconds."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_long_context.py"
KEYS = {"model", "input_len", "output_len", "mode", "kv_dtype", "running_requests", "decode_tok_s",
        "ttft_mean_s", "ttft_kind", "max_total_num_tokens", "plan_requests", "capacity_requests",
        "decode_steps_cap"}  # fmt: skip


def _bench() -> object:
    spec = importlib.util.spec_from_file_location("bench_long_context", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_smoke_rows_written_as_they_finish_with_plan_and_engine_agreeing(tmp_path: Path) -> None:
    bench = _bench()
    # 600 input tokens + 4 output: past the smoke model's 512 positions, so --allow-long-context and the
    # RoPE override are on the path; bf16 holds fewer requests than fp8, so its matched row is skipped
    argv = ["--smoke", "--input-lens", "600", "--out", str(tmp_path / "a")]
    assert bench.main(argv) == 0  # type: ignore[attr-defined]
    doc = json.loads((tmp_path / "a" / "long-context-h200.json").read_text())
    assert {"commit", "gpu", "date", "rows", "skipped", "published"} <= set(doc)
    rows = {(r["mode"], r["kv_dtype"]): r for r in doc["rows"]}
    assert set(rows) == {("capacity", "bf16"), ("matched", "fp8_e4m3"), ("capacity", "fp8_e4m3"),
                         ("matched", "nvfp4"), ("capacity", "nvfp4")}  # fmt: skip
    assert [(s["mode"], s["kv_dtype"]) for s in doc["skipped"]] == [("matched", "bf16")]
    for r in rows.values():
        assert KEYS <= set(r) and r["decode_tok_s"] > 0 and r["ttft_kind"] == "real" and r["ttft_mean_s"] > 0
        assert r["plan_requests"] == r["capacity_requests"]  # the planner and the engine's sizing agree
        assert r["context_length"] == 620 and r["rope_scaling"]["rope_type"] == "linear"
        assert r["ttft_sampled"]["estimate_s"] > 0  # beside the real TTFT: the sampling method's check
    fp8 = rows[("capacity", "fp8_e4m3")]["running_requests"]
    assert (
        rows[("matched", "nvfp4")]["running_requests"]
        == fp8
        < rows[("capacity", "nvfp4")]["running_requests"]
    )
    assert (tmp_path / "a" / "long-context-h200.png").stat().st_size > 10_000

    # --merge: runs of other models / weights add up; a rerun replaces the rows it measured (model, weights,
    # input length, mode, KV dtype) and keeps the others, each row naming its run's commit
    src = tmp_path / "a" / "long-context-h200.json"
    fp8 = json.loads(src.read_text()) | {"commit": "c2"}
    for r in fp8["rows"] + fp8["skipped"]:
        r["weights"] = "fp8"
    (tmp_path / "fp8.json").write_text(json.dumps(fp8))
    argv = ["--merge", str(src), str(tmp_path / "fp8.json"), "--out", str(tmp_path / "m")]
    assert bench.main(argv) == 0  # type: ignore[attr-defined]
    both = json.loads((tmp_path / "m" / "long-context-h200.json").read_text())
    assert len(both["rows"]) == 2 * len(doc["rows"])
    assert [r["commit"] for r in both["runs"]] == [doc["commit"], "c2"]
    nv = [r | {"decode_tok_s": 1.0} for r in fp8["rows"] if r["kv_dtype"] == "nvfp4"]
    (tmp_path / "rerun.json").write_text(json.dumps(fp8 | {"commit": "c3", "rows": nv, "skipped": []}))
    argv = ["--merge", str(tmp_path / "m" / "long-context-h200.json"), str(tmp_path / "rerun.json"),
            "--out", str(tmp_path / "m2")]  # fmt: skip
    assert bench.main(argv) == 0  # type: ignore[attr-defined]
    three = json.loads((tmp_path / "m2" / "long-context-h200.json").read_text())
    assert [r["commit"] for r in three["runs"]] == [doc["commit"], "c2", "c3"]
    assert len(three["rows"]) == len(both["rows"]) and len(three["skipped"]) == len(both["skipped"])
    fp8w = [r for r in three["rows"] if r.get("weights") == "fp8"]
    assert {(r["kv_dtype"], r["commit"], r["decode_tok_s"] == 1.0) for r in fp8w} == {
        ("nvfp4", "c3", True), ("fp8_e4m3", "c2", False), ("bf16", "c2", False)}
    assert [r for r in three["rows"] if r.get("weights", "bf16") == "bf16"] == [
        r | {"commit": doc["commit"]} for r in doc["rows"]]
    # a rerun of every row of a series drops the run it replaced
    full = fp8 | {"commit": "c4"}
    (tmp_path / "full.json").write_text(json.dumps(full))
    argv = ["--merge", str(tmp_path / "m2" / "long-context-h200.json"), str(tmp_path / "full.json"),
            "--out", str(tmp_path / "m3")]  # fmt: skip
    assert bench.main(argv) == 0  # type: ignore[attr-defined]
    four = json.loads((tmp_path / "m3" / "long-context-h200.json").read_text())
    assert [r["commit"] for r in four["runs"]] == [doc["commit"], "c4"]


@pytest.mark.parametrize("ssm", [None, "bfloat16"])
def test_smoke_hybrid_preset(tmp_path: Path, ssm: str | None) -> None:
    """The Qwen3.5-27B preset (hybrid: linear-attention states admitted with the synthetic prefill): the
    planner counts the state pool as the engine does (within one on CPU, where the conv window is fp32 and the
    planner counts it in bf16), with the recurrent state in float32 or (``--mamba-ssm-dtype``) bf16."""
    bench = _bench()
    argv = ["--smoke", "--models", "qwen3.5-27b", "--input-lens", "256", "--kv-dtypes", "nvfp4",
            "--modes", "capacity", "--ttft-requests", "0", "--out", str(tmp_path)]  # fmt: skip
    if ssm:
        argv += ["--mamba-ssm-dtype", ssm]
    assert bench.main(argv) == 0  # type: ignore[attr-defined]
    doc = json.loads((tmp_path / "long-context-h200.json").read_text())
    (row,) = [r for r in doc["rows"] if r["kv_dtype"] == "nvfp4"]
    # no real TTFT asked: the chunk-sampled one (chunks over a synthetic prefix, the state slot zero)
    assert row["model"] == "qwen3.5-27b" and row["weights"] == "bf16" and row["ttft_kind"] == "sampled"
    assert row["ttft_mean_s"] == row["ttft_sampled"]["estimate_s"] > 0
    assert [off for off, _ in row["ttft_sampled"]["chunks"]] == [0, 128, 192]  # 4 chunks: first, mid, last
    assert row.get("ssm_dtype") == ssm
    assert row["decode_tok_s"] > 0 and row["running_requests"] == row["capacity_requests"] > 1
    assert abs(row["plan_requests"] - row["capacity_requests"]) <= 1


def test_sampled_ttft_sums_the_fitted_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunk times linear in the offset: the estimate is exactly the prefill's chunks summed, a short last
    chunk at its share; the offsets include the first and the last whole chunk."""
    bench = _bench()
    import long_context_ttft as lt  # on sys.path once the bench is loaded

    assert lt.chunk_offsets(1_048_576, 8192, 3) == [0, 64 * 8192, 127 * 8192]
    assert lt.chunk_offsets(200, 64, 3) == [0, 64, 128]  # whole chunks only: the short last one is not timed
    assert lt.chunk_offsets(100, 64, 3) == [0] and lt.chunk_offsets(50, 64, 3) == [0]
    timed: list[tuple[int, int]] = []

    def fake(engine: object, prompt: list[int], offset: int, chunk: int) -> float:
        timed.append((offset, chunk))
        return (0.5 + 0.001 * offset) * chunk / 64

    monkeypatch.setattr(lt, "chunk_seconds", fake)
    out = lt.sampled_ttft(None, list(range(300)), 64, 3)  # type: ignore[arg-type]
    assert timed[0] == (0, 2) and timed[1:] == [(0, 64), (128, 64), (192, 64)]  # warm-up, then the samples
    want = sum((0.5 + 0.001 * off) * min(64, 300 - off) / 64 for off in range(0, 300, 64))
    assert out["estimate_s"] == pytest.approx(want, abs=1e-4) and out["b_s_per_token"] > 0
    assert bench is not None
