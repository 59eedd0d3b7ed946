"""benchmarks/plot_engine.py --merge: the engine runner (benchmarks/device/engine.sh) joins its three
bench_engine runs (long 32K, the 16K floor rows, offline throughput) into one JSON and plot."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import plot_engine  # noqa: E402


def _run(path: Path, rows: list[dict[str, Any]], commit: str = "abc") -> Path:
    doc = {"device": "NVIDIA H200", "commit": commit, "torch": "2.11", "date": "d", "args": {"part": "x"},
           "rows": rows}  # fmt: skip
    path.write_text(json.dumps(doc))
    return path


def _long(mode: str, kv: str, n: int) -> dict[str, Any]:
    return {"bench": "long", "mode": mode, "kv_dtype": kv, "running_requests": n, "input_len": 32768,
            "decode_tok_s": 100.0 * n, "step_ms": 30.0, "step_floor_ms": 25.0}  # fmt: skip


def test_merge_joins_runs_in_order_and_plots(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    long = _run(tmp_path / "long.json", [_long("matched", kv, 26) for kv in ("bf16", "nvfp4")])
    thr = {"bench": "throughput", "model": "llama-3.1-8b", "kv_dtype": "nvfp4", "output_tok_s": 11000.0,
           "num_requests": 256}
    tput = _run(tmp_path / "tput.json", [thr])
    out = tmp_path / "engine-h200.json"
    assert plot_engine.main([str(out), "--merge", f"long={long}", f"throughput={tput}"]) == 0
    doc = json.loads(out.read_text())
    assert [(r["part"], r["rows"]) for r in doc["runs"]] == [("long", 2), ("throughput", 1)]
    assert [r["bench"] for r in doc["rows"]] == ["long", "long", "throughput"]
    assert doc["commit"] == "abc" and doc["runs"][0]["args"] == {"part": "x"}
    assert out.with_suffix(".png").stat().st_size > 10_000


def test_merge_refuses_runs_of_other_commits(tmp_path: Path) -> None:
    a = _run(tmp_path / "a.json", [_long("matched", "bf16", 26)])
    b = _run(tmp_path / "b.json", [_long("matched", "nvfp4", 26)], commit="def")
    with pytest.raises(ValueError, match="commit"):
        plot_engine.merge([("a", json.loads(a.read_text())), ("b", json.loads(b.read_text()))])
    with pytest.raises(SystemExit):  # the CLI: a usage error naming the item, nothing written
        plot_engine.main([str(tmp_path / "m.json"), "--merge", str(a)])
    assert not (tmp_path / "m.json").exists()
