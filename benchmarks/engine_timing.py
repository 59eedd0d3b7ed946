"""Timing an engine's steps, shared by the engine benchmarks (bench_engine, bench_long_context, bench_tp,
bench_prefix, tools/profile_host): the model their engines share, the read bandwidth and each step's memory
floor, requests admitted with their prompt's pages allocated but not computed, the decode steps at full
batch, and the torch profiler's view of a few steps.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import time
from typing import Any, Callable, Generic, Iterator, TypeVar

import torch

from nibblekv.config import EngineConfig
from nibblekv.engine.engine import Engine
from nibblekv.engine.request import Request, RequestStatus
from nibblekv.engine.sampling_params import SamplingParams
from nibblekv.engine.setup import kv_rotation_planned


def rotating_last(kv_dtypes: list[str]) -> list[str]:
    """``kv_dtypes`` with nvfp4 (whose cache rotates K/V by a Hadamard matrix) last: engines sharing one
    model change basis once (a :class:`SharedModel` reload; with a model loaded once, the fold an nvfp4
    engine makes in a bf16 o_proj, which a later bf16 / fp8 engine would pay for with a matmul a layer)."""
    return sorted(kv_dtypes, key=lambda kv: kv == "nvfp4")


L = TypeVar("L", bound=tuple)


class SharedModel(Generic[L]):
    """The model a benchmark's engines share, loaded in the o_proj basis the next engine's KV cache needs.

    ``load(kv_rotation)`` loads it (``load_model``'s ``kv_rotation``: nvfp4's Hadamard rotation folded into
    o_proj, before FP8 quantization); :meth:`get` reloads it (the same seed: the same weights) when an
    engine needs the other basis. NOTE: a bf16 / fp8 engine on a folded model would rotate every layer's
    output into that basis (one more launch a layer), and an nvfp4 engine on an unfolded FP8 model would
    rotate its output back: either biases the comparison."""

    def __init__(self, load: Callable[[bool], L]) -> None:
        self._load = load
        self._rotation: bool | None = None
        self._loaded: L | None = None

    def get(self, cfg: EngineConfig) -> L:
        """The loaded model (and whatever ``load`` returns with it) for an engine of ``cfg``."""
        rotation = kv_rotation_planned(cfg)
        if self._loaded is None or rotation != self._rotation:
            self.release()
            self._loaded, self._rotation = self._load(rotation), rotation
        return self._loaded

    @property
    def current(self) -> L:
        """The model as loaded now (for what does not depend on the basis: its config, its weight bytes)."""
        if self._loaded is None:
            self._loaded, self._rotation = self._load(False), False
        return self._loaded

    def release(self) -> None:
        """Drop the model (hold no other reference to it: its memory goes back before the next load)."""
        self._loaded = None
        free_memory()


def free_memory() -> None:
    """Give a dropped engine's pool and graphs back (call after ``del engine``)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def read_bandwidth(device: torch.device, gib: float) -> float:
    """Best of a full read (``x.sum()``) and a copy (read + write bytes), bytes/s."""
    best = _bandwidth_probe(device, gib)
    # NOTE: hand the probe's 8 GiB back to the driver (its buffers died with the probe): engines size their
    # pool from the free memory, and the first one read ~4% low while the allocator still cached them.
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return best


def _bandwidth_probe(device: torch.device, gib: float) -> float:
    n = int(gib * (1 << 30)) // 2
    x = torch.ones(n, dtype=torch.bfloat16, device=device)
    y = torch.empty_like(x)
    best = 0.0
    for fn, nbytes in ((lambda: x.sum(), 2 * n), (lambda: y.copy_(x), 4 * n)):
        fn()
        times = []
        for _ in range(10):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
        best = max(best, nbytes / statistics.median(times))
    return best


def kv_bytes_read(engine: Engine) -> int:
    """K/V bytes a decode step over the running requests reads (main + tail, all layers)."""
    spec = engine.pool.spec
    main_bpt, tail_bpt = spec.layout.bytes_per_token(), spec.tail_layout.bytes_per_token()
    total = 0
    for r in engine.scheduler.running:
        main = min(r.pages.num_main, r.num_tokens)
        total += main * main_bpt + (r.num_tokens - main) * tail_bpt
    return total * spec.num_layers


def admit_with_prefix(engine: Engine, req: Request, cached: int) -> None:
    """Admit ``req`` running, its first ``cached`` tokens' pages allocated but not computed: the scheduler
    prefills the rest (in chunks, the extend path over that prefix) as if a prefix cache had held them."""
    sched = engine.scheduler
    engine.enqueue(req)
    sched.waiting.remove(req)
    if cached:
        sched.cache.finish_growth(sched.cache.grow(req.pages, cached))
    if sched.states is not None:  # a hybrid model's linear-attention state (left zero: timing only)
        req.state_slot = sched.states.alloc()
    req.status = RequestStatus.RUNNING
    sched.running.append(req)


