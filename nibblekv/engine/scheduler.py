"""Continuous batching: which requests run in the next forward, and what happens to them after.

Each step is either an *extend* batch (prefill chunks, new requests admitted FCFS -- or with
``--schedule-policy lpm`` longest cached prefix first -- while their pages and the chunk budget allow)
or a *decode* batch (one token for every request whose prompt is in the cache). Extends go first, as
in SGLang. When a decode step runs out of pages the newest running requests are preempted: their
pages are freed and they go back to the front of the queue, keeping their tokens, to be recomputed
later (no request is lost or duplicated). Hybrid models' requests also hold a linear-attention state
slot (``states``) from admission to finish, abort or preemption; a preempted request recomputes its
state with its pages, from its cached prefix's state snapshot where the prefix cache has one. An extend
batch carries the state snapshots its forward takes (``nibblekv.cache.state_prefix``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from nibblekv.cache.host_tier import Transfer
from nibblekv.cache.manager import BaseCacheManager, Growth
from nibblekv.cache.state_pool import StatePool
from nibblekv.config import SCHEDULE_POLICIES
from nibblekv.engine.request import Request, RequestStatus, TokenLogprob


@dataclass
class ScheduledBatch:
    """One forward's work: request ``reqs[i]`` stores tokens ``[growths[i].old_len, growths[i].new_len)``."""

    is_decode: bool
    reqs: list[Request]
    growths: list[Growth]
    num_cached_tokens: int = 0  # prefix tokens newly admitted requests took from the cache
    loads: list[Transfer] = field(default_factory=list)  # host-tier copies to wait for, per layer
    # hybrid models: (entry, tokens of its chunk before the snapshot point, snapshot slot) per state snapshot
    snapshots: list[tuple[int, int, int]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(g.new_len - g.old_len for g in self.growths)

    def samples(self, i: int) -> bool:
        """Whether entry ``i`` ends at the request's last token, so a next token is sampled."""
        return self.growths[i].new_len == self.reqs[i].num_tokens


@dataclass(frozen=True)
class StepResult:
    """What the model runner produced for a batch: one token per sampling entry, in batch order."""

    token_ids: list[int]
    logprobs: list[TokenLogprob | None]
    prompt_logprobs: dict[str, list[TokenLogprob]]  # request id -> new prompt logprobs, in order


# NOTE: SGLang's bound too: past it, a prefix lookup per waiting request per step costs more than the
# order wins, and admission falls back to FCFS
LPM_MAX_WAITING = 128


class Scheduler:
    """Continuous batching over a :class:`BaseCacheManager`, admitting FCFS or (``policy="lpm"``) the
    waiting requests with the longest cached prefix first."""

    def __init__(
        self,
        cache: BaseCacheManager,
        *,
        max_running_requests: int,
        chunk_tokens: int | None,
        eos_token_ids: Iterable[int],
        policy: str = "fcfs",
        states: StatePool | None = None,
    ) -> None:
        """``states``: a hybrid model's linear-attention state pool (at least ``max_running_requests`` slots)."""
        if policy not in SCHEDULE_POLICIES:
            raise ValueError(f"schedule policy must be one of {', '.join(SCHEDULE_POLICIES)}, got {policy!r}")
        self.cache = cache
        self.policy = policy
        self.max_running = max_running_requests
        self.chunk_tokens = chunk_tokens
        self.eos_token_ids = frozenset(eos_token_ids)
        self.states = states
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self._finished: list[Request] = []  # finished since the last take_finished()
        self._peeks: dict[str, tuple[int, int]] = {}  # lpm: request id -> (prefix_version, cached tokens)

    def add(self, req: Request) -> None:
        req.status = RequestStatus.WAITING
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch | None:
        """The next batch, or None when nothing can run."""
        return self._schedule_extend() or self._schedule_decode()

    def _schedule_extend(self) -> ScheduledBatch | None:
        budget = self.chunk_tokens if self.chunk_tokens is not None else 1 << 62
        batch = ScheduledBatch(False, [], [])
        # NOTE: at most one running request is mid-prefill (a chunk stops the loop), and it goes first.
        # NOTE: is_decoding inlined (one pass over the running requests every step)
        prefilling = [r for r in self.running if len(r.token_ids) - r.pages.num_tokens != 1]
        for req in prefilling:
            n = min(req.num_tokens - req.num_cached, budget)
            more = req.num_cached + n < req.num_tokens  # a non-final chunk: the prefill window applies
            growth = self.cache.try_grow(req.pages, req.num_cached + n, prefilling=more)
            if growth is None:
                return self._nonempty(batch)
            batch.reqs.append(req)
            batch.growths.append(growth)
            budget -= n
        # Headroom of one main page per decoding request, so admission does not force a preemption.
        reserve = len(self.running) - len(prefilling) + sum(1 for r in prefilling if r.is_decoding)
        if self.policy == "lpm" and budget > 0 and len(self.running) < self.max_running:
            self._order_by_prefix()
        while self.waiting and budget > 0 and len(self.running) < self.max_running:
            req = self.waiting[0]
            # NOTE: prompt logprobs need every prompt position computed, so such requests never match.
            cached = 0 if req.wants_prompt_logprobs() else self.cache.match_prefix(req.pages, req.token_ids)
            n = min(req.num_tokens - cached, budget)
            more = cached + n < req.num_tokens
            growth = self.cache.try_grow(req.pages, cached + n, reserve_main=reserve, prefilling=more)
            if growth is None:
                self.cache.release(req.pages)  # undo the match; it is retried next step
                break
            self.waiting.popleft()
            if self.states is not None:
                req.state_slot = self.states.alloc()  # never runs out: one slot per running request
                self.cache.bind_state(req.pages, req.state_slot)  # a prefix hit's state is copied in
            req.status = RequestStatus.RUNNING
            if req.num_preemptions == 0:
                req.cached_tokens = cached
            self.running.append(req)
            batch.reqs.append(req)
            batch.growths.append(growth)
            batch.num_cached_tokens += cached
            budget -= n
        batch.loads = self.cache.take_loads()
        if self.states is not None and batch.reqs:
            entries = [(r.pages, g, r.num_tokens) for r, g in zip(batch.reqs, batch.growths)]
            batch.snapshots = self.cache.plan_snapshots(entries)
        return self._nonempty(batch)

    def _order_by_prefix(self) -> None:
        """LPM: waiting requests by cached prefix, longest first; a stable sort, so ties stay FCFS
        (requests that want prompt logprobs never match: 0). A request's lookup is kept while the cache's
        ``prefix_version`` holds (a waiting request's tokens do not change): a 32K-token lookup costs
        ~0.13 ms of host time."""
        if not 1 < len(self.waiting) <= LPM_MAX_WAITING:
            return
        version = self.cache.prefix_version
        peeks: dict[str, tuple[int, int]] = {}
        for r in self.waiting:
            old = self._peeks.get(r.request_id)
            if old is None or old[0] != version:
                old = (version, 0 if r.wants_prompt_logprobs() else self.cache.peek_prefix(r.token_ids))
            peeks[r.request_id] = old
        self._peeks = peeks  # NOTE: only waiting requests: a preempted one comes back with more tokens
        self.waiting = deque(sorted(self.waiting, key=lambda r: -peeks[r.request_id][1]))

    @staticmethod
    def _decodes(req: Request) -> bool:
        # NOTE: req.is_decoding inlined: called twice per running request and step (overlap schedule)
        if req.status is not RequestStatus.RUNNING or len(req.token_ids) - req.pages.num_tokens != 1:
            return False  # preempted in this loop, or still prefilling
        # NOTE: overlap schedule only: its last token is on the device, and it ends there (outputs known +
        # pending = all tokens past the prompt)
        return not (req.num_pending and len(req.token_ids) - req.num_prompt_tokens >= req.max_new_tokens)

    def decode_fits(self) -> bool:
        """Whether the next decode batch grows without preempting or aborting anyone. The overlap schedule
        asks first and brings a pending step's tokens to the host when not: a request that just sampled
        a stop token must finish, not be preempted or aborted for pages (as the synchronous loop does)."""
        return self.cache.can_grow_all([(r.pages, r.num_cached + 1) for r in self.running if self._decodes(r)])

    def _schedule_decode(self) -> ScheduledBatch | None:
        batch = ScheduledBatch(True, [], [])
        for req in list(self.running):
            if not self._decodes(req):
                continue
            new_len = req.pages.num_tokens + 1
            growth = self.cache.try_grow(req.pages, new_len)
            while growth is None:
                victim = self.running[-1]
                if victim is req and len(self.running) == 1:
                    # Alone and still out of pages: the pool cannot hold this request at all.
                    self.finish(req, "abort")
                    break
                self.preempt(victim)
                if victim is req:
                    break
                growth = self.cache.try_grow(req.pages, new_len)
            if growth is not None:
                batch.reqs.append(req)
                batch.growths.append(growth)
        return self._nonempty(batch)

    @staticmethod
    def _nonempty(batch: ScheduledBatch) -> ScheduledBatch | None:
        return batch if batch.reqs else None

    def preempt(self, req: Request) -> None:
        """Free the request's pages and requeue it at the front, tokens kept, for recompute."""
        self.running.remove(req)
        self.cache.release(req.pages, req.known_token_ids)
        self._free_state(req)
        req.status = RequestStatus.WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def finish(self, req: Request, reason: str) -> None:
        """Mark finished and free its pages (from either queue)."""
        if req.status is RequestStatus.RUNNING:
            self.running.remove(req)
        elif req.status is RequestStatus.WAITING:
            self.waiting.remove(req)
        self.cache.release(req.pages, req.known_token_ids)
        self._free_state(req)
        if req.status is not RequestStatus.FINISHED:
            self._finished.append(req)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason

    def _free_state(self, req: Request) -> None:
        if self.states is not None and req.state_slot is not None:
            self.states.free(req.state_slot)
            req.state_slot = None

    def take_finished(self) -> list[Request]:
        """Requests finished since the last call (including those ended outside a step's batch)."""
        out, self._finished = self._finished, []
        return out

    def commit(self, batch: ScheduledBatch) -> None:
        """Host bookkeeping of a launched batch that needs none of its tokens (tail pages it demoted)."""
        finish = self.cache.finish_growth
        for g in batch.growths:
            if g.demote_src:  # NOTE: only growths that demoted free pages (a call per request costs ~1 us)
                finish(g)

    def postprocess(self, batch: ScheduledBatch, result: StepResult) -> list[Request]:
        """Append sampled tokens, apply token-level stops; return the requests this step advanced."""
        self.commit(batch)
        advanced: list[Request] = []
        k = 0
        for i, req in enumerate(batch.reqs):
            if req.request_id in result.prompt_logprobs:
                req.prompt_logprobs.extend(result.prompt_logprobs[req.request_id])
            if not batch.is_decode and req.status is RequestStatus.RUNNING:
                # Every extend, the last chunk or not: its full pages go into the prefix tree now (SGLang's
                # cache_unfinished_req), so a request with the same prefix need not wait for the whole prompt.
                self.cache.cache_prefix(req.pages, req.token_ids)
            if not batch.samples(i):
                continue
            token, lp = result.token_ids[k], result.logprobs[k]
            k += 1
            advanced.append(req)
            if req.status is not RequestStatus.RUNNING:
                continue  # aborted while the forward ran
            if req.max_new_tokens == 0:
                self.finish(req, "length")
                continue
            req.token_ids.append(token)
            if lp is not None:
                req.output_logprobs.append(lp)
            self.check_stop(req, token)
        return advanced

    def check_stop(self, req: Request, token: int) -> None:
        """Finish ``req`` if ``token`` (its newest known output token) ends it."""
        p = req.params
        if (not p.ignore_eos and token in self.eos_token_ids) or token in p.stop_token_ids:
            self.finish(req, "stop")
        elif req.num_output_tokens >= req.max_new_tokens:
            self.finish(req, "length")
