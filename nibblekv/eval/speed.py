"""``nibblekv eval speed``: decode-step time of each KV configuration at a long context, on the device.

The cache is filled by growing each request's pages to ``context`` tokens *without* a prefill (the
pages keep whatever bytes they hold: decode time does not depend on the values), then ``steps``
decode steps of the whole model are timed, median over steps. This prices the options: the bf16 tail
(more bytes read per token), the Hadamard rotation (three small matmuls per layer), calibrated scales
and 4over6 (free at decode: the stored format is unchanged).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch

from nibblekv.eval.configs import KVConfig
from nibblekv.eval.paged_runner import PagedRunner
from nibblekv.model import CausalLM


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def decode_step_ms(
    model: CausalLM, config: KVConfig, *, batch: int, context: int, steps: int = 20, warmup: int = 3
) -> float:
    """Median wall time (ms) of one decode step of ``batch`` requests at ``context`` tokens."""
    scales = torch.ones(model.config.num_kv_layers, 2) if config.calibrated else None
    runner = PagedRunner(
        model, config, max_requests=batch, max_len=context + steps + warmup + 1, global_scales=scales
    )
    runner.start(batch)
    for pages in runner.requests:
        g = runner.manager.grow(pages, context)
        runner.manager.finish_growth(g)
    ids = [[1] for _ in range(batch)]
    times: list[float] = []
    for i in range(warmup + steps):
        _sync(model.device)
        t0 = time.perf_counter()
        runner.step(ids)
        _sync(model.device)
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    runner.release()
    return statistics.median(times)


def speed_table(
    model: CausalLM, configs: Sequence[KVConfig], batch: int, context: int, steps: int,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, object]]:  # fmt: skip
    """One row per configuration: median decode-step ms and the ratio to the first configuration."""
    rows: list[dict[str, object]] = []
    for cfg in configs:
        ms = decode_step_ms(model, cfg, batch=batch, context=context, steps=steps)
        rows.append({"config": cfg.name, "batch": batch, "context": context, "step_ms": ms})
        if progress is not None:
            progress(f"speed {cfg.name}: {ms:.2f} ms/step")
    base = float(rows[0]["step_ms"])  # type: ignore[arg-type]
    for r in rows:
        r["vs_first"] = float(r["step_ms"]) / base  # type: ignore[arg-type]
    return rows
