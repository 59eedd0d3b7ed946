"""``bench_long_context.py --merge``: several long-context result files as one (the device runs one model and
weight format per call; the results page cites the merged file)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from plot_long_context import series


def _row_key(r: dict[str, Any]) -> tuple[str, int, str, str]:
    return series(r), r["input_len"], r["mode"], r["kv_dtype"]


def _stamp(d: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """``d``'s runs, and each of its rows and skips stamped with the ``commit`` of the run that measured it (a
    merged file's rows carry theirs, or take the one run of their series)."""
    every = d["rows"] + d.get("skipped", [])
    runs = d.get("runs") or [{"file": name, "commit": d["commit"], "gpu": d["gpu"], "date": d["date"],
                              "series": sorted({series(r) for r in every})}]  # fmt: skip
    for r in every:
        if "commit" not in r:
            r["commit"] = next(run["commit"] for run in runs if series(r) in run["series"])
    return runs


def merge_files(paths: list[Path]) -> dict[str, Any]:
    """The rows of ``paths`` in one result document, in order. A later file's rows and skips replace an
    earlier file's of the same model, weights, input length, mode and KV dtype (a rerun of some rows); each
    row names its run's ``commit``, and ``runs`` keeps the runs that still own a row or skip."""
    docs = [json.loads(p.read_text()) for p in paths]
    doc = dict(docs[0])
    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    for p, d in zip(paths, docs):
        own = _stamp(d, p.name)
        new = {_row_key(r) for r in d["rows"] + d.get("skipped", [])}
        rows = [r for r in rows if _row_key(r) not in new] + d["rows"]
        skipped = [r for r in skipped if _row_key(r) not in new] + d.get("skipped", [])
        runs += [r for r in own if r not in runs]
    owners = {(r["commit"], series(r)) for r in rows + skipped}
    runs = [r for r in runs if any((r["commit"], s) in owners for s in r["series"])]
    return doc | {"rows": rows, "skipped": skipped, "runs": runs}
