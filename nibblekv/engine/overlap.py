"""Overlap schedule: the host schedules and launches decode step N+1 while the GPU still runs step N.

Why: a decode step's host work (scheduling, page growth, metadata, page-table sync, graph inputs,
demotion launches, sampling sync, stop checks) left the H200 idle 2.7-3.0 ms of every ~15-26 ms step at
24-48 requests of 32K (the engine benchmark, docs/results.md). SGLang hides it the same way.

How: a launched decode step's tokens stay on the device. Each sampling request gets a placeholder token
(``request.placeholder(row)``) so lengths, page growth and the next plan are right without them; the
next decode step reads them on the device (``request.fill_placeholders``). Only after launching that
next step does the host wait for step N's tokens, put them in place and apply token stops.

NOTE (invariants):
- a request has at most two placeholders, its newest tokens: step N's (resolved in this engine step)
  and step N+1's (launched in it); ``Request.num_pending`` counts them, outputs and the prefix cache
  never see them;
- a request that stops at step N was already launched in step N+1: that token is dropped (one wasted
  row), and a request whose pending token is its last (``max_new_tokens``) is not scheduled again;
- only decode batches without penalties or logprobs overlap (those need host tokens); any other batch
  first resolves the pending step, then runs synchronously;
- pages freed while a step is in flight are reused only by later launches, which the device stream
  orders after it (hence a single device: tensor parallelism is refused in ``EngineConfig``). The host
  tier keeps that order: its side stream first waits for everything already queued (the step in flight
  too) and the device stream waits for a copy before it reuses or reads the copy's pages
  (``cache/host_tier.py``); batches that load host pages are prefills, which run synchronously.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from nibblekv.engine.model_runner import ModelRunner
from nibblekv.engine.request import Request, RequestStatus, placeholder
from nibblekv.engine.scheduler import ScheduledBatch, Scheduler
from nibblekv.engine.stats import EngineStats


@dataclass
class Pending:
    """A launched decode step whose tokens are not on the host yet."""

    reqs: list[Request]  # its sampling requests, in row order
    positions: list[int]  # index of each request's placeholder in its token_ids
    tokens: torch.Tensor  # device int64 [rows]
    host: torch.Tensor  # host copy, filled asynchronously
    done: torch.cuda.Event | None  # recorded after the copy (CUDA only)

    def wait(self) -> list[int]:
        if self.done is not None:
            self.done.synchronize()
        return self.host.tolist()


def overlappable(batch: ScheduledBatch) -> bool:
    """Whether ``batch`` can run without its requests' newest tokens on the host (no penalties, logprobs or
    min-tokens mask needs them)."""
    return (
        batch.is_decode
        and not batch.loads
        and all(
            not r.params.penalized
            and r.params.logprobs is None
            and r.params.prompt_logprobs is None
            # NOTE: the host's count lags the token in flight, so this holds for the true count too
            and r.num_output_tokens >= r.params.min_new_tokens
            for r in batch.reqs
        )
    )


class OverlapLoop:
    """The engine step under the overlap schedule (``--enable-overlap-schedule``).

    NOTE: it gets the engine's parts, not the engine (no import back up): ``note_batch`` records a launched
    batch, ``run_batch`` runs a batch the synchronous way and returns the requests it advanced.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        runner: ModelRunner,
        stats: EngineStats,
        note_batch: Callable[[ScheduledBatch], None],
        run_batch: Callable[[ScheduledBatch], list[Request]],
    ) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.stats = stats
        self.note_batch = note_batch
        self.run_batch = run_batch
        self.pending: Pending | None = None

    def before_schedule(self) -> list[Request]:
        """Resolve the pending step if the next decode would preempt or abort for pages (the requests it
        advanced): as in the synchronous loop, that is decided on known tokens, never on a pending one
        that may be a stop token."""
        if self.pending is None or self.scheduler.decode_fits():
            return []
        return self.flush()

    def step(self, batch: ScheduledBatch | None) -> list[Request]:
        """Run ``batch`` (just scheduled); the requests whose tokens reached the host in this call."""
        if batch is not None and overlappable(batch):
            self.runner.backend.loads = batch.loads  # none (overlappable), but never a previous batch's
            reqs, tokens = self.runner.launch(batch, self.pending.tokens if self.pending else None)
            self.scheduler.commit(batch)
            self.note_batch(batch)
            prev, self.pending = self.pending, self._hold(reqs, tokens)
            return self._resolve(prev) if prev is not None else []
        touched = self.flush()
        if batch is not None:
            batch = self._drop_finished(batch)
            if batch.reqs:
                touched += self.run_batch(batch)
        return touched

    def flush(self) -> list[Request]:
        """Bring the pending step's tokens to the host (no-op without one)."""
        prev, self.pending = self.pending, None
        return self._resolve(prev) if prev is not None else []

    @staticmethod
    def _hold(reqs: list[Request], tokens: torch.Tensor) -> Pending:
        positions = []
        for k, r in enumerate(reqs):
            positions.append(len(r.token_ids))
            r.token_ids.append(placeholder(k))
            r.num_pending += 1
        if tokens.is_cuda:
            host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            host.copy_(tokens, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            return Pending(reqs, positions, tokens, host, done)
        return Pending(reqs, positions, tokens, tokens, None)

    def _resolve(self, p: Pending) -> list[Request]:
        """Put the pending step's tokens in place and apply token stops; the requests they advanced."""
        s = self.scheduler
        advanced = []
        for r, pos, token in zip(p.reqs, p.positions, p.wait()):
            if r.status is RequestStatus.FINISHED:  # ended (and emitted) while in flight: drop the rest
                self.stats.drop_tokens(r.num_pending)
                del r.token_ids[pos:]
                r.num_pending = 0
                continue
            advanced.append(r)
            if r.max_new_tokens == 0:  # prompt only (the last prompt token decoded): no output token
                del r.token_ids[pos:]
                r.num_pending = 0
                s.finish(r, "length")
                continue
            r.token_ids[pos] = token
            r.num_pending -= 1
            s.check_stop(r, token)
            if r.status is RequestStatus.FINISHED and r.num_pending:  # launched once more: drop that token
                self.stats.drop_tokens(r.num_pending)
                del r.token_ids[pos + 1 :]
                r.num_pending = 0
        return advanced

    def _drop_finished(self, batch: ScheduledBatch) -> ScheduledBatch:
        """``batch`` without the requests the resolve just ended (their demoted tail pages freed)."""
        keep = [i for i, r in enumerate(batch.reqs) if r.status is not RequestStatus.FINISHED]
        if len(keep) == len(batch.reqs):
            return batch
        for i in set(range(len(batch.reqs))) - set(keep):
            self.scheduler.cache.finish_growth(batch.growths[i])
        batch.reqs = [batch.reqs[i] for i in keep]
        batch.growths = [batch.growths[i] for i in keep]
        new = {old: i for i, old in enumerate(keep)}  # NOTE: a dropped request's snapshot slot went with it
        batch.snapshots = [(new[e], k, slot) for e, k, slot in batch.snapshots if e in new]
        return batch
