"""Benchmark summary: throughput, achieved concurrency and latency percentiles (SGLang's names)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from nibblekv.bench.client import RequestResult


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation, as numpy's default; 0 if empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _summary(name: str, values: Sequence[float]) -> dict[str, float]:
    """Mean, median, p99 (and std) in milliseconds."""
    ms = [v * 1000.0 for v in values]
    return {
        f"mean_{name}_ms": statistics.fmean(ms) if ms else 0.0,
        f"median_{name}_ms": percentile(ms, 50),
        f"p99_{name}_ms": percentile(ms, 99),
        f"std_{name}_ms": statistics.pstdev(ms) if ms else 0.0,
    }


def summarize(results: Sequence[RequestResult], duration: float) -> dict[str, Any]:
    """Aggregate metrics of one run lasting ``duration`` seconds."""
    ok = [r for r in results if r.success]
    duration = max(duration, 1e-9)
    input_tokens = sum(r.prompt_tokens for r in ok)
    output_tokens = sum(r.output_tokens for r in ok)
    tpots = [t for r in ok if (t := r.tpot) is not None]
    metrics: dict[str, Any] = {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration_s": duration,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "total_cached_tokens": sum(r.cached_tokens for r in ok),
        "request_throughput": len(ok) / duration,
        "input_throughput": input_tokens / duration,
        "output_throughput": output_tokens / duration,
        "total_throughput": (input_tokens + output_tokens) / duration,
        # Little's law: time-averaged number of requests in flight.
        "concurrency": sum(r.e2e for r in ok) / duration,
    }
    metrics.update(_summary("e2e_latency", [r.e2e for r in ok]))
    metrics.update(_summary("ttft", [r.ttft for r in ok]))
    metrics.update(_summary("itl", [gap for r in ok for gap in r.itl]))
    metrics.update(_summary("tpot", tpots))
    errors = [r.error for r in results if not r.success]
    metrics["errors"] = sorted(set(errors))[:10]
    return metrics


def format_report(metrics: dict[str, Any], title: str) -> str:
    """A fixed-width table like SGLang's ``bench_serving``."""
    rows = [
        ("Successful requests", metrics["completed"], "d"),
        ("Failed requests", metrics["failed"], "d"),
        ("Benchmark duration (s)", metrics["duration_s"], ".2f"),
        ("Total input tokens", metrics["total_input_tokens"], "d"),
        ("Total generated tokens", metrics["total_output_tokens"], "d"),
        ("Cached input tokens", metrics["total_cached_tokens"], "d"),
        ("Request throughput (req/s)", metrics["request_throughput"], ".2f"),
        ("Input token throughput (tok/s)", metrics["input_throughput"], ".2f"),
        ("Output token throughput (tok/s)", metrics["output_throughput"], ".2f"),
        ("Total token throughput (tok/s)", metrics["total_throughput"], ".2f"),
        ("Concurrency", metrics["concurrency"], ".2f"),
    ]
    lines = [f"{' ' + title + ' ':=^60}"] + [f"{label:<44}{value:>16{fmt}}" for label, value, fmt in rows]
    for key, label in (
        ("e2e_latency", "End-to-End Latency"),
        ("ttft", "Time to First Token"),
        ("itl", "Inter-Token Latency"),
        ("tpot", "Time per Output Token (excl. 1st)"),
    ):
        lines.append(f"{' ' + label + ' ':-^60}")
        for stat in ("mean", "median", "p99"):
            lines.append(
                f"{f'{stat.capitalize()} {key.upper()} (ms)':<44}{metrics[f'{stat}_{key}_ms']:>16.2f}"
            )
    for error in metrics["errors"]:
        lines.append(f"error: {error}")
    lines.append("=" * 60)
    return "\n".join(lines)
