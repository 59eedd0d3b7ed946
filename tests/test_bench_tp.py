"""``benchmarks/bench_tp.py --smoke``: the TP benchmark's code path on CPU (2 gloo ranks, tiny model)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_tp_smoke(tmp_path: Path) -> None:
    # NOTE: a subprocess, as on the device: the TP engine spawns its worker ranks from the main process.
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_tp.py"), "--smoke", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads((tmp_path / "bench_tp_smoke.json").read_text())["rows"]
    # one engine per dtype: bf16 at capacity, the others at capacity and at bf16's request count
    assert [(r["kv_dtype"], r["mode"]) for r in rows] == [
        ("bf16", "capacity"), ("fp8_e4m3", "capacity"), ("fp8_e4m3", "matched"),
        ("nvfp4", "capacity"), ("nvfp4", "matched"),
    ]  # fmt: skip
    tokens = {r["kv_dtype"]: r["max_total_num_tokens"] for r in rows}
    assert tokens["nvfp4"] > tokens["fp8_e4m3"]
    assert all(r["tp"] == 2 and r["kv_heads_per_rank"] >= 1 and r["decode_tok_s"] > 0 for r in rows)
    bf16 = rows[0]["running_requests"]
    assert all(r["running_requests"] == min(bf16, r["capacity_requests"]) for r in rows if r["mode"] == "matched")