def synthetic_prefill(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> None:
    """Admit every request with its prompt's pages allocated but not computed, plus one sampled token."""
    for p in prompts:
        req = engine.make_request(p, params)
        admit_with_prefix(engine, req, req.num_tokens)
        req.token_ids.append(p[-1])


@contextlib.contextmanager
def kernel_profile() -> Iterator[list[dict[str, Any]]]:
    """Profile the block (GPU kernels on CUDA, else CPU ops); on exit the yielded list holds every kernel
    that took time: ``{"kernel", "us" (total), "calls"}``, most time first."""
    from torch.profiler import ProfilerActivity, profile

    gpu = torch.cuda.is_available()
    rows: list[dict[str, Any]] = []
    with profile(activities=[ProfilerActivity.CUDA if gpu else ProfilerActivity.CPU]) as prof:
        yield rows
        sync()
    for ev in prof.key_averages():
        us = ev.device_time_total if gpu else ev.self_cpu_time_total
        if us > 0:
            rows.append({"kernel": ev.key[:90], "us": us, "calls": ev.count})
    rows.sort(key=lambda r: -r["us"])


def profiled(engine: Engine, n: int, top: int = 12) -> dict[str, Any]:
    """Run ``n`` engine steps under the torch profiler: per step, the wall time, the summed time of all
    GPU kernels (busy), the kernel count, and the ``top`` kernels with the most total time. Wall minus busy is
    the time the GPU waited for the host (or for launches)."""
    sync()
    t0 = time.perf_counter()
    with kernel_profile() as rows:
        for _ in range(n):
            engine.step()
    wall = time.perf_counter() - t0
    top = [
        {"kernel": r["kernel"], "ms_per_step": round(r["us"] / 1e3 / n, 3), "calls_per_step": r["calls"] / n}
        for r in rows[:top]
    ]
    return {
        "top_kernels": top,
        "profiled_step_ms": round(1e3 * wall / n, 3),  # includes the profiler's own overhead
        "gpu_busy_ms_per_step": round(sum(r["us"] for r in rows) / 1e3 / n, 3),
        "kernels_per_step": sum(r["calls"] for r in rows) / n,
    }


def decode_weight_bytes(model: torch.nn.Module) -> int:
    """Parameter bytes a decode step reads: all of them but an untied embedding table, of which a step reads
    only its tokens' rows (with tied embeddings the LM head reads the whole table)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    embed = model.model.embed_tokens.weight  # type: ignore[union-attr]
    if getattr(model, "lm_head", None) is not None:
        total -= embed.numel() * embed.element_size()
    return total


def decode_run(
    engine: Engine, prompts: list[list[int]], params: SamplingParams, synthetic: bool, bandwidth: float,
    profile_steps: int = 0, profile_top: int = 12,
) -> dict[str, Any]:  # fmt: skip
    """Run to completion; time the decode steps that run the full batch."""
    weights = decode_weight_bytes(engine.model)
    if synthetic:
        synthetic_prefill(engine, prompts, params)
    else:
        for p in prompts:
            engine.add_request(p, params)
    steps: list[tuple[int, float, float]] = []  # (batch size, seconds, floor seconds)
    prof: dict[str, Any] = {}
    # NOTE: with the overlap schedule a step launches the next batch before it returns; a sync around
    # each step would leave the GPU idle while the host schedules. There, a step's time is the host interval
    # between steps, which the GPU paces.
    barrier = (lambda: None) if engine.overlap_schedule else sync
    while engine.has_unfinished():
        floor = (weights + kv_bytes_read(engine)) / bandwidth
        # once, after the first steps' compiles and graph captures
        profile = profile_steps > 0 and len(steps) == 3 and not prof
        barrier()
        t0 = time.perf_counter()
        if profile:
            prof = profiled(engine, profile_steps, profile_top)
        else:
            engine.step()
        barrier()
        batch = engine.last_batch
        if batch is not None and batch.is_decode and not profile:
            steps.append((len(batch.reqs), time.perf_counter() - t0, floor))
    full = max(bs for bs, _, _ in steps)
    at_full = [(bs, t, f) for bs, t, f in steps if bs == full]
    # NOTE: the first full step pays one-time costs (Triton compiles, CUDA-graph capture): reported apart
    timed = at_full[1:] or at_full
    step = statistics.median(t for _, t, _ in at_full)
    return {
        "running_requests": full,
        "decode_tok_s": round(sum(bs for bs, _, _ in timed) / sum(t for _, t, _ in timed), 1),
        "first_step_ms": round(1e3 * at_full[0][1], 3),
        "max_step_ms": round(1e3 * max(t for _, t, _ in timed), 3),
        **({"top_kernels": []} | prof),
        "step_ms": round(1e3 * step, 3),
        # NOTE: the steady state, running requests over the median step: decode_tok_s also averages in the
        # second step (one-time costs, 41-88 ms at 26 x 32K on the H200), the short step after the profiled
        # ones and the last (26 requests' pages freed, 44-63 ms): FP8's unchanged path read 1397.8 and 1432.3
        # tok/s in two runs of one session, 17.84 and 17.92 ms median steps (engine-matched-s40*-h200/)
        "steady_tok_s": round(full / step, 1),
        "step_floor_ms": round(1e3 * statistics.median(f for _, _, f in at_full), 3),
        "decode_steps_at_full": len(at_full),
        # every timed decode step in order (batch size, ms): where a slow step falls says what it was
        "steps": [[bs, round(1e3 * t, 3)] for bs, t, _ in steps],
        "cuda_graph": engine.runner.last_used_graph,
        "overlap": engine.overlap_schedule,
    }
