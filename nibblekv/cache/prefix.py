"""Prefix reuse on top of the tail rule: requests share cached main-pool pages through a radix tree.

Which pages a request may reuse: the first ``m`` whole pages of its tokens that the tree holds, with
``m * P <= Lq(L)`` (``Lq`` of the tail rule for its ``L`` tokens) and ``m * P < L`` (one token is always
computed, so there are logits to sample from). With the first bound a cached request ends its prefill
with exactly the layout a fresh one has (the same positions in the main pool, the same in the tail),
so reuse never quantizes a position that a fresh run keeps exact. With ``W == 0`` the bound is ``L - 1``.

What the reused bytes are: the pages another request stored for the same tokens, as stored. Outputs
equal a run without the cache whenever that run stores and reads the same bytes, e.g. with unquantized
KV, or with quantized KV when its prefill chunk boundary is where the cached prefix ends (the extend
then reads the quantized prefix in both runs). A request that wants prompt logprobs is not matched.

Ownership: a request's ``main[:shared]`` pages belong to the tree (and are locked through the request's
node); ``main[shared:]``, all tail pages and its sink page are its own. Pages enter the tree after every prefill chunk
(:meth:`PrefixCacheManager.cache_prefix`, the full main pages so far) and when the request is released (finish, abort, preemption);
freed pages of the tree are evicted LRU when a growth needs room.

Sink pages (``--kv-sink-pages``, see ``nibblekv.cache.manager``): the tree and the host tier hold main
pages only. A request keeps the sink page it made while its page 0 is shared through the tree (the
sink holds the same tokens' K/V) and frees it when released; a request whose page 0 is a prefix hit
has no sink and reads its page 0 quantized, as without sink pages (so its outputs may differ slightly
from a cold run's, which reads page 0 in bf16).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from nibblekv.cache.hiradix import HiRadixCache
from nibblekv.cache.host_tier import HostTier, Transfer
from nibblekv.cache.manager import Growth, TieredCacheManager, main_len_after
from nibblekv.cache.page_table import PageTable
from nibblekv.cache.pages import RequestPages
from nibblekv.cache.pool import KVPool
from nibblekv.cache.radix import RadixCache, TreeNode


@dataclass
class _Hold:
    """A request's share of the tree. NOTE: keeps ``pages`` alive so ``id(pages)`` stays unique."""

    pages: RequestPages
    node: TreeNode  # locked
    shared: int  # leading main pages owned by the tree
    lookup_tokens: int = 0  # at admission: the request's tokens, of which ...
    matched_tokens: int = 0  # ... were cached on the device ...
    host_tokens: int = 0  # ... or loaded back from the host tier
    counted: bool = False


@dataclass
class PrefixStats:
    """Admission counters (tokens): what was looked up and what the cache served."""

    lookup_tokens: int = 0
    hit_tokens: int = 0
    host_hit_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.lookup_tokens if self.lookup_tokens else 0.0


