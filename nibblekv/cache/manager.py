"""Per-request page bookkeeping: which pages hold a request's tokens, and when tail pages age out.

The tail rule: a request with ``L`` tokens stored keeps positions ``[0, Lq)`` in the main
(quantized) pool and ``[Lq, L)`` in the tail (unquantized) pool. ``Lq`` is a multiple of the page
size and never decreases; growing to ``L'`` sets ``Lq' = max(Lq, ceil((L' - W) / P) * P)``, so the
tail holds at most ``W`` tokens and every tail page starts page-aligned. Tail pages that fall below
``Lq'`` are *demoted*: copied (quantized) into fresh main pages by the attention backend during the
forward, and freed after it. With ``W == 0`` the same formula puts every token in the main pool.

The prefill window (``--kv-prefill-window``, pool ``prefill_window``): a growth that leaves the
prompt unfinished (a non-final chunk of a chunked prefill, ``prefilling=True``) uses ``Wp >= W``
instead of ``W``, so the next chunk attends to the whole previous chunk unquantized (prefill logits
and the prompt's K/V are computed as with a bf16 cache over the newest ``Wp`` tokens). The prompt's
last chunk grows with ``W`` again: the formula demotes everything older at once. Only the one chunked
prefill in flight holds such a window (see ``tail_pages_for``).

NOTE: an extend step attends over the layout from *before* its growth (main ``[0, Lq)``, tail pages
``old_tail``, still allocated until :meth:`BaseCacheManager.finish_growth`), so a chunk longer than
``W`` still sees the newest ``<= W`` cached tokens in bf16; demotion runs after its attention.

Sink pages (``--kv-sink-pages 1``, pool ``sink_pages``): when a request's first main page is made, a
bf16 copy of it (positions ``[0, P)``, the attention sinks) is kept in the tail pool: the demoted tail
page itself (not freed), or, when page 0 goes straight to the main pool, a fresh tail page written
beside it. Attention over cached keys does not depend on their order, so the backend reads the main
pool from the request's *second* page (``main[1:]``, ``num_main - P`` tokens) and the tail pool as
``[sink] + tail`` (``tail tokens + P``): the sinks are never read quantized. A request whose page 0
came from the prefix cache has no sink (see ``nibblekv.cache.prefix``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from nibblekv.cache.pages import RequestPages
from nibblekv.cache.pool import KVPool

if TYPE_CHECKING:
    from nibblekv.cache.host_tier import Transfer
    from nibblekv.cache.page_table import PageTable


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def main_len_after(num_main: int, new_len: int, window: int, page_size: int) -> int:
    """``Lq'`` of the tail rule (see the module docstring)."""
    return max(num_main, cdiv(max(new_len - window, 0), page_size) * page_size)


class Growth(NamedTuple):
    """What one request's growth in a forward pass needs from the attention backend.

    ``demote_src[j]`` (tail page) is quantized into ``demote_dst[j]`` (main page) during the forward;
    the source pages are freed by :meth:`BaseCacheManager.finish_growth` after the forward.
    ``old_main`` / ``old_tail`` / ``old_sink`` are the layout before the growth: what an extend step
    attends over. ``sink`` is the request's sink page after the growth; when this growth made it,
    the chunk's positions below ``P`` are written into it too (a demoted page 0 may be partly filled).

    NOTE: a NamedTuple (immutable, built ~2.3x faster than a frozen dataclass): the scheduler makes one per
    running request and decode step, ~1 us of host time each at 256 requests.
    """

    old_len: int
    new_len: int
    num_main: int  # Lq after the growth
    demote_src: tuple[int, ...]
    demote_dst: tuple[int, ...]
    old_main: int  # Lq before the growth
    old_tail: tuple[int, ...]  # tail pages holding [old_main, old_len) before the growth
    old_sink: int | None  # the sink page before the growth
    sink: int | None  # the sink page after the growth

    @property
    def prefix_main(self) -> int:
        """Cached tokens an extend reads from the main pool (the layout before demotion)."""
        return min(self.old_main, self.old_len)  # NOTE: Lq is page-rounded, it may pass the tokens

    @property
    def prefix_tail(self) -> int:
        """Cached tokens an extend reads from the tail pool, through ``old_tail``."""
        return self.old_len - self.prefix_main

    @property
    def freed_tail(self) -> tuple[int, ...]:
        """Tail pages to free after the forward: the demoted ones, except one kept as the sink."""
        return tuple(p for p in self.demote_src if p != self.sink)


