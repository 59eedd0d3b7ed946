"""GPU timing shared by the kernel benchmarks (bench_kernels, bench_extend, bench_decode_variants).

Kernel time as the engine sees it: a CUDA graph of the call replayed with L2 emptied before each call
(``bench_graph``), a read-bandwidth ceiling to compare against (``read_ceiling``), per-kernel times from
torch.profiler (``kernel_breakdown``) and the GPU's clock / power / temperature after a row
(``gpu_state``). On CPU (``DEV == "cpu"``, the ``--smoke`` runs under ``TRITON_INTERPRET=1``) every timer
is the wall clock of one call: the smoke runs check the code path and the rows, not the numbers.
"""

from __future__ import annotations

import re
import subprocess
import time

import torch
import triton
import triton.language as tl

GiB = 1 << 30
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def bench(fn, rep_ms: int = 200) -> float:  # type: ignore[no-untyped-def]
    """Median microseconds of ``fn`` (CUDA events via triton.testing.do_bench; on CPU the wall clock of one
    call: the interpreter smoke tests only check the rows, and every call there costs seconds)."""
    if DEV == "cpu":
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6
    return float(triton.testing.do_bench(fn, warmup=25, rep=rep_ms, return_mode="median")) * 1e3


_FLUSH: torch.Tensor | None = None


def _flush_buffer() -> torch.Tensor:
    """256 MB, read (or zeroed) before every timed call: larger than the H200's 50 MB L2."""
    global _FLUSH
    if _FLUSH is None:
        _FLUSH = torch.zeros(256 << 20, dtype=torch.int8, device=DEV)
    return _FLUSH


# NOTE: how bench_graph empties L2 before each timed call. "read" (the default) streams the 256 MB buffer
# through L2, leaving only clean lines; "write" (zero_()) leaves ~50 MB of dirty lines that the timed
# kernel's own misses must write back to HBM first (~10 us charged to a 50-100 us call); "none" replays the
# calls back to back (an engine-like warm L2: only shapes under ~50 MB can hit).
FLUSH = "read"
FLUSH_MODES = ("read", "write", "none")
SETTLE_S = 0.1  # untimed replays before each row's trials (_settle); 0 = none


def set_flush(mode: str) -> None:
    """Sets ``FLUSH`` (the benchmarks' ``--flush``)."""
    global FLUSH
    if mode not in FLUSH_MODES:
        raise ValueError(f"flush mode {mode!r} is not one of {FLUSH_MODES}")
    FLUSH = mode


