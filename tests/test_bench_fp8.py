"""benchmarks/bench_fp8.py --smoke: the device benchmark's code path on CPU (interpreter / reference)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import bench_fp8  # noqa: E402


def test_bench_fp8_smoke_writes_rows_and_plot(tmp_path: Path) -> None:
    assert bench_fp8.main(["--smoke", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "fp8-weights-h200.json").read_text())
    assert {"commit", "gpu", "date", "rows", "acceptance"} <= set(doc)
    rows = doc["rows"]
    assert len(rows) == len(bench_fp8.SHAPES_SMOKE) * len(bench_fp8.MS_SMOKE) * len(bench_fp8.FORMATS)
    for r in rows:
        assert r["kind"] == "gemm" and r["format"] in ("channel", "block")
        assert all(r[key] > 0 for key in ("m", "n", "k", "fp8_us", "fp8_gemm_us", "bf16_us"))
        assert ("read_frac" in r) == (r["m"] <= 16)
    assert doc["acceptance"]["block"]["min_speedup_prefill_8k"] is None  # no 8K row in the smoke run
    assert (tmp_path / "fp8-weights-h200.png").stat().st_size > 0


def test_eval_fp8_weights_smoke(tmp_path: Path) -> None:
    from benchmarks import eval_fp8_weights

    assert eval_fp8_weights.main(["--smoke", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "fp8-weights-accuracy.json").read_text())
    assert doc["windows"] == 2 and doc["tokens"] == 62 and doc["weight_gib"] < doc["baseline_weight_gib"]
    assert 0 <= doc["kl"] < 0.1 and 0 <= doc["top1"] <= 1 and doc["kl_ci"][0] <= doc["kl"] <= doc["kl_ci"][1]
