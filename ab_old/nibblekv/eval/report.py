"""Results of ``nibblekv eval kv``: the JSON document, a Markdown table and a plot."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nibblekv.eval.passkey import PasskeyResult


def passkey_summary(results: Sequence[PasskeyResult]) -> list[dict[str, Any]]:
    """Hits per (config, length), in first-seen order."""
    keys = list(dict.fromkeys((r.config, r.length) for r in results))
    out = []
    for cfg, n in keys:
        group = [r for r in results if r.config == cfg and r.length == n]
        out.append({"config": cfg, "length": n, "hits": sum(r.hit for r in group), "cases": len(group)})
    return out


def _fmt_ci(x: float, ci: Sequence[float], digits: int) -> str:
    return f"{x:.{digits}f} [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """One line per configuration: KL, top-1 and perplexity delta for both modes (95% CIs)."""
    configs = list(dict.fromkeys(r["config"] for r in rows))
    by = {(r["config"], r["mode"]): r for r in rows}
    lines = [
        "| config | prefill KL | prefill top-1 | prefill ppl (delta) | decode KL | decode top-1 | decode ppl (delta) |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in configs:
        cells = [f"`{c}`"]
        for mode in ("prefill", "decode"):
            r = by.get((c, mode))
            if r is None:
                cells += ["-", "-", "-"]
                continue
            cells.append(_fmt_ci(r["kl"], r["kl_ci"], 4))
            cells.append(f"{100 * r['top1']:.1f}% [{100 * r['top1_ci'][0]:.1f}, {100 * r['top1_ci'][1]:.1f}]")
            cells.append(f"{r['ppl']:.3f} ({r['ppl_delta']:+.3f})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def passkey_table(summary: Sequence[dict[str, Any]]) -> str:
    lengths = sorted({s["length"] for s in summary})
    configs = list(dict.fromkeys(s["config"] for s in summary))
    by = {(s["config"], s["length"]): s for s in summary}
    lines = ["| config | " + " | ".join(f"{n} tok" for n in lengths) + " |", "|---|" + "---|" * len(lengths)]
    for c in configs:
        cells = [f"{by[(c, n)]['hits']}/{by[(c, n)]['cases']}" if (c, n) in by else "-" for n in lengths]
        lines.append(f"| `{c}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(doc: dict[str, Any], path: str | Path) -> None:
    """KL and top-1 per configuration for both modes (95% CI bars), and passkey hits per length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["rows"]
    configs = [c for c in dict.fromkeys(r["config"] for r in rows) if c != doc["baseline"]]
    has_passkey = bool(doc.get("passkey_summary"))
    fig, axes = plt.subplots(1, 3 if has_passkey else 2, figsize=(18 if has_passkey else 12, 5))
    y = list(range(len(configs)))
    for ax, metric, label in (
        (axes[0], "kl", "KL divergence vs baseline (log)"),
        (axes[1], "top1", "top-1 agreement"),
    ):
        for off, mode, color in ((-0.18, "prefill", "tab:blue"), (0.18, "decode", "tab:orange")):
            pts = [next((r for r in rows if r["config"] == c and r["mode"] == mode), None) for c in configs]
            ys = [yy + off for yy, p in zip(y, pts) if p is not None]
            xs = [p[metric] for p in pts if p is not None]
            err = [
                [p[metric] - p[f"{metric}_ci"][0] for p in pts if p],
                [p[f"{metric}_ci"][1] - p[metric] for p in pts if p],
            ]
            ax.errorbar(xs, ys, xerr=err, fmt="o", color=color, label=mode, capsize=3)
        ax.set_yticks(y, configs)
        ax.invert_yaxis()
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    if configs:
        axes[0].set_xscale("log")
    if has_passkey:
        ax = axes[2]
        summary = doc["passkey_summary"]
        for cfg in dict.fromkeys(s["config"] for s in summary):
            pts = sorted((s["length"], s["hits"] / s["cases"]) for s in summary if s["config"] == cfg)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=cfg)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("prompt length (tokens)")
        ax.set_ylabel("passkey retrieval")
        ax.set_ylim(-0.05, 1.05)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(
        f"KV cache accuracy: {doc['model']} ({doc['device']}, baseline = {doc['baseline_dtype']} cache)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