class BaseCacheManager(ABC):
    """Allocates and frees the pages of requests' KV.

    Contract: :meth:`grow` either allocates everything the growth needs and updates ``pages`` or
    raises and changes nothing (call :meth:`can_grow` first, or use :meth:`try_grow`, which plans the
    growth once and returns None where it does not fit); between :meth:`grow` and
    :meth:`finish_growth` the demoted source pages stay allocated (the forward reads them);
    :meth:`release` frees every page a request holds, after which ``pages`` is empty.
    """

    @abstractmethod
    def pages_needed(self, pages: RequestPages, new_len: int, prefilling: bool = False) -> tuple[int, int]:
        """New (main, tail) pages growing ``pages`` to ``new_len`` tokens would take.

        ``prefilling``: the prompt continues past ``new_len`` (the prefill window applies)."""

    @abstractmethod
    def can_grow(
        self, pages: RequestPages, new_len: int, reserve_main: int = 0, prefilling: bool = False
    ) -> bool:
        """Whether the growth fits, leaving ``reserve_main`` main pages free."""

    @abstractmethod
    def can_grow_all(self, growths: Sequence[tuple[RequestPages, int]]) -> bool:
        """Whether every ``(pages, new_len)`` growth fits at once (none of them preempting another)."""

    @abstractmethod
    def grow(self, pages: RequestPages, new_len: int, prefilling: bool = False) -> Growth:
        """Allocate for tokens ``[pages.num_tokens, new_len)`` and update ``pages``."""

    @abstractmethod
    def try_grow(
        self, pages: RequestPages, new_len: int, reserve_main: int = 0, prefilling: bool = False
    ) -> Growth | None:
        """:meth:`grow` if :meth:`can_grow` (one plan for both: the scheduler calls it per request and
        step); None, changing nothing, otherwise."""

    @abstractmethod
    def finish_growth(self, growth: Growth) -> None:
        """Free the demoted tail pages once the forward that read them is done.

        NOTE: a no-op for a growth without demotions (``not growth.demote_src``): callers may skip it."""

    @abstractmethod
    def release(self, pages: RequestPages, token_ids: Sequence[int] | None = None) -> None:
        """Free all of a request's pages (finish, abort or preemption); given the request's
        ``token_ids``, a prefix cache may keep the pages for later requests."""

    def match_prefix(self, pages: RequestPages, token_ids: Sequence[int]) -> int:
        """Give a request holding no pages its cached prefix; return its length (0: no prefix cache)."""
        return 0

    def peek_prefix(self, token_ids: Sequence[int]) -> int:
        """The length :meth:`match_prefix` would give now, changing nothing (0: no prefix cache); it holds
        while :attr:`prefix_version` does."""
        return 0

    @property
    def prefix_version(self) -> int:
        """Changes whenever a :meth:`peek_prefix` result may have (constant: no prefix cache)."""
        return 0

    def cache_prefix(self, pages: RequestPages, token_ids: Sequence[int]) -> None:
        """Offer a request's stored tokens to the prefix cache (no-op without one)."""

    def take_loads(self) -> list[Transfer]:
        """Copies into pages the next forward reads, to wait for per layer (none without a host tier)."""
        return []

    def flush(self) -> int:
        """Drop every cached page no request holds; return how many were freed (0: no prefix cache)."""
        return 0

    # ---- hybrid models: the linear layers' per-request state (nibblekv.cache.state_prefix) -----------
    def bind_state(self, pages: RequestPages, slot: int) -> None:
        """A request admitted after :meth:`match_prefix` runs with state slot ``slot``: a prefix cache of
        states fills it with the state at the matched prefix's end (no-op here)."""

    def plan_snapshots(
        self, entries: Sequence[tuple[RequestPages, Growth, int]]
    ) -> list[tuple[int, int, int]]:
        """State snapshots the next extend forward takes inside its chunks: for entries ``(pages, growth,
        tokens to prefill)``, ``(entry, tokens of its chunk before the snapshot, snapshot slot)`` (none
        here)."""
        return []


