"""Prometheus metrics (``/metrics``), named like SGLang's (``nibblekv:`` instead of ``sglang:``).

Counters and latency histograms are updated by the request handlers; gauges that describe the engine
(running, queued, token usage) are read from ``engine.stats()`` at scrape time, so they are never stale.
Each app gets its own registry, so several servers (or tests) can live in one process.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

disable_created_metrics()  # the *_created series only clutter the exposition

# Latency buckets (seconds): sub-ms decode steps on a GPU up to minutes-long CPU prefills.
_TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    15.0,
    20.0,
    30.0,
    60.0,
    120.0,
)
_ITL_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
)


def _stat(stats: Any, *names: str, default: float = 0.0) -> float:
    """First present attribute (or key) of an engine stats object."""
    for name in names:
        value = stats.get(name) if isinstance(stats, dict) else getattr(stats, name, None)
        if value is not None:
            return float(value)
    return default


class _EngineCollector(Collector):
    """Gauges read from the engine when Prometheus scrapes."""

    def __init__(self, stats: Callable[[], Any], max_total_tokens: int, counters: ServerMetrics) -> None:
        self._stats = stats
        self._max_total_tokens = max_total_tokens
        self._counters = counters

    def collect(self) -> Iterator[GaugeMetricFamily]:
        stats = self._stats()
        yield _gauge(
            "num_running_reqs", "Requests in the running batch", _stat(stats, "running", "num_running")
        )
        yield _gauge(
            "num_queue_reqs", "Requests waiting for a batch slot", _stat(stats, "queued", "num_queued")
        )
        yield _gauge(
            "num_used_tokens", "KV cache tokens in use", _stat(stats, "used_tokens", "num_used_tokens")
        )
        yield _gauge("token_usage", "Fraction of the KV cache in use", _stat(stats, "token_usage"))
        yield _gauge("max_total_num_tokens", "KV cache capacity in tokens", float(self._max_total_tokens))
        yield _gauge(
            "cache_hit_rate",
            "Prompt tokens served from the prefix cache / all prompt tokens",
            self._counters.cache_hit_rate(),
        )


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(f"nibblekv:{name}", doc)
    family.add_metric([], value)
    return family


@dataclass
class ServerMetrics:
    """The server's metrics registry and the handles handlers update."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.prompt_tokens = Counter("nibblekv:prompt_tokens", "Prompt tokens processed", registry=r)
        self.generation_tokens = Counter("nibblekv:generation_tokens", "Tokens generated", registry=r)
        self.cached_tokens = Counter(
            "nibblekv:cached_tokens", "Prompt tokens served from the prefix cache", registry=r
        )
        self.requests = Counter(
            "nibblekv:num_requests", "Finished requests by outcome", ["outcome"], registry=r
        )
        self.ttft = Histogram(
            "nibblekv:time_to_first_token_seconds", "Time to first token", registry=r, buckets=_TTFT_BUCKETS
        )
        self.itl = Histogram(
            "nibblekv:inter_token_latency_seconds",
            "Time between output tokens",
            registry=r,
            buckets=_ITL_BUCKETS,
        )
        self.e2e = Histogram(
            "nibblekv:e2e_request_latency_seconds", "Request latency", registry=r, buckets=_TTFT_BUCKETS
        )
        self._prompt_total = 0
        self._cached_total = 0

    def attach_engine(self, stats: Callable[[], Any], max_total_tokens: int) -> None:
        """Register the scrape-time engine gauges."""
        self.registry.register(_EngineCollector(stats, max_total_tokens, self))

    def record_finished(self, prompt: int, generated: int, cached: int) -> None:
        """Count one finished generation's tokens."""
        self.prompt_tokens.inc(prompt)
        self.generation_tokens.inc(generated)
        self.cached_tokens.inc(cached)
        self._prompt_total += prompt
        self._cached_total += cached

    def cache_hit_rate(self) -> float:
        """Cached prompt tokens / prompt tokens so far (0 before any request)."""
        return self._cached_total / self._prompt_total if self._prompt_total else 0.0

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)


class TokenTimer:
    """Measures TTFT and inter-token latency of one generation as its deltas arrive."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self._metrics = metrics
        self._start = time.perf_counter()
        self._last: float | None = None

    def on_tokens(self, count: int) -> None:
        """Record the arrival of ``count`` new tokens (ITL is split evenly across a multi-token delta)."""
        if count <= 0:
            return
        now = time.perf_counter()
        if self._last is None:
            self._metrics.ttft.observe(now - self._start)
            count -= 1
        elif count:
            gap = (now - self._last) / count
            for _ in range(count):
                self._metrics.itl.observe(gap)
        self._last = now

    def on_finish(self) -> None:
        """Record the request's end-to-end latency."""
        self._metrics.e2e.observe(time.perf_counter() - self._start)
