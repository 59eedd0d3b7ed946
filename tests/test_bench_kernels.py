"""benchmarks/bench_kernels.py and bench_decode_variants.py --smoke (CPU, Triton interpreter, one KV head),
and the timing helpers they share (benchmarks/timing.py): the device runs' code paths, not their numbers."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import bench_decode_variants, bench_kernels, timing  # noqa: E402


def test_bench_kernels_smoke(tmp_path: Path) -> None:
    assert bench_kernels.main(["--smoke", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "kernels-h200.json").read_text())
    assert doc["timing"].startswith("decode, extend and write_kv")
    assert doc["ceiling_probes"]["torch_sum_tbps"] > 0
    rows = doc["rows"]
    decode = {(r["kernel"], r["kv_dtype"], r["head_dim"]) for r in rows if r["kernel"].startswith("decode")}
    for dt in ("bf16", "fp8_e4m3", "nvfp4"):
        assert {("decode", dt, 128), ("decode_tail64", dt, 128), ("decode", dt, 64)} <= decode
        assert {("decode", dt, 256), ("decode_tail64", dt, 256)} <= decode  # the hybrid models' heads (GQA 6)
        assert any(r["kernel"] == "write_kv" and r["kv_dtype"] == dt for r in rows)
        assert any(r["kernel"] == "extend" and r["kv_dtype"] == dt for r in rows)
    assert any(r["kernel"] == "sdpa_bf16_contiguous" for r in rows)
    assert all(r["us"] > 0 and r["bytes"] > 0 and "frac_of_ceiling" in r for r in rows)
    nv = next(r for r in rows if (r["kernel"], r["kv_dtype"], r["head_dim"]) == ("decode", "nvfp4", 128))
    assert nv["ratio_vs_fp8"] > 0 and nv["ratio_vs_bf16"] > 0  # NVFP4's time over the other formats'
    if importlib.util.find_spec("matplotlib") is not None:  # the plot is skipped without it
        assert (tmp_path / "kernels-h200.png").stat().st_size > 10_000


def test_bench_kernels_head_dims_option() -> None:
    # --head-dims picks the row sets (256 alone: the hybrid models' rows, beside none of the default sweep's)
    assert bench_kernels.head_dims("256") == (256,) and bench_kernels.head_dims("128,64,256") == (128, 64, 256)
    with pytest.raises(Exception, match="head dims"):
        bench_kernels.head_dims("96")
    from benchmarks import bench_kernels_hd256 as hd

    assert all(b * c >= 256 * 1024 for b, c in hd.HD256_SHAPES)
    assert {hq // hkv for hq, hkv in hd.HD256_HEADS} == {6, 8}


def test_bench_decode_variants_smoke(tmp_path: Path) -> None:
    # one variant checked against decode_ref and timed, one that fails (reported, the run goes on)
    argv = ["--smoke", "--out", str(tmp_path), "--variants", "bf16=tok", "nvfp4=nosuch"]
    argv += ["--shapes", "1x32"]
    assert bench_decode_variants.main(argv) == 0
    doc = json.loads((tmp_path / "decode-variants.json").read_text())
    assert doc["command"] == "PYTHONPATH=. python benchmarks/bench_decode_variants.py " + " ".join(
        argv[:1] + ["--out", "DIR"] + argv[3:]
    )
    ok, bad = doc["variants"]
    assert ok["status"] == "ok" and ok["rel_rms"] <= 1e-2
    assert bad["status"] == "failed" and "unknown decode kernel" in bad["error"]
    assert [(r["kv_dtype"], r["variant"], r["batch"], r["context"], r["kv_heads"]) for r in doc["rows"]] == [
        ("bf16", "tok", 1, 32, 1)
    ]
    row = doc["rows"][0]
    best = {"variant": "tok", "us": row["us"], "frac": row["frac_of_ceiling"]}
    assert doc["best"] == [{"batch": 1, "context": 32, "bf16": best}]


def test_bench_decode_variants_scales_apart(tmp_path: Path) -> None:
    # --scales apart: NVFP4's pools (timed and checked) with data and block scales in tensors of their own
    argv = ["--smoke", "--out", str(tmp_path), "--scales", "apart", "--variants", "nvfp4=mma"]
    argv += ["--shapes", "1x32"]
    assert bench_decode_variants.main(argv) == 0
    doc = json.loads((tmp_path / "decode-variants.json").read_text())
    assert doc["variants"][0]["status"] == "ok" and doc["variants"][0]["rel_rms"] <= 1e-2
    assert [(r["variant"], r["scales"]) for r in doc["rows"]] == [("mma", "apart")]


def test_bench_decode_variants_merge(tmp_path: Path) -> None:
    # runs of one GPU -> one result file: shared fields on top, each run's command and rows in "runs"
    def run(name: str, gpu: str, rows: list[dict[str, object]]) -> Path:
        doc = {"commit": "abc1234", "gpu": gpu, "torch": "2.11", "triton": "3.6", "date": "2026-12-06T17:00:00+00:00",
               "command": f"PYTHONPATH=. python benchmarks/bench_decode_variants.py --{name}", "flush": "read",
               "ceiling_probes": {}, "ceiling_tbps": 3.2, "variants": [], "rows": rows, "best": []}  # fmt: skip
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(doc))
        return path

    a, b = run("l2", "H100", [{"us": 1.0}]), run("hbm", "H100", [{"us": 2.0}])
    argv = ["--merge", str(a), str(b), "--name", "ab", "--title", "probe and HBM", "--out", str(tmp_path)]
    assert bench_decode_variants.main(argv) == 0
    doc = json.loads((tmp_path / "ab.json").read_text())
    assert {k: doc[k] for k in ("commit", "gpu", "date", "title")} == {
        "commit": "abc1234", "gpu": "H100", "date": "2026-12-06", "title": "probe and HBM"
    }
    assert [r["command"][-3:] for r in doc["runs"]] == ["-l2", "hbm"]
    assert [r["rows"] for r in doc["runs"]] == [[{"us": 1.0}], [{"us": 2.0}]]
    assert "gpu" not in doc["runs"][0] and "commit" not in doc["runs"][0]
    with pytest.raises(ValueError, match="different GPUs"):
        bench_decode_variants.merge_runs([a, run("h200", "H200", [])], "x")


def test_decode_variants_device_script_smoke(tmp_path: Path) -> None:
    # benchmarks/device/decode_variants.sh on CPU: each argument string one run, then one merged file
    # (device time is scarce: a renamed flag must fail here, not there)
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "OUT": str(tmp_path), "COMMIT": "abc1234", "NAME": "ab", "TITLE": "smoke",
           "TRITON_INTERPRET": "1"}  # fmt: skip
    cmd = ["bash", "benchmarks/device/decode_variants.sh", "--smoke --variants bf16=tok --shapes 1x32"]
    subprocess.run(cmd, cwd=root, env=env, check=True, capture_output=True, timeout=300)
    doc = json.loads((tmp_path / "ab.json").read_text())
    assert (doc["commit"], doc["title"], len(doc["runs"])) == ("abc1234", "smoke", 1)
    run = doc["runs"][0]
    assert run["command"].endswith("--smoke --variants bf16=tok --shapes 1x32 --out DIR")
    assert [r["variant"] for r in run["rows"]] == ["tok"]
    assert run["command"] in (tmp_path / "ab.log").read_text()


def test_l2_page_order_aliases_a_long_context_onto_a_few_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    # the instruction-bound probe: 1M tokens' page table over 8 MiB of pages (random, repeating)
    pools = bench_kernels.Pools({bench_kernels.KVDtype.NVFP4: 1 << 16}, 8, 128)
    pool = pools.pools[bench_kernels.KVDtype.NVFP4]
    gen = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    monkeypatch.setattr(bench_kernels, "PAGE_ORDER", "l2")
    pt = bench_kernels.page_table(pool, 2, 1 << 15, gen())
    hot = (8 << 20) // (16 * 1152)  # 1,152 bytes a token: 8 heads x (64 data + 8 scale bytes) x K, V
    assert pt.shape == (2, 1 << 15) and pt.dtype == torch.int32
    assert int(pt.min()) >= 0 and int(pt.max()) < hot and len(pt.unique()) > hot // 2
    monkeypatch.setattr(bench_kernels, "PAGE_ORDER", "random")
    pt = bench_kernels.page_table(pool, 2, 1000, gen())
    assert len(pt.unique()) == 2000 and int(pt.max()) < pool.num_pages


def test_kernel_plot_draws_decode_and_extend_panels(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")

    def row(kernel: str, dt: str, batch: int, ctx: int, frac: float, chunk: int = 0) -> dict[str, object]:
        return {"kernel": kernel, "kv_dtype": dt, "batch": batch, "context": ctx, "q_heads": 32,
                "kv_heads": 8, "head_dim": 128, "frac_of_ceiling": frac, "chunk": chunk}  # fmt: skip

    rows = [row("decode", "nvfp4", b, c, 0.7) for b in (1, 8) for c in (8192, 32768)]
    kinds = (("extend", 0.4), ("extend_decode", 0.8))
    rows += [row(k, "fp8_e4m3", 64, 8192, f, c) for k, f in kinds for c in (1, 4)]
    bench_kernels.plot({"rows": rows, "ceiling_tbps": 4.6, "gpu": "test"}, str(tmp_path / "k.png"))
    assert (tmp_path / "k.png").stat().st_size > 10_000


def test_flush_modes_are_checked() -> None:
    assert timing.FLUSH == "read"  # the default: clean lines, nothing for the timed kernel to write
    with pytest.raises(ValueError, match="flush mode"):
        timing.set_flush("zero")
    assert timing.FLUSH == "read"


def test_gpu_state_parses_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timing, "DEV", "cuda")
    out = subprocess.CompletedProcess([], 0, stdout="1755, 412.30, 61\n")
    monkeypatch.setattr(timing.subprocess, "run", lambda *a, **k: out)
    assert timing.gpu_state() == {"sm_mhz": 1755.0, "power_w": 412.3, "temp_c": 61.0}
    out = subprocess.CompletedProcess([], 0, stdout="[N/A], 412.30, 61\n")  # a field the GPU does not report
    assert timing.gpu_state() == {}

    def missing(*a: object, **k: object) -> None:
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(timing.subprocess, "run", missing)
    assert timing.gpu_state() == {}
