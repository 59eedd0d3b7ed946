"""Summaries of Nsight Compute reports for the ncu tools (``ncu_decode.py``, ``ncu_fp8_gemm.py``).

``kernel_rows``: per profiled kernel of ncu's raw page (``ncu -i REP --page raw --csv``), labelled by the
``profiling ...`` lines of the run's log (``benchmarks.timing.profile_once``): time, DRAM read rate, SM
activity, a scheduler's issue-active share and its eligible and resident warps a cycle, the busiest pipes
and every warp-stall reason as a share of the samples. ``sass_hotspots``: from ncu's source page (``--page
source --csv --print-source sass``), the SASS lines with the most warp samples and each one's largest stall
reasons.
"""

from __future__ import annotations

import csv
import datetime
import io
import json
import os
import re
from pathlib import Path

STALL = "smsp__pcsamp_warps_issue_stalled_"
PIPE = re.compile(r"^sm__inst_executed_pipe_(\w+?)\.avg\.pct_of_peak_sustained_active$")
ISSUE = "smsp__issue_active.avg.pct_of_peak_sustained_active"  # a scheduler's cycles that issued
ELIGIBLE = "smsp__warps_eligible.avg.per_cycle_active"  # warps ready to issue, per scheduler and cycle
ACTIVE = "smsp__warps_active.avg.per_cycle_active"  # resident warps per scheduler
# ncu's units row: its time and byte columns change unit with their size
TIME_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6, "nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}
BYTES_MB = {"byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3, "Tbyte": 1e6}


def write_summary(out: str | None, gpu: str, **parts: object) -> None:
    """The summary JSON (top level ``commit`` from the env var COMMIT, ``gpu``, ``date``, then ``parts``) to
    ``out``, or stdout."""
    doc = dict(
        commit=os.environ.get("COMMIT", "unknown"), gpu=gpu, date=datetime.date.today().isoformat(), **parts
    )
    text = json.dumps(doc, indent=1)
    Path(out).write_text(text + "\n") if out else print(text)


def _top(d: dict[str, float], n: int) -> list[tuple[str, float]]:
    return sorted(d.items(), key=lambda kv: -kv[1])[:n]


def log_labels(log: str) -> list[str]:
    """The ``profiling LABEL`` line printed before each kernel ncu profiled, in profiling order (ncu's ID
    order): each ``==PROF== Profiling "name"`` line of the run's ``log`` takes the label before it."""
    labels: list[str] = []
    label = ""
    for line in Path(log).read_text().splitlines():
        if line.startswith("profiling "):
            label = line[len("profiling ") :]
        elif line.startswith('==PROF== Profiling "'):
            labels.append(label)
    return labels


def kernel_rows(raw_csv: str, log: str, top_stalls: int = 8, top_pipes: int = 6) -> list[dict]:
    """One dict per kernel of the raw page (ncu's ID order); stall shares sum to 1 over all reasons."""
    labels = log_labels(log)
    rows = list(csv.reader(Path(raw_csv).open()))
    hdr, units, data = rows[0], rows[1], rows[2:]

    def num(r: list[str], key: str, scale: dict[str, float] | None = None) -> float:
        if key not in hdr:
            return float("nan")
        i = hdr.index(key)
        return float(r[i].replace(",", "") or 0) * (
            scale[units[i]] if scale else 1.0
        )  # NOTE: unknown units raise

    out = []
    for n, r in enumerate(data):
        stalls = {
            h[len(STALL) :]: num(r, h) for h in hdr if h.startswith(STALL) and not h.endswith("not_issued")
        }
        total = sum(stalls.values()) or 1.0
        pipes = {m[1]: num(r, h) for h in hdr if (m := PIPE.match(h))}
        us = num(r, "gpu__time_duration.sum", TIME_US)
        dram_mb = num(r, "dram__bytes_read.sum", BYTES_MB)
        out.append(dict(
            id=int(r[0]), label=labels[n] if n < len(labels) else "", kernel=r[hdr.index("Kernel Name")],
            grid=r[hdr.index("Grid Size")], block=r[hdr.index("Block Size")], us=round(us, 3),
            dram_read_mb=round(dram_mb, 3), dram_tb_s=round(dram_mb / us, 3),
            sm_active_frac=round(num(r, "sm__cycles_active.avg") / num(r, "sm__cycles_elapsed.avg"), 3),
            issue_active_pct=round(num(r, ISSUE), 1), eligible_warps=round(num(r, ELIGIBLE), 3),
            active_warps=round(num(r, ACTIVE), 3),
            registers=num(r, "launch__registers_per_thread"),
            waves_per_sm=num(r, "launch__waves_per_multiprocessor"),
            top_pipes_pct={k: round(v, 1) for k, v in _top(pipes, top_pipes)},
            stall_share={k: round(v / total, 3) for k, v in _top(stalls, top_stalls)},
        ))  # fmt: skip
    return out


def sass_hotspots(source_csv: str, top: int = 25, reasons: int = 3) -> list[dict]:
    """The ``top`` SASS lines by warp samples (share of all the kernel's samples), each with its ``reasons``
    largest stall columns (ncu's source page: one row per SASS instruction, a ``Source`` column, a
    ``Warp Stall Sampling (All Samples)`` column and one column per stall reason)."""
    text = Path(source_csv).read_text()
    start = text.find('"Address"') if '"Address"' in text else text.find("Address")
    rows = list(csv.reader(io.StringIO(text[start:])))
    hdr = rows[0]
    samples = next(i for i, h in enumerate(hdr) if h.startswith("Warp Stall Sampling (All"))
    src = hdr.index("Source")
    stall_cols = [i for i, h in enumerate(hdr) if h.startswith("stall_") and not h.endswith("(Not Issued)")]

    def val(r: list[str], i: int) -> float:
        try:
            return float(r[i].replace(",", "") or 0)
        except (ValueError, IndexError):
            return 0.0

    body = [r for r in rows[1:] if len(r) == len(hdr)]
    total = sum(val(r, samples) for r in body) or 1.0
    hot = sorted(body, key=lambda r: -val(r, samples))[:top]
    out = []
    for r in hot:
        why = sorted(((hdr[i], val(r, i)) for i in stall_cols), key=lambda kv: -kv[1])[:reasons]
        out.append(dict(
            address=r[hdr.index("Address")] if "Address" in hdr else "", sass=r[src].strip(),
            share=round(val(r, samples) / total, 4), stalls={k: v for k, v in why if v > 0},
        ))  # fmt: skip
    return out