class PrefixCacheManager(TieredCacheManager):
    """:class:`TieredCacheManager` whose main pages are shared through a :class:`RadixCache`.

    Contract (on top of the base one): :meth:`match_prefix` runs before a request's first growth
    and gives it its cached prefix (undo with :meth:`release`); :meth:`can_grow` counts unlocked
    tree pages as free and :meth:`grow` evicts them as needed; before a forward the caller waits for
    :meth:`take_loads` (host-tier copies into pages the batch reads).
    """

    def __init__(
        self,
        pool: KVPool,
        page_table: PageTable | None = None,
        *,
        host: HostTier | None = None,
        write_policy: str = "write_back",
    ) -> None:
        super().__init__(pool, page_table)
        self.tree = (
            RadixCache(pool.page_size, pool.main_alloc)
            if host is None
            else HiRadixCache(pool.page_size, pool.main_alloc, host, write_policy)
        )
        # NOTE: the pool counts the tree's unlocked pages as free (usage, leak checks): they are on demand.
        pool.cached_pages = lambda: self.tree.evictable_pages
        self.stats = PrefixStats()
        self._holds: dict[int, _Hold] = {}
        self._loads: list[Transfer] = []

    def max_reusable_pages(self, num_tokens: int) -> int:
        """Pages a request of ``num_tokens`` tokens may take from the tree (see the module docstring)."""
        lq = main_len_after(0, num_tokens, self.window, self.page_size)
        return min(lq, num_tokens - 1) // self.page_size

    def _match_limit(self, token_ids: Sequence[int]) -> int:
        """The most pages a match of ``token_ids`` may take (subclasses narrow it)."""
        return self.max_reusable_pages(len(token_ids))

    def peek_prefix(self, token_ids: Sequence[int]) -> int:
        return self.tree.peek_prefix(token_ids, self._match_limit(token_ids)) * self.page_size

    @property
    def prefix_version(self) -> int:
        return self.tree.version

    def match_prefix(self, pages: RequestPages, token_ids: Sequence[int]) -> int:
        """Point an empty request at its cached prefix; return the tokens it no longer computes."""
        if pages.num_tokens or id(pages) in self._holds:
            raise ValueError("match_prefix needs a request that holds no pages")
        match = self.tree.match_prefix(token_ids, self._match_limit(token_ids))
        device_tokens = len(match.pages) * self.page_size
        if match.host_pages:
            assert isinstance(self.tree, HiRadixCache)  # only it leaves host-only nodes behind
            match, load = self.tree.load_back(match)
            if load is not None:
                self._loads.append(load)
        self.tree.lock(match.node)
        n = len(match.pages)
        host_tokens = n * self.page_size - device_tokens
        self._holds[id(pages)] = _Hold(pages, match.node, n, len(token_ids), device_tokens, host_tokens)
        pages.main = list(match.pages)
        pages.num_tokens = pages.num_main = n * self.page_size
        return pages.num_tokens

    def take_loads(self) -> list[Transfer]:
        """Host -> device copies issued since the last call (wait before the forward reads them)."""
        out, self._loads = self._loads, []
        return out

    # ---- growth with eviction -------------------------------------------------------------------
    def _fits(self, new_main: int, new_tail: int) -> bool:
        """Unlocked cached pages count as free: growth evicts them (LRU) as needed."""
        free_main = self.pool.main_alloc.num_free + self.tree.evictable_pages
        return new_main <= free_main and new_tail <= self.pool.tail_alloc.num_free

    def _apply(self, pages: RequestPages, new_len: int, plan: tuple[int, int, int, int, bool]) -> Growth:
        short = plan[2] - self.pool.main_alloc.num_free
        if short > 0:
            self.tree.evict(short)
        hold = self._holds.get(id(pages))
        if hold is not None and not hold.counted:  # NOTE: counted once, when the admission succeeds
            hold.counted = True
            self.stats.lookup_tokens += hold.lookup_tokens
            self.stats.hit_tokens += hold.matched_tokens + hold.host_tokens
            self.stats.host_hit_tokens += hold.host_tokens
        return super()._apply(pages, new_len, plan)

    # ---- into the tree --------------------------------------------------------------------------
    def cache_prefix(self, pages: RequestPages, token_ids: Sequence[int]) -> None:
        """Give the tree the request's full, written main pages; the request keeps them locked."""
        p = self.page_size
        n_full = min(pages.num_main, pages.num_tokens) // p
        hold = self._holds.get(id(pages))
        shared = hold.shared if hold is not None else 0
        if n_full <= shared:
            return
        canon, node = self.tree.insert(token_ids[: n_full * p], pages.main[:n_full])
        assert canon[:shared] == pages.main[:shared], "a request's shared pages moved"
        moved = [i for i in range(shared, n_full) if pages.main[i] != canon[i]]
        duplicates = [pages.main[i] for i in moved]
        pages.main[:n_full] = canon
        if moved:  # NOTE: the device page table must be rewritten from the first replaced entry on
            pages.resync_main_from(moved[0])
        self.pool.main_alloc.free(duplicates)
        self.tree.lock(node)
        if hold is None:
            self._holds[id(pages)] = _Hold(pages, node, n_full, counted=True)
        else:
            self.tree.unlock(hold.node)
            hold.node, hold.shared = node, n_full

    def release(self, pages: RequestPages, token_ids: Sequence[int] | None = None) -> None:
        """Cache the request's pages (when ``token_ids`` are given), then free what the tree did not take."""
        if token_ids is not None:
            self.cache_prefix(pages, token_ids)
        hold = self._holds.pop(id(pages), None)
        shared = 0
        if hold is not None:
            self.tree.unlock(hold.node)
            shared = hold.shared
        self.pool.main_alloc.free(pages.main[shared:])
        self._clear(pages)  # NOTE: the sink page is the request's own: freed here, never cached

    def flush(self) -> int:
        """Evict every unlocked page from the device (and drop the host tier's); return pages freed."""
        freed = self.tree.evict(self.tree.evictable_pages)
        if isinstance(self.tree, HiRadixCache):
            self.tree.evict_host(self.tree.host_pages)
        return freed

    # ---- checks ---------------------------------------------------------------------------------
    def check(self, live: Iterable[RequestPages]) -> None:
        """Integrity: the tree's invariants, each request's shared pages, and no page leaked or doubly owned.

        ``live`` are the pages of every request holding any (call between steps).
        """
        self.tree.check()
        live = list(live)
        held = {id(p) for p in live}
        assert set(self._holds) <= held, "a released request still holds tree pages"
        assert self.tree.root.lock_ref == 1 + len(self._holds), "tree locks != requests holding pages"
        owned = self.tree.device_page_ids()
        tail: list[int] = []
        for pages in live:
            hold = self._holds.get(id(pages))
            shared = hold.shared if hold is not None else 0
            if hold is not None:
                path: list[int] = []
                n: TreeNode | None = hold.node
                while n is not None:
                    path[:0] = n.pages or []
                    n = n.parent
                assert path == pages.main[:shared], "shared pages are not the locked path's pages"
            owned.extend(pages.main[shared:])
            tail.extend(pages.attn_tail())  # the tail pages and the sink page
        assert len(set(owned)) == len(owned), "a main page is owned twice"
        assert len(owned) == self.pool.main_alloc.num_used, (
            f"main pages leaked: {self.pool.main_alloc.num_used} used, {len(owned)} owned"
        )
        assert len(set(tail)) == len(tail) == self.pool.tail_alloc.num_used, "tail pages leaked"
