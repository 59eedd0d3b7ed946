"""Plot ``benchmarks/bench_long_context.py`` results against the published NVFP4 numbers.

Left: decode throughput nvfp4 / fp8_e4m3 vs input length, capacity-driven and matched rows, the published
capacity ratios (+37.37% / +57.75% / +78.46%) as stars and the matched band (+26-30%) shaded. Right: resident
requests per KV dtype (capacity rows; one colour a model, one line style a KV dtype) vs input length, the
published fp8 -> nvfp4 counts (44 -> 70, 10 -> 15, 1 -> 2) as stars (open: fp8).

    python3 benchmarks/plot_long_context.py benchmarks/results/long-context-h200.json  # -> .png beside it
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def series(row: dict[str, Any]) -> str:
    """A row's model and weights, e.g. ``llama-3.1-8b`` or ``llama-3.1-8b fp8 weights``."""
    weights = row.get("weights", "bf16")
    return row["model"] if weights == "bf16" else f"{row['model']} {weights} weights"


def _by(rows: list[dict[str, Any]], model: str, mode: str) -> dict[tuple[int, str], dict[str, Any]]:
    return {(r["input_len"], r["kv_dtype"]): r for r in rows if series(r) == model and r["mode"] == mode}


def ratios(rows: list[dict[str, Any]], model: str, mode: str) -> list[tuple[int, float]]:
    """(input length, nvfp4 / fp8_e4m3 decode tok/s) where both rows exist."""
    by = _by(rows, model, mode)
    lens = sorted({n for n, _ in by})
    return [(n, by[(n, "nvfp4")]["decode_tok_s"] / by[(n, "fp8_e4m3")]["decode_tok_s"])
            for n in lens if (n, "nvfp4") in by and (n, "fp8_e4m3") in by]  # fmt: skip


def title(doc: dict[str, Any]) -> str:
    """The runs behind ``doc``: GPU, date and commit of each (a ``--merge`` file has several)."""
    runs = doc.get("runs") or [doc]
    gpus = ", ".join(dict.fromkeys(r["gpu"] for r in runs))
    dates = sorted({str(r["date"])[:10] for r in runs})
    commits = ", ".join(dict.fromkeys(str(r["commit"])[:7] for r in runs))
    return f"{gpus}, {' to '.join(dict.fromkeys([dates[0], dates[-1]]))}, commit(s) {commits}"


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, pub = doc["rows"], doc["published"]
    models = list(dict.fromkeys(series(r) for r in rows))
    # NOTE: one colour a model (and weight format); the KV dtype is the marker and line style
    color = {m: plt.get_cmap("tab10")(i % 10) for i, m in enumerate(models)}
    kv_style = {"bf16": ":s", "fp8_e4m3": "-o", "nvfp4": "--^"}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(15, 5.2))
    lo, hi = pub["matched_ratio"]
    ax1.axhspan(lo, hi, color="0.85", label=f"published matched {lo:.2f}-{hi:.2f}")
    px = [int(n) for n in pub["capacity_ratio"]]
    ax1.scatter(px, list(pub["capacity_ratio"].values()), marker="*", s=160, color="k", zorder=3,
                label="published capacity-driven")  # fmt: skip
    for model in models:
        for mode, style in (("capacity", "-o"), ("matched", "--s")):
            pts = ratios(rows, model, mode)
            if pts:
                ax1.plot(*zip(*pts), style, color=color[model], label=f"{model} {mode}")
    ax1.axhline(1.0, color="0.5", lw=0.8)
    ax1.set(xscale="log", xlabel="input tokens", ylabel="decode tok/s, nvfp4 / fp8_e4m3",
            title="peak-batch decode throughput ratio")  # fmt: skip
    ax1.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    for i, kv in enumerate(("fp8_e4m3", "nvfp4")):
        ax2.scatter(px, [v[i] for v in pub["resident"].values()], marker="*", s=160, color="k", zorder=3,
                    facecolor="none" if kv == "fp8_e4m3" else "k", label=f"published {kv}")  # fmt: skip
    for model in models:
        by = _by(rows, model, "capacity")
        for kv, style in kv_style.items():
            pts = sorted((n, r["running_requests"]) for (n, d), r in by.items() if d == kv)
            if pts:
                ax2.plot(*zip(*pts), style, color=color[model], label=f"{model} {kv}")
    ax2.set(xscale="log", yscale="log", xlabel="input tokens", ylabel="resident requests",
            title="resident requests (capacity rows)")  # fmt: skip
    ax2.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(title(doc), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    src = Path(sys.argv[1])
    plot(json.loads(src.read_text()), src.with_suffix(".png"))
    print(f"wrote {src.with_suffix('.png')}")
