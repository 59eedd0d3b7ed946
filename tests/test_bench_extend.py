"""benchmarks/bench_extend.py --tiny: the device sweep's code path on CPU (Triton interpreter)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import bench_extend  # noqa: E402


def test_extend_sweep_tiny(tmp_path: Path) -> None:
    from benchmarks import bench_kernels

    argv = ["--tiny", "--configs", "2:0", "3:0:0:0:0:0:0:1", "--out", str(tmp_path), "--flush", "none"]
    try:
        assert bench_extend.main(argv) == 0
        assert bench_kernels.FLUSH == "none" and bench_kernels._flusher() is None
    finally:
        bench_kernels.set_flush("read")
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
        lambda fn: (fn(), 1.0)[1], "cpu", tiny=True, shapes=[(1, 32, 2)],
        profile=lambda fn: {"_extend_kernel": 2.5},
    )
    assert [(r["dt"], r["b"], r["c"], r["chunk"]) for r in rows] == [
        ("bf16", 1, 32, 2), ("fp8_e4m3", 1, 32, 2), ("nvfp4", 1, 32, 2)
    ]
    assert all(r["kernels_us"] == {"_extend_kernel": 2.5} for r in rows)
    with pytest.raises(ValueError, match="multiple of the 16-token page"):  # a page table one page short
        bench_extend.extend_rows(lambda fn: 1.0, "cpu", tiny=True, shapes=[(1, 20, 2)])


def test_kernel_plot_draws_decode_and_extend_panels(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from benchmarks import bench_kernels

    def row(kernel: str, dt: str, batch: int, ctx: int, frac: float, chunk: int = 0) -> dict[str, object]:
        return {"kernel": kernel, "kv_dtype": dt, "batch": batch, "context": ctx, "q_heads": 32,
                "head_dim": 128, "frac_of_ceiling": frac, "chunk": chunk}  # fmt: skip

    rows = [row("decode", "nvfp4", b, c, 0.7) for b in (1, 8) for c in (8192, 32768)]
    kinds = (("extend", 0.4), ("extend_decode", 0.8))
    rows += [row(k, "fp8_e4m3", 64, 8192, f, c) for k, f in kinds for c in (1, 4)]
    bench_kernels.plot({"rows": rows, "ceiling_tbps": 4.6, "gpu": "test"}, str(tmp_path / "k.png"))
    assert (tmp_path / "k.png").stat().st_size > 10_000


def test_flush_modes_are_checked() -> None:
    from benchmarks import bench_kernels

    assert bench_kernels.FLUSH == "read"  # the default: clean lines, nothing for the timed kernel to write
    with pytest.raises(ValueError, match="flush mode"):
        bench_kernels.set_flush("zero")
    assert bench_kernels.FLUSH == "read"


def test_gpu_state_parses_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    from benchmarks import bench_kernels

    monkeypatch.setattr(bench_kernels, "DEV", "cuda")
    out = subprocess.CompletedProcess([], 0, stdout="1755, 412.30, 61\n")
    monkeypatch.setattr(bench_kernels.subprocess, "run", lambda *a, **k: out)
    assert bench_kernels.gpu_state() == {"sm_mhz": 1755.0, "power_w": 412.3, "temp_c": 61.0}
    out = subprocess.CompletedProcess([], 0, stdout="[N/A], 412.30, 61\n")  # a field the GPU does not report
    assert bench_kernels.gpu_state() == {}

    def missing(*a: object, **k: object) -> None:
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(bench_kernels.subprocess, "run", missing)
    assert bench_kernels.gpu_state() == {}