def _flusher():  # type: ignore[no-untyped-def]
    """The call that empties L2 under ``FLUSH`` (None for "none")."""
    if FLUSH == "none":
        return None
    buf = _flush_buffer()
    if FLUSH == "write":
        return buf.zero_
    words = buf.view(torch.float32)  # 64M words in 2048 programs of 8 x 4096
    out = torch.empty(words.numel() // (4096 * 8), dtype=torch.float32, device=DEV)
    grid = (out.numel(),)
    return lambda: _stream_read_kernel[grid](words, out, words.numel(), BLOCK=4096, ITERS=8, num_warps=8)


def bench_graph(fn, reps: int = 20, trials: int = 7) -> float:  # type: ignore[no-untyped-def]
    """Median GPU microseconds of ``fn`` as the engine runs decode: replayed from a CUDA graph (no host
    launch cost), with L2 emptied before every call (``FLUSH``). A graph of ``reps`` x (flush, fn) minus a
    graph of ``reps`` flushes, per call. ``do_bench`` times host launch work too: at B*ctx <= 256K the
    launcher's Python (~150-250 us for three launches on the device's CPU) hid the kernel."""
    if DEV == "cpu":
        return bench(fn)
    flush = _flusher()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the capture stream, as torch.cuda.graph requires
        for _ in range(3):
            fn()
            if flush is not None:
                flush()
    torch.cuda.current_stream().wait_stream(side)
    graphs = (torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph())
    for g, with_fn in zip(graphs, (True, False)):
        with torch.cuda.graph(g):
            for _ in range(reps):
                if flush is not None:
                    flush()
                if with_fn:
                    fn()
    if SETTLE_S > 0:
        _settle(graphs[0], SETTLE_S)
    times: list[list[float]] = [[], []]
    for _ in range(trials):
        for i, g in enumerate(graphs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            g.replay()
            end.record()
            end.synchronize()
            times[i].append(start.elapsed_time(end))
    med = [sorted(t)[len(t) // 2] for t in times]
    del graphs
    return max(med[0] - med[1], 0.0) * 1e3 / reps


# NOTE: bench_kernels' decode rows record the GPU's SM clock, power and temperature right after their trials
# (nvidia-smi; nothing without it). Long NVFP4 rows moved 5-14% with how long the GPU had been busy before
# them: these fields say whether the clock did.
_SMI = ("nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu", "--format=csv,noheader,nounits")


def gpu_tag(name: str | None = None) -> str:
    """A result file's GPU suffix: ``h200`` / ``h100`` for those cards, else the device name lowercased to
    ``[a-z0-9]`` runs (``cpu`` without CUDA). ``name``: a device name to map instead of GPU 0's."""
    if name is None:
        if DEV != "cuda":
            return "cpu"
        name = torch.cuda.get_device_name()
    for tag in ("h200", "h100"):
        if tag in name.lower():
            return tag
    return "-".join(re.findall(r"[a-z0-9]+", name.lower().removeprefix("nvidia"))) or "gpu"


def gpu_state() -> dict[str, float]:
    """``sm_mhz`` / ``power_w`` / ``temp_c`` of GPU 0 now, or {} where nvidia-smi is missing or fails."""
    if DEV != "cuda":
        return {}
    try:
        line = subprocess.run(_SMI, capture_output=True, text=True, timeout=5).stdout.splitlines()[0]
        return dict(zip(("sm_mhz", "power_w", "temp_c"), (float(x) for x in line.split(","))))
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return {}


def _settle(graph: torch.cuda.CUDAGraph, seconds: float = 0.1) -> None:
    """Replays ``graph`` for ~``seconds`` of GPU time, untimed, before its trials.

    NOTE: right after bench_kernels freed its head_dim-128 pools (~53 GB) and filled new head_dim-64 ones,
    the first row timed (BF16 8 x 32K) read 144-147 us for 7 trials (~60 ms of replays) and 129 us when timed
    again at once, in a fresh process, or after these replays (H200): a
    transient of the allocation history, which an engine that allocates its pool once never sees."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    for _ in range(min(50, int(seconds * 1e3 / max(start.elapsed_time(end), 1e-3)))):
        graph.replay()
    torch.cuda.synchronize()


def profile_once(fn, label: str) -> None:  # type: ignore[no-untyped-def]
    """For ``ncu --profile-from-start off``: two warm-up calls of ``fn`` (compile, settle), ``label`` printed,
    then one call between cudaProfilerStart / Stop, the only one ncu profiles."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    print(f"profiling {label}", flush=True)
    torch.cuda.cudart().cudaProfilerStart()
    fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def kernel_breakdown(fn, reps: int = 10) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Mean GPU microseconds per call of each kernel ``fn`` launches (torch.profiler, eager launches, L2
    emptied before every call (``FLUSH``); the flush's own kernel left out): where a launcher's time goes."""
    from torch.profiler import ProfilerActivity, profile

    flush = _flusher() or (lambda: None)
    with profile(activities=[ProfilerActivity.CUDA]) as p0:  # the flush alone: which kernel names to drop
        flush()
        torch.cuda.synchronize()
    flush_names = {e.key for e in p0.key_averages()}
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush()
            fn()
        torch.cuda.synchronize()
    res: dict[str, float] = {}
    for e in prof.key_averages():
        t = float(getattr(e, "self_device_time_total", 0.0) or getattr(e, "self_cuda_time_total", 0.0))
        if e.key in flush_names or t <= 0:
            continue
        res[e.key[:60]] = round(t / reps, 2)
    return dict(sorted(res.items(), key=lambda kv: -kv[1]))


# ----------------------------------------------------------------------------- ceiling


@triton.jit
def _stream_read_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.float32)
    base = pid.to(tl.int64) * BLOCK * ITERS
    for i in range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


def read_ceiling(nbytes: int = 4 * GiB) -> dict[str, float]:
    """The read ceiling's probes over ``nbytes`` of bf16 (TB/s): ``torch_sum_tbps`` and, the higher one,
    ``triton_stream_tbps`` (a streaming Triton read); the buffer is freed before returning."""
    res = _read_probes(nbytes)
    _empty_cache()
    return res


def _read_probes(nbytes: int) -> dict[str, float]:
    x = torch.randn(nbytes // 2, dtype=torch.bfloat16, device=DEV)
    nbytes = x.numel() * 2
    res: dict[str, float] = {}
    us = bench(lambda: x.sum(), 400)
    res["torch_sum_tbps"] = nbytes / us / 1e6
    best = 0.0
    for block, iters, warps in ((4096, 16, 8), (8192, 8, 8), (2048, 32, 4), (8192, 16, 16)):
        grid = triton.cdiv(x.numel(), block * iters)
        out = torch.empty(grid, dtype=torch.float32, device=DEV)
        us = bench(lambda: _stream_read_kernel[(grid,)](x, out, x.numel(), BLOCK=block, ITERS=iters, num_warps=warps), 400)
        best = max(best, nbytes / us / 1e6)
    res["triton_stream_tbps"] = best
    return res


def _empty_cache() -> None:
    if DEV == "cuda":
        torch.cuda.empty_cache()
