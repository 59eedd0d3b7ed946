"""benchmarks/bench_linear.py --smoke: the device benchmark's code path on CPU (interpreter)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import bench_linear  # noqa: E402


def test_bench_linear_smoke_checks_and_writes_rows(tmp_path: Path) -> None:
    assert bench_linear.main(["--smoke", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "linear-decode-h200.json").read_text())
    assert {"commit", "gpu", "date", "heads", "ceiling_tbps", "rows"} <= set(doc)
    rows = [r for r in doc["rows"] if r["variant"] != "gather_fla"]  # fla-core's path: on a GPU only
    assert [(r["n"], r["variant"]) for r in rows] == [
        (n, v) for n in bench_linear.BATCHES_SMOKE for v in ("in_place", "in_place_bf16")
    ]
    for r in rows:
        assert r["us"] > 0 and r["rel_rms"] < bench_linear.TOLERANCE
        h, hv, d, w = bench_linear.HEADS_SMOKE
        ssm = 2 if r["ssm_dtype"] == "bfloat16" else 4
        assert r["state_bytes"] == 2 * r["n"] * (hv * d * d * ssm + (2 * h * d + hv * d) * (w - 1) * 2)