class TieredCacheManager(BaseCacheManager):
    """The tail rule over one :class:`KVPool` (main + tail allocators).

    With a :class:`PageTable`, a released request's device row is returned too.
    """

    def __init__(self, pool: KVPool, page_table: PageTable | None = None) -> None:
        self.pool = pool
        self.page_table = page_table
        self.page_size = pool.page_size
        self.window = pool.recent_window
        self.prefill_window = max(pool.spec.prefill_window, self.window)
        self.sinks = pool.spec.sink_pages > 0  # NOTE: PoolSpec keeps it 0 without a tail pool

    def _plan(
        self, pages: RequestPages, new_len: int, prefilling: bool = False
    ) -> tuple[int, int, int, int, bool]:
        """(Lq', #demoted, #new main, #new tail, whether main page 0 gets a sink) for ``new_len``.

        ``#new tail`` counts a fresh sink page when page 0 is not a demoted tail page.
        """
        n, p = pages.num_tokens, self.page_size
        if new_len == n + 1 and n % p and not prefilling and not self._ages(pages):
            # NOTE: a decode step's growth, 15 of 16 steps: the token goes into the request's last page (n is
            # not page-aligned) and Lq does not move (no tail page ages out), so nothing is allocated --
            # what _plan_full returns there (tests/test_cache_manager.py checks it step by step)
            return pages.num_main, 0, 0, 0, False
        return self._plan_full(pages, new_len, prefilling)

    def _ages(self, pages: RequestPages) -> bool:
        """Whether one more token moves Lq (a tail page ages out): ``cdiv(n + 1 - W, P) * P > Lq``."""
        return -((self.window - pages.num_tokens - 1) // self.page_size) * self.page_size > pages.num_main

    def _plan_full(
        self, pages: RequestPages, new_len: int, prefilling: bool = False
    ) -> tuple[int, int, int, int, bool]:
        """:meth:`_plan` by the tail rule's formulas, for any growth."""
        n, p = pages.num_tokens, self.page_size
        if new_len < n:
            raise ValueError(f"cannot shrink a request from {n} to {new_len} tokens")
        lq = main_len_after(pages.num_main, new_len, self.prefill_window if prefilling else self.window, p)
        demoted = min((lq - pages.num_main) // p, len(pages.tail))
        new_main = lq // p - len(pages.main)
        new_tail = cdiv(max(new_len - lq, 0), p) - (len(pages.tail) - demoted)
        make_sink = self.sinks and not pages.main and new_main > 0
        return lq, demoted, new_main, new_tail + int(make_sink and demoted == 0), make_sink

    def pages_needed(self, pages: RequestPages, new_len: int, prefilling: bool = False) -> tuple[int, int]:
        _, _, new_main, new_tail, _ = self._plan(pages, new_len, prefilling)
        return new_main, new_tail

    def can_grow(
        self, pages: RequestPages, new_len: int, reserve_main: int = 0, prefilling: bool = False
    ) -> bool:
        _, _, new_main, new_tail, _ = self._plan(pages, new_len, prefilling)
        return self._fits(new_main + reserve_main, new_tail)

    def can_grow_all(self, growths: Sequence[tuple[RequestPages, int]]) -> bool:
        main = tail = 0
        p = self.page_size
        for pages, new_len in growths:
            n = pages.num_tokens
            if new_len == n + 1 and n % p and -((self.window - new_len) // p) * p <= pages.num_main:
                continue  # NOTE: _plan's one-token shortcut (_ages inlined): no page, most decode requests
            m, t = self.pages_needed(pages, new_len)
            main, tail = main + m, tail + t
        return self._fits(main, tail)

    def grow(self, pages: RequestPages, new_len: int, prefilling: bool = False) -> Growth:
        return self._apply(pages, new_len, self._plan(pages, new_len, prefilling))

    def try_grow(
        self, pages: RequestPages, new_len: int, reserve_main: int = 0, prefilling: bool = False
    ) -> Growth | None:
        n, p, lq = pages.num_tokens, self.page_size, pages.num_main
        one = new_len == n + 1 and n % p and not (prefilling or reserve_main)
        if one and -((self.window - new_len) // p) * p <= lq:
            # NOTE: _plan's shortcut (with _ages inlined) and _apply's no-page branch, per request and decode
            # step (the H200 host's CPU takes ~1 us a Python call); subclasses' _apply hooks only act on
            # growths that change pages
            pages.num_tokens = new_len
            return Growth(n, new_len, lq, (), (), lq, tuple(pages.tail), pages.sink, pages.sink)
        plan = self._plan(pages, new_len, prefilling)
        need_main, need_tail = plan[2] + reserve_main, plan[3]
        # NOTE: a growth that needs no page always fits (most decode steps: skips _fits' eviction count)
        if (need_main or need_tail) and not self._fits(need_main, need_tail):
            return None
        return self._apply(pages, new_len, plan)

    def _fits(self, new_main: int, new_tail: int) -> bool:
        """Whether that many new main / tail pages can be had now."""
        return new_main <= self.pool.main_alloc.num_free and new_tail <= self.pool.tail_alloc.num_free

    def _apply(self, pages: RequestPages, new_len: int, plan: tuple[int, int, int, int, bool]) -> Growth:
        """Carry out a :meth:`_plan` of ``pages`` growing to ``new_len``."""
        lq, demoted, n_main, n_tail, make_sink = plan
        if not (demoted or n_main or n_tail or make_sink):  # NOTE: most decode steps: no page changes hands
            old_len, old_main = pages.num_tokens, pages.num_main
            pages.num_tokens, pages.num_main = new_len, lq
            return Growth(old_len, new_len, lq, (), (), old_main, tuple(pages.tail), pages.sink, pages.sink)
        main_new = self.pool.main_alloc.alloc(n_main)
        try:
            tail_new = self.pool.tail_alloc.alloc(n_tail)
        except Exception:
            self.pool.main_alloc.free(main_new)
            raise
        old_sink = pages.sink
        if make_sink:
            # NOTE: with main empty, tail[0] holds positions [0, P): demoted, it stays as the sink.
            pages.sink = pages.tail[0] if demoted else tail_new.pop()
        growth = Growth(
            old_len=pages.num_tokens,
            new_len=new_len,
            num_main=lq,
            demote_src=tuple(pages.tail[:demoted]),
            demote_dst=tuple(main_new[:demoted]),
            old_main=pages.num_main,
            old_tail=tuple(pages.tail),
            old_sink=old_sink,
            sink=pages.sink,
        )
        pages.main.extend(main_new)
        pages.tail = pages.tail[demoted:] + tail_new
        pages.num_tokens, pages.num_main = new_len, lq
        return growth

    def finish_growth(self, growth: Growth) -> None:
        if growth.demote_src and growth.freed_tail:  # NOTE: per request and step: skip the tuple when empty
            self.pool.tail_alloc.free(growth.freed_tail)

    def release(self, pages: RequestPages, token_ids: Sequence[int] | None = None) -> None:
        self.pool.main_alloc.free(pages.main)
        self._clear(pages)

    def _clear(self, pages: RequestPages) -> None:
        """Free the request's tail and sink pages, empty its lists and return its page-table row."""
        self.pool.tail_alloc.free(pages.tail if pages.sink is None else [*pages.tail, pages.sink])
        pages.main, pages.tail, pages.sink = [], [], None
        pages.num_tokens = pages.num_main = 0
        if self.page_table is not None:
            self.page_table.free(pages)
