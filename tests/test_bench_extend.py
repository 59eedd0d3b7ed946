"""benchmarks/bench_extend.py --smoke: the device sweep's code path on CPU (Triton interpreter)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import bench_extend, timing  # noqa: E402


def test_extend_sweep_smoke(tmp_path: Path) -> None:
    argv = ["--smoke", "--configs", "2:0", "3:0:0:0:0:0:0:1", "--out", str(tmp_path), "--flush", "none"]
    try:
        assert bench_extend.main(argv) == 0
        assert timing.FLUSH == "none" and timing._flusher() is None
    finally:
        timing.set_flush("read")
    doc = json.loads((tmp_path / "extend-sweep.json").read_text())
    assert doc["flush"] == "none"
    rows = doc["rows"]
    ext = [r for r in rows if r["kernel"] == "extend"]
    assert {r["dt"] for r in ext} == {"bf16", "fp8_e4m3", "nvfp4"}
    assert all(r["splits"] == 2 and r["us"] > 0 and r["nbytes"] > 0 and "frac_of_ceiling" in r for r in ext)
    # extend_decode: NVFP4 (decode_mma) and FP8 (decode_tok); bf16's extend already streams
    assert [(r["dt"], r["splits"]) for r in rows if r["kernel"] == "extend_decode"] == [("fp8_e4m3", 3), ("nvfp4", 3)]
    assert not torch.cuda.is_available() or doc["ceiling_probes"]


def test_extend_rows_take_shapes_and_a_per_kernel_profile() -> None:
    # --shapes / --breakdown: the rows are the shapes asked for, each with the profile's per-kernel times
    rows = bench_extend.extend_rows(
        lambda fn: (fn(), 1.0)[1], "cpu", smoke=True, shapes=[(1, 32, 2)],
        profile=lambda fn: {"_extend_kernel": 2.5},
    )
    assert [(r["dt"], r["b"], r["c"], r["chunk"]) for r in rows] == [
        ("bf16", 1, 32, 2), ("fp8_e4m3", 1, 32, 2), ("nvfp4", 1, 32, 2)
    ]
    assert all(r["kernels_us"] == {"_extend_kernel": 2.5} for r in rows)
    with pytest.raises(ValueError, match="multiple of the 16-token page"):  # a page table one page short
        bench_extend.extend_rows(lambda fn: 1.0, "cpu", smoke=True, shapes=[(1, 20, 2)])
