"""Plot a host-work A/B (``device/s35.sh``): decode step time vs the GPU's busy time, per tree and KV dtype.

Usage: ``python benchmarks/plot_host.py benchmarks/results/host-s35a-h200`` -> ``host-ab.png`` there
(reads ``long-base.json`` / ``long-new.json``: ``bench_engine.py --part long`` rows with profiled steps).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(folder: str) -> Path:
    d = Path(folder)
    rows = {tree: json.loads((d / f"long-{tree}.json").read_text()) for tree in ("base", "new")}
    dtypes = [r["kv_dtype"] for r in rows["base"]["rows"]]
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.2
    for k, dt in enumerate(dtypes):
        for j, tree in enumerate(("base", "new")):
            r = next(x for x in rows[tree]["rows"] if x["kv_dtype"] == dt)
            x = k + (j - 0.5) * 2.2 * width
            ax.bar(x, r["step_ms"], width, color="C0" if tree == "base" else "C2",
                   label=f"step ({tree}: {rows[tree]['commit']})" if k == 0 else None)
            busy = "GPU busy" if k == j == 0 else None
            ax.bar(x + width, r["gpu_busy_ms_per_step"], width, color="0.6", label=busy)
            ax.text(x, r["step_ms"], f"{r['step_ms']:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(dtypes)), dtypes)
    r0 = rows["base"]["rows"][0]
    ax.set_ylabel("ms per decode step")
    ax.set_title(f"{r0['model']}, {r0['running_requests']} running requests of ~{r0['input_len']} tokens "
                 f"({rows['base'].get('device', 'H200')})", fontsize=9)
    ax.legend(fontsize=8)
    out = d / "host-ab.png"
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    return out


if __name__ == "__main__":
    print(main(sys.argv[1]))
