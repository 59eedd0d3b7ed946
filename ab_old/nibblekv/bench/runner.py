"""Driving the load: Poisson (or all-at-once) arrivals, a concurrency cap, agentic turn chains."""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
from tqdm import tqdm

from nibblekv.bench.client import RequestResult, Target, send
from nibblekv.bench.datasets import BenchRequest, as_messages


@dataclass(frozen=True)
class LoadShape:
    """How requests arrive: ``request_rate`` per second (inf = all at once), at most
    ``max_concurrency`` in flight (None = no cap)."""

    request_rate: float = math.inf
    max_concurrency: int | None = None
    seed: int = 0
    timeout_s: float = 600.0
    progress: bool = True


def num_requests(requests: list[BenchRequest]) -> int:
    """HTTP requests a workload sends (an agentic session sends one per turn)."""
    return sum(1 + len(r.tool_outputs) for r in requests)


async def _arrivals(requests: list[BenchRequest], shape: LoadShape) -> AsyncIterator[BenchRequest]:
    """The requests, spaced by exponential gaps of mean ``1 / request_rate``."""
    rng = random.Random(shape.seed)
    for req in requests:
        yield req
        if math.isfinite(shape.request_rate) and shape.request_rate > 0:
            await asyncio.sleep(rng.expovariate(shape.request_rate))


class _Runner:
    """Sends a workload and collects one :class:`RequestResult` per HTTP request."""

    def __init__(self, client: httpx.AsyncClient, target: Target, shape: LoadShape, bar: tqdm | None) -> None:
        self.client = client
        self.target = target
        self.limit = asyncio.Semaphore(shape.max_concurrency) if shape.max_concurrency else None
        self.bar = bar
        self.results: list[RequestResult] = []

    async def one(self, prompt: object, output_len: int) -> RequestResult:
        async with self.limit if self.limit else contextlib.nullcontext():
            result = await send(self.client, self.target, prompt, output_len)
        self.results.append(result)
        if self.bar is not None:
            self.bar.update(1)
        return result

    async def item(self, req: BenchRequest) -> None:
        """A plain request, or an agentic session turn by turn (each turn waits for the last reply)."""
        if not req.tool_outputs:
            await self.one(req.prompt, req.output_len)
            return
        history = as_messages(req.prompt)
        for tool_output in [None, *req.tool_outputs]:
            if tool_output is not None:
                # Tool results go in as user turns: not every chat template accepts a "tool" role.
                history = [*history, {"role": "user", "content": tool_output}]
            result = await self.one(history, req.output_len)
            if not result.success:
                return  # a session cannot continue without its reply
            history = [*history, {"role": "assistant", "content": result.text}]


async def run_benchmark(
    target: Target, requests: list[BenchRequest], shape: LoadShape
) -> tuple[list[RequestResult], float]:
    """Send the workload; return the results and the wall time in seconds."""
    total = num_requests(requests)
    bar = tqdm(total=total, desc="requests", unit="req", disable=not shape.progress)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=shape.max_concurrency or 100)
    async with httpx.AsyncClient(timeout=httpx.Timeout(shape.timeout_s), limits=limits) as client:
        runner = _Runner(client, target, shape, bar)
        start = time.perf_counter()
        tasks = [asyncio.create_task(runner.item(req)) async for req in _arrivals(requests, shape)]
        await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    bar.close()
    return runner.results, duration
