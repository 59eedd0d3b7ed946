"""Merge ``nibblekv bench serve`` results (one JSON per dataset x KV dtype) into one table and a plot.

Reads ``serve-<dataset>-<kv dtype>.json`` (and ``server-info-<kv dtype>.json`` where present, for the
pool size each dtype got) from ``--results``; writes ``<out>.json`` (one row per dataset x dtype) and
``<out>.png`` (output tok/s, median TTFT and median TPOT, bars per dataset x dtype).

    python3 benchmarks/plot_serve.py --results /tmp/serve-work-h200 --out benchmarks/results/serve-h200 \
        --commit abc1234 --gpu "NVIDIA H200"
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path
from typing import Any

DTYPE_ORDER = ("bf16", "fp8_e4m3", "nvfp4")
DATASET_ORDER = ("random", "shared-prefix")
METRICS = (
    "completed",
    "failed",
    "duration_s",
    "total_input_tokens",
    "total_output_tokens",
    "total_cached_tokens",
    "request_throughput",
    "input_throughput",
    "output_throughput",
    "total_throughput",
    "concurrency",
)
LATENCIES = ("ttft", "itl", "tpot", "e2e_latency")
# Workload flags worth keeping next to the numbers (the full config stays in the raw files).
CONFIG_KEYS = (
    "num_prompts",
    "max_concurrency",
    "request_rate",
    "random_input_len",
    "random_output_len",
    "random_range_ratio",
    "random_token_ids",
    "gsp_num_groups",
    "gsp_prompts_per_group",
    "gsp_system_prompt_len",
    "gsp_question_len",
    "gsp_output_len",
)
SERVER_KEYS = ("max_total_num_tokens", "kv_capacity_tokens", "max_running_requests", "context_length")


def _order(value: str, order: tuple[str, ...]) -> tuple[int, str]:
    return (order.index(value) if value in order else len(order), value)


def load_row(path: Path) -> dict[str, Any]:
    """One table row from a bench JSON named ``serve-<dataset>-<dtype>.json``."""
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    config: dict[str, Any] = data.get("config", {})
    dataset = str(config.get("dataset", ""))
    prefix = f"serve-{dataset}-"
    if not dataset or not path.stem.startswith(prefix):
        raise ValueError(f"{path.name}: expected serve-<dataset>-<kv dtype>.json with config.dataset")
    dtype = path.stem[len(prefix) :]
    row: dict[str, Any] = {"dataset": dataset, "kv_cache_dtype": dtype, "model": data.get("model")}
    row.update({k: data[k] for k in METRICS if k in data})
    for name in LATENCIES:
        for stat in ("mean", "median", "p99"):
            key = f"{stat}_{name}_ms"
            if key in data:
                row[key] = data[key]
    info_path = path.with_name(f"server-info-{dtype}.json")
    if info_path.is_file() and info_path.stat().st_size:
        info: dict[str, Any] = json.loads(info_path.read_text(encoding="utf-8"))
        row.update({f"server_{k}": info[k] for k in SERVER_KEYS if k in info})
    row["workload"] = {k: config[k] for k in CONFIG_KEYS if k in config and _relevant(k, dataset)}
    if data.get("errors"):
        row["errors"] = data["errors"]
    return row


def _relevant(key: str, dataset: str) -> bool:
    """Only the flags of this row's dataset (random_* for random, gsp_* for shared-prefix)."""
    if key.startswith("random_"):
        return dataset == "random"
    if key.startswith("gsp_"):
        return dataset == "shared-prefix"
    return True


def merge(results: Path, commit: str, gpu: str, date: str, note: str) -> dict[str, Any]:
    rows = [load_row(p) for p in sorted(results.glob("serve-*.json"))]
    if not rows:
        raise SystemExit(f"no serve-<dataset>-<dtype>.json files in {results}")
    rows.sort(key=lambda r: (_order(r["dataset"], DATASET_ORDER), _order(r["kv_cache_dtype"], DTYPE_ORDER)))
    return {
        "bench": "nibblekv bench serve",
        "commit": commit,
        "gpu": gpu,
        "date": date,
        "note": note,
        "rows": rows,
    }


