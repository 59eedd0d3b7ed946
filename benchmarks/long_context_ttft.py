"""Time to first token at long context, for ``bench_long_context.py``: real prefills, their top kernels, and
a chunk-sampled estimate where a real prefill does not fit a device call (1M tokens: ~18 min on an H200).

A chunked prefill of ``L`` tokens runs ``ceil(L / C)`` chunks of ``C`` tokens; chunk ``i`` attends over
``i * C`` cached tokens, so its time is linear in its offset (fixed GEMM work plus attention over the prefix).
:func:`sampled_ttft` times single chunks at a few offsets, each over a synthetic prefix (pages allocated, not
computed: the time does not depend on the cached values) and after its previous chunk (computed, untimed),
fits ``t(offset) = a + b * offset`` and sums it over the prefill's chunks. Where a real TTFT is measured too,
the row carries both: the method's own check.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from engine_timing import admit_with_prefix, kernel_profile, sync

from nibblekv.engine.engine import Engine
from nibblekv.engine.sampling_params import SamplingParams

ONE_TOKEN = SamplingParams(temperature=0, max_new_tokens=1, ignore_eos=True)


@dataclass
class PrefillTimes:
    """Per KV dtype, measured once per input length and reused by its rows: real TTFTs (s), the top
    prefill kernels, and the chunk-sampled estimate."""

    real: dict[str, list[float]] = field(default_factory=dict)
    kernels: dict[str, dict[str, Any]] = field(default_factory=dict)
    sampled: dict[str, dict[str, Any]] = field(default_factory=dict)

    def row_fields(self, kv: str) -> dict[str, Any]:
        """A row's TTFT fields for ``kv``: ``ttft_kind`` real where measured, else sampled, else synthetic
        (none); the sampled estimate beside a real one as ``ttft_sampled``."""
        sampled = self.sampled.get(kv)
        if kv in self.real:
            out: dict[str, Any] = {"ttft_mean_s": round(sum(self.real[kv]) / len(self.real[kv]), 4),
                                   "ttft_kind": "real", "ttft_s": [round(x, 4) for x in self.real[kv]],
                                   **self.kernels.get(kv, {})}  # fmt: skip
        elif sampled is not None:
            out = {"ttft_mean_s": sampled["estimate_s"], "ttft_kind": "sampled", "ttft_s": []}
        else:
            out = {"ttft_mean_s": None, "ttft_kind": "synthetic", "ttft_s": []}
        return out | ({"ttft_sampled": sampled} if sampled is not None else {})


def measure_ttft(engine: Engine, prompt: list[int], k: int, chunk: int) -> list[float]:
    """Seconds to the first token of ``k`` requests prefilled one after another (after an untimed warm-up
    prompt of two chunks and a bit, so Triton's compiles and the extend path's first use stay out)."""
    engine.generate([prompt[: min(len(prompt), 2 * chunk + 100)]], ONE_TOKEN)
    times = []
    for _ in range(k):
        sync()
        t0 = time.perf_counter()
        engine.generate([prompt], ONE_TOKEN)
        sync()
        times.append(time.perf_counter() - t0)
    return times


def prefill_kernels(engine: Engine, prompt: list[int], top: int = 10) -> dict[str, Any]:
    """One real prefill of ``prompt`` under the torch profiler: the GPU's busy time and the ``top`` kernels
    by total time (the quantizing cache write, the extend kernel over the cached prefix, the GEMMs ...), so
    the dtypes' prefill cost compares kernel by kernel in one run."""
    with kernel_profile() as rows:
        engine.generate([prompt], ONE_TOKEN)
    return {
        "prefill_busy_ms": round(sum(r["us"] for r in rows) / 1e3, 3),
        "prefill_kernels": [{"kernel": r["kernel"], "ms": round(r["us"] / 1e3, 3), "calls": r["calls"]}
                            for r in rows[:top]],  # fmt: skip
    }


def chunk_seconds(engine: Engine, prompt: list[int], offset: int, chunk: int) -> float:
    """Seconds of one engine step that prefills ``prompt[offset : offset + chunk]`` as a chunk inside a longer
    prefill runs: the prefix up to the previous chunk synthetic, the previous chunk computed first (untimed:
    its bf16 prefill window is what this chunk reads and demotes), one more token after it (so the window
    applies to it too), drained untimed. A prompt of at most one chunk runs whole (its only chunk)."""
    ids = prompt[: offset + chunk]
    if not (offset == 0 and len(prompt) <= chunk):
        ids = ids + ids[:1]
    req = engine.make_request(ids, ONE_TOKEN)
    admit_with_prefix(engine, req, max(0, offset - chunk))
    if offset:
        engine.step()  # the previous chunk
    sync()
    t0 = time.perf_counter()
    engine.step()
    sync()
    seconds = time.perf_counter() - t0
    while engine.has_unfinished():
        engine.step()
    sync()
    return seconds


def chunk_offsets(input_len: int, chunk: int, samples: int) -> list[int]:
    """``samples`` offsets of whole chunks spread evenly over a prefill of ``input_len`` tokens (the first and
    the last whole chunk included; fewer where the prefill has fewer): a short last chunk is not timed, its
    time not being its tokens' share of a whole one's (the prefix it reads costs the same)."""
    last = max(0, input_len // chunk - 1)
    if samples < 2 or last == 0:
        return [0]
    return sorted({round(j * last / (samples - 1)) * chunk for j in range(samples)})


def sampled_ttft(engine: Engine, prompt: list[int], chunk: int, samples: int) -> dict[str, Any]:
    """The chunk-sampled TTFT of ``prompt`` (module docstring): ``estimate_s``, the timed ``chunks``
    (``[offset, s]``), the fit ``a_s`` + ``b_s_per_token`` * offset. A chunk of two tokens runs first,
    untimed (compiles). A prompt shorter than a chunk is timed whole."""
    n = len(prompt)
    chunk_seconds(engine, prompt, 0, min(chunk, n, 2))
    offsets = chunk_offsets(n, chunk, samples)
    times = [chunk_seconds(engine, prompt, off, min(chunk, n)) for off in offsets]
    if len(offsets) == 1:
        a, b = times[0], 0.0
    else:  # least squares of t = a + b * offset
        mx, my = sum(offsets) / len(offsets), sum(times) / len(times)
        b = sum((x - mx) * (y - my) for x, y in zip(offsets, times)) / sum((x - mx) ** 2 for x in offsets)
        a = my - b * mx
    # NOTE: a short last chunk counted at its tokens' share of a whole one's fit (an estimate; the inputs of
    # the published table are whole multiples of the 8K chunk)
    estimate = sum((a + b * off) * min(chunk, n - off) / min(chunk, n) for off in range(0, n, chunk))
    return {
        "estimate_s": round(estimate, 4),
        "chunks": [[off, round(t, 4)] for off, t in zip(offsets, times)],
        "a_s": round(a, 5),
        "b_s_per_token": b,
    }
