"""Engine counters and SGLang's periodic log lines (kept verbatim so existing log parsers work)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class EngineStats:
    """Totals since start-up plus the window behind the next ``Decode batch.`` line."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished_requests: int = 0
    aborted_requests: int = 0
    decode_steps: int = 0
    _window_tokens: int = 0
    _window_start: float = field(default_factory=time.monotonic)

    def record_decode(self, num_tokens: int) -> None:
        self.decode_steps += 1
        self.generation_tokens += num_tokens
        self._window_tokens += num_tokens

    def drop_tokens(self, num_tokens: int) -> None:
        """Un-count launched tokens that were discarded (the overlap schedule's one step past a stop)."""
        self.generation_tokens -= num_tokens
        self._window_tokens -= num_tokens

    def take_throughput(self) -> float:
        """Generated tokens per second since the previous call."""
        now = time.monotonic()
        rate = self._window_tokens / max(now - self._window_start, 1e-9)
        self._window_tokens, self._window_start = 0, now
        return rate


def decode_log_line(
    running: int, tokens: int, usage: float, cuda_graph: bool, throughput: float, queued: int
) -> str:
    return (
        f"Decode batch. #running-req: {running}, #token: {tokens}, token usage: {usage:.2f}, "
        f"cuda graph: {cuda_graph}, gen throughput (token/s): {throughput:.2f}, #queue-req: {queued}"
    )


def prefill_log_line(
    new_seqs: int, new_tokens: int, usage: float, running: int, queued: int, cached_tokens: int = 0
) -> str:
    return (
        f"Prefill batch. #new-seq: {new_seqs}, #new-token: {new_tokens}, #cached-token: {cached_tokens}, "
        f"token usage: {usage:.2f}, #running-req: {running}, #queue-req: {queued}"
    )