def table(merged: dict[str, Any]) -> str:
    """A fixed-width summary (what the device log shows)."""
    head = f"{'dataset':<14}{'kv dtype':<10}{'ok/fail':>9}{'out tok/s':>11}{'req/s':>8}{'conc':>7}"
    head += f"{'TTFT med/p99 ms':>18}{'TPOT med ms':>13}{'ITL p99 ms':>12}"
    lines = [head]
    for r in merged["rows"]:
        lines.append(
            f"{r['dataset']:<14}{r['kv_cache_dtype']:<10}{r.get('completed', 0):>5}/{r.get('failed', 0):<3}"
            f"{r.get('output_throughput', 0.0):>11.0f}{r.get('request_throughput', 0.0):>8.2f}"
            f"{r.get('concurrency', 0.0):>7.1f}"
            f"{r.get('median_ttft_ms', 0.0):>10.1f}/{r.get('p99_ttft_ms', 0.0):<7.0f}"
            f"{r.get('median_tpot_ms', 0.0):>13.2f}{r.get('p99_itl_ms', 0.0):>12.2f}"
        )
    return "\n".join(lines)


def plot(merged: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display on the device
    import matplotlib.pyplot as plt

    rows: list[dict[str, Any]] = merged["rows"]
    datasets = sorted({r["dataset"] for r in rows}, key=lambda d: _order(d, DATASET_ORDER))
    dtypes = sorted({r["kv_cache_dtype"] for r in rows}, key=lambda d: _order(d, DTYPE_ORDER))
    panels = (
        ("output_throughput", "output tokens/s"),
        ("median_ttft_ms", "median TTFT (ms)"),
        ("median_tpot_ms", "median TPOT (ms)"),
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6))
    width = 0.8 / max(1, len(dtypes))
    for ax, (key, label) in zip(axes, panels, strict=True):
        for j, dtype in enumerate(dtypes):
            xs, ys = [], []
            for i, dataset in enumerate(datasets):
                match = [r for r in rows if r["dataset"] == dataset and r["kv_cache_dtype"] == dtype]
                if match and key in match[0]:
                    xs.append(i + (j - (len(dtypes) - 1) / 2) * width)
                    ys.append(float(match[0][key]))
            bars = ax.bar(xs, ys, width, label=dtype)
            ax.bar_label(bars, fmt="%.0f" if key == "output_throughput" else "%.1f", fontsize=7)
        ax.set_xticks(range(len(datasets)), datasets)
        ax.set_title(label, fontsize=10)
    axes[0].legend(title="KV dtype", fontsize=8)
    model = rows[0].get("model") or "?"
    fig.suptitle(
        f"nibblekv serve, {model}, {merged['gpu']} ({merged['date']}, {merged['commit']})", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--results", type=Path, required=True, help="folder of serve-<dataset>-<dtype>.json")
    p.add_argument("--out", type=Path, required=True, help="output path without suffix (.json and .png)")
    p.add_argument("--commit", default="unknown")
    p.add_argument("--gpu", default="unknown")
    p.add_argument("--date", default=dt.datetime.now(dt.UTC).date().isoformat())
    p.add_argument("--note", default="")
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args(argv)
    merged = merge(args.results, args.commit, args.gpu, args.date, args.note)
    json_path = args.out.with_name(args.out.name + ".json")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(merged, indent=1) + "\n", encoding="utf-8")
    print(table(merged))
    print(f"wrote {json_path} ({len(merged['rows'])} rows)")
    if not args.no_plot:
        png_path = args.out.with_name(args.out.name + ".png")
        plot(merged, png_path)
        print(f"wrote {png_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
