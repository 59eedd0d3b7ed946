"""Plot ``benchmarks/bench_engine.py`` results: offline throughput, long-context decode, steps vs floors.

Three panels, one bar per KV dtype in each group:

1. offline throughput (``bench == "throughput"``): output tok/s per model;
2. long context (``bench == "long"``): decode tok/s (the median step's rate: ``running_requests / step_ms``)
   per mode (matched / capacity / requests=N), each bar labelled with its running requests;
3. each long row's median step against its memory floor (weights + KV bytes read over the same run's
   read bandwidth) -- the issue's "decode step <= 1.5x its memory floor" line is drawn.

    python3 benchmarks/plot_engine.py benchmarks/results/engine-h200.json  # -> engine-h200.png beside it
    python3 benchmarks/plot_engine.py OUT/engine-h200.json --merge long=OUT/long/bench_engine.json \
        floor=OUT/floor/bench_engine.json throughput=OUT/throughput/bench_engine.json  # several runs in one
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

DTYPE_ORDER = ("bf16", "fp8_e4m3", "nvfp4")
COLORS = {"bf16": "tab:blue", "fp8_e4m3": "tab:orange", "nvfp4": "tab:green"}
FLOOR_TARGET = 1.5  # issue 4: decode step <= 1.5x its memory floor


def _groups(rows: list[dict[str, Any]], key: str) -> list[str]:
    """Group names in first-seen order."""
    return list(dict.fromkeys(str(r[key]) for r in rows))


def _bars(ax: Any, rows: list[dict[str, Any]], group_key: str, value: Any, label: Any = None) -> None:
    """Grouped bars: groups along x, one bar per KV dtype; ``value(row)`` the height, ``label(row)`` a tag."""
    groups = _groups(rows, group_key)
    dtypes = [d for d in DTYPE_ORDER if any(r["kv_dtype"] == d for r in rows)]
    width = 0.8 / max(1, len(dtypes))
    for j, kv in enumerate(dtypes):
        labelled = False
        for i, g in enumerate(groups):
            row = next((r for r in rows if str(r[group_key]) == g and r["kv_dtype"] == kv), None)
            if row is None:
                continue
            x = i - 0.4 + width * (j + 0.5)
            ax.bar(x, value(row), width, color=COLORS.get(kv), label=None if labelled else kv)
            labelled = True
            if label is not None:
                ax.annotate(label(row), (x, value(row)), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(groups)), groups, fontsize=8)
    ax.grid(axis="y", alpha=0.3)


def plot(data: dict[str, Any], png: Path) -> None:
    """Write the three panels of ``data`` (a bench_engine JSON: ``rows`` plus metadata) to ``png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = data["rows"]
    thr = [r for r in rows if r["bench"] == "throughput"]
    # a group per (context, mode): one file may hold runs at several contexts
    long = [{**r, "case": f"{r['mode']}\n{r['input_len'] // 1024}K"} for r in rows if r["bench"] == "long"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    if thr:
        _bars(axes[0], thr, "model", lambda r: r["output_tok_s"])
        axes[0].set_title(f"offline: {thr[0]['num_requests']} requests, output tok/s")
        axes[0].legend(fontsize=8)
    else:
        axes[0].set_axis_off()
        axes[0].text(0.5, 0.5, "no offline-throughput rows", ha="center", va="center")
    if long:
        _bars(axes[1], long, "case", lambda r: 1e3 * r["running_requests"] / r["step_ms"],
              lambda r: f"{r['running_requests']} req")  # fmt: skip
        axes[1].set_title("long context: decode tok/s (median step)")
        axes[1].legend(fontsize=8)
        _bars(axes[2], long, "case", lambda r: r["step_ms"] / r["step_floor_ms"],
              lambda r: f"{r['step_ms']:.1f} ms")  # fmt: skip
        axes[2].axhline(FLOOR_TARGET, color="red", linestyle="--", linewidth=1, label=f"{FLOOR_TARGET}x floor")
        axes[2].set_title("median step / memory floor")
        axes[2].legend(fontsize=8)
    meta = " ".join(f"{k}: {data[k]}" for k in ("device", "commit", "date") if data.get(k))
    fig.suptitle(f"nibblekv engine benchmark ({meta})", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def merge(parts: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """One engine JSON from several bench_engine runs (``(part name, run JSON)`` items, e.g. the long part,
    the floor rows and the throughput part): every run's rows, and under ``runs`` each run's name, date,
    args and row count. Device, commit and torch come from the first run; runs that disagree are refused."""
    if not parts:
        raise ValueError("nothing to merge")
    first = parts[0][1]
    for name, run in parts:
        for key in ("device", "commit", "torch"):
            if run.get(key) != first.get(key):
                raise ValueError(f"run {name!r} has {key}={run.get(key)!r}, the first has {first.get(key)!r}")
    return {
        "device": first.get("device"), "commit": first.get("commit"), "torch": first.get("torch"),
        "date": first.get("date"),
        "runs": [{"part": name, "date": run.get("date"), "args": run.get("args"), "rows": len(run["rows"])}
                 for name, run in parts],
        "rows": [row for _, run in parts for row in run["rows"]],
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    import json

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", type=Path, help="a bench_engine JSON (with --merge: the merged JSON to write)")
    p.add_argument("--merge", nargs="+", default=None, metavar="NAME=JSON",
                   help="named bench_engine JSONs to merge into RESULTS (e.g. long=DIR/bench_engine.json)")
    p.add_argument("--out", type=Path, default=None, help="PNG path (default: the JSON's, .png)")
    args = p.parse_args(argv)
    if args.merge:
        bad = [m for m in args.merge if "=" not in m]
        if bad:
            p.error(f"--merge items are NAME=JSON, got {bad}")
        parts = [(n, json.loads(Path(f).read_text())) for n, f in (m.split("=", 1) for m in args.merge)]
        try:
            data = merge(parts)
        except ValueError as e:
            p.error(str(e))
        args.results.write_text(json.dumps(data, indent=1))
        print(f"wrote {args.results}")
    png = args.out or args.results.with_suffix(".png")
    plot(json.loads(args.results.read_text()), png)
    print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
