"""Prefix reuse for hybrid models: KV pages through the radix tree, plus the linear layers' state.

A cached prefix of a hybrid model is usable only where the state of its Gated DeltaNet layers after the
prefix's last token is known too: the full-attention layers' K/V alone cannot restart the recurrence. So a
match may end only at a tree node holding a *snapshot* (``TreeNode.state``: a snapshot slot of the
:class:`StatePool` with the state after the node's last token) -- the deepest such node within the bound
of :class:`PrefixCacheManager`.

Where snapshots come from: a prefill to ``L`` tokens (a prompt, or a preempted request's recompute) has an
*end point* (:meth:`StatePrefixCacheManager.snapshot_point`: the main-pool length the prefill leaves, ``Lq``
of the tail rule, in whole pages and at most ``L`` -- the longest prefix the tree holds once the prompt is
in: an agent's next turn resumes there), and may have a *branch point*: where its match leaves the tree's
pages at a branch (inside an edge, or at a node with other children; ``RadixCache.branch_pages``), when that
lies past the state it resumes from by a page and at least ``MIN_BRANCH_TOKENS`` in -- a prefix two requests
have now shared, e.g. a system prompt, which a third request resumes from. A forward whose chunk holds
points runs the request's linear layers in parts, cut at them, and stores the state at each in a snapshot
slot (:meth:`plan_snapshots`; ``LinearStateBatch.snapshots``); a chunk ending at a point has its state
copied after the forward (:meth:`cache_prefix`). A snapshot goes to the tree node ending at its point once
the request's main pages reach it, or is freed if the request is released first. A request admitted on a
match gets its state slot filled from the matched node's snapshot (:meth:`bind_state`) and continues from
there.

Costs: no extra forward and no change of chunking; a forward holding snapshots runs each linear layer's
kernels once more per point (the parts between the points) for the requests whose chunks hold them. Each
snapshot slot holds a whole state (Qwen3.5-27B: 147 MiB in float32). Snapshot slots are a pool of their own
(``--max-mamba-cache-size``): when none is free a snapshot is dropped (:meth:`_evict_snapshot`: one
superseded by a deeper one on its path, as an agent's earlier turn, first; end snapshots no request resumed
from before branch points') and its node keeps its pages, reachable through a deeper snapshot; a node
dropped from the tree frees its snapshot. Of the requests in flight that find the same branch point, one
snapshots it. The host tier is not used with hybrid models: its pages would come back without states.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from nibblekv.cache.manager import Growth, main_len_after
from nibblekv.cache.page_table import PageTable
from nibblekv.cache.pages import RequestPages
from nibblekv.cache.pool import KVPool
from nibblekv.cache.prefix import PrefixCacheManager
from nibblekv.cache.radix import TreeNode
from nibblekv.cache.state_pool import StatePool

# NOTE: a branch point shorter than this takes no snapshot: a snapshot slot holds a whole state (Qwen3.5-27B:
# 147 MiB, the KV of ~8K nvfp4 tokens) and a branch snapshot, matched by every request below it, is seldom
# evicted; the shortest shared prefixes (a chat template's first tokens) would hold slots for little prefill
MIN_BRANCH_TOKENS = 256


class StatePrefixCacheManager(PrefixCacheManager):
    """:class:`PrefixCacheManager` for hybrid models: matches end at state snapshots (module docstring).

    Contract (on top of the base one): :meth:`bind_state` follows a successful admission with the request's
    state slot; :meth:`plan_snapshots` precedes each extend forward, which writes the slots it returns;
    :meth:`cache_prefix` follows each extend forward before the request's state changes again (the
    scheduler's postprocess of an extend batch, which always runs synchronously).
    """

    def __init__(self, pool: KVPool, page_table: PageTable | None, states: StatePool) -> None:
        if states.num_snapshot_slots < 1:
            raise ValueError("a prefix cache of linear-attention states needs snapshot slots")
        super().__init__(pool, page_table)
        self.states = states
        self.tree.on_state_drop = self._free_snapshot
        self._owners: dict[int, TreeNode] = {}  # snapshot slot -> the tree node holding it
        self._restore: dict[int, int] = {}  # id(pages) -> the snapshot its match ends on (until bound)
        self._slots: dict[int, int] = {}  # id(pages) -> the running request's state slot
        # id(pages) -> [(a snapshot point, the snapshot slot)] taken, not in the tree yet
        self._taken: dict[int, list[tuple[int, int]]] = {}
        # id(pages) -> (its branch point (tokens), the hash of the tokens before it) where its match found one
        self._branch: dict[int, tuple[int, int]] = {}
        self._unmatched: set[int] = set()  # tree snapshots at a prompt's end that no match has ended at yet
        self._branches: set[int] = set()  # tree snapshots taken at branch points
        self.snapshots_taken = 0
        self.snapshots_dropped = 0  # evicted to make room for a newer one (metrics, tests)

    def snapshot_point(self, num_tokens: int) -> int:
        """Where a prefill to ``num_tokens`` tokens takes its snapshot (0: none)."""
        p = self.page_size
        return min(main_len_after(0, num_tokens, self.window, p), num_tokens // p * p)

    def _points(self, key: int, num_tokens: int) -> list[int]:
        """The snapshot points of request ``key``'s prefill to ``num_tokens`` tokens, ascending: its branch
        point (if any, below the end) and its end point."""
        end = self.snapshot_point(num_tokens)
        branch = self._branch_point(key)
        return [branch, end] if 0 < branch < end else [end] if end else []

    def _branch_point(self, key: int) -> int:
        """Request ``key``'s branch point (0: none)."""
        return self._branch.get(key, (0, 0))[0]

    @staticmethod
    def _has_state(node: TreeNode) -> bool:
        return node.state is not None and node.pages is not None

    def _match_limit(self, token_ids: Sequence[int]) -> int:
        return self.tree.peek_prefix(token_ids, super()._match_limit(token_ids), ends=self._has_state)

    def match_prefix(self, pages: RequestPages, token_ids: Sequence[int]) -> int:
        n = super().match_prefix(pages, token_ids)
        if n:
            node = self._holds[id(pages)].node
            assert node.state is not None, "a hybrid match must end at a snapshot"
            self._restore[id(pages)] = node.state
            self._unmatched.discard(node.state)
        branch = self.tree.branch_pages(token_ids, super()._match_limit(token_ids)) * self.page_size
        if branch < max(n + self.page_size, MIN_BRANCH_TOKENS):
            return n
        # NOTE: one request snapshots a branch point; the others in flight with it find it in the tree once it
        # is there (a hash collision only loses a snapshot)
        tag = (branch, hash(tuple(token_ids[:branch])))
        if tag not in self._branch.values():
            self._branch[id(pages)] = tag
        return n

    def bind_state(self, pages: RequestPages, slot: int) -> None:
        self._slots[id(pages)] = slot
        snap = self._restore.pop(id(pages), None)
        if snap is not None:  # NOTE: queued now, before this step's forward: plan_snapshots may hand the slot
            self.states.copy(snap, slot)  # out again, but only that forward writes it, after this copy

    # ---- snapshots ------------------------------------------------------------------------------
    def _new_snapshot(self, key: int, branch: bool) -> int | None:
        """A snapshot slot for the request ``key`` (``id(pages)``): a free one, else one taken from the tree."""
        snap = self.states.alloc_snapshot()
        return self._evict_snapshot(key, branch) if snap is None else snap

    def plan_snapshots(
        self, entries: Sequence[tuple[RequestPages, Growth, int]]
    ) -> list[tuple[int, int, int]]:
        """A snapshot slot for each snapshot point ``b`` of a request inside its chunk (``old_len < b <
        new_len``); the forward writes the state at ``b`` into it."""
        out = []
        for i, (pages, growth, num_tokens) in enumerate(entries):
            key = id(pages)
            if key not in self._slots:
                continue
            for point in self._points(key, num_tokens):
                if growth.old_len < point < growth.new_len:
                    snap = self._take(key, point)
                    if snap is None:
                        break
                    out.append((i, point - growth.old_len, snap))
        return out

    def _take(self, key: int, point: int) -> int | None:
        """A snapshot slot for request ``key``'s point ``point``, recorded as taken (None: none to be had)."""
        snap = self._new_snapshot(key, point == self._branch_point(key))
        if snap is not None:
            self._taken.setdefault(key, []).append((point, snap))
            self.snapshots_taken += 1
        return snap

    def cache_prefix(self, pages: RequestPages, token_ids: Sequence[int]) -> None:
        """The base's, then: after a forward that ended at a snapshot point, copy the state; once the
        request's main pages reach a taken point, give its snapshot to the tree node ending there."""
        super().cache_prefix(pages, token_ids)
        key = id(pages)
        slot = self._slots.get(key)
        if slot is not None and pages.num_tokens in self._points(key, len(token_ids)):
            snap = self._take(key, pages.num_tokens)
            if snap is not None:
                self.states.copy(slot, snap)
        p = self.page_size
        reached = min(pages.num_main, pages.num_tokens) // p * p
        waiting = []
        for point, snap in self._taken.pop(key, []):
            if point > reached:
                waiting.append((point, snap))
                continue
            # NOTE: these pages are the tree's already (the base call above): insert only finds (or splits
            # out) the node that ends at the point
            _, node = self.tree.insert(token_ids[:point], pages.main[: point // p])
            if node.state is None:
                node.state = snap
                self._owners[snap] = node
                if point == self._branch_point(key):
                    self._branches.add(snap)
                else:
                    self._unmatched.add(snap)
            else:  # the same prefix's state is there already
                self.states.free_snapshot(snap)
        if waiting:
            self._taken[key] = waiting

    def _evict_snapshot(self, key: int, branch: bool) -> int | None:
        """Take a snapshot slot from the tree for request ``key``'s end snapshot (``branch``: its branch
        point's), None when there is none to take. The least recently used of, first group first: the
        snapshots with a deeper one below them on their one path; those on the request's own path (its new
        snapshot supersedes them); end snapshots no match has used yet; end snapshots; branch snapshots --
        these for an end snapshot only while branch snapshots hold more than half the slots.

        NOTE: an agent's turn matches its previous turn's snapshot and leaves a deeper one; plain LRU dropped
        another session's only snapshot, not matched yet, instead of the one the new snapshot supersedes. And
        requests that share only a system prompt leave end snapshots no one resumes from: under LRU they
        pushed out the branch snapshot every later request of that prompt starts from."""
        superseded: list[TreeNode] = []
        for node in self._owners.values():
            superseded += self._chain_snapshots_above(node.parent)
        hold = self._holds.get(key)
        own = self._chain_snapshots_above(hold.node) if hold is not None else []
        unmatched = [self._owners[s] for s in self._unmatched]
        ends = [n for s, n in self._owners.items() if s not in self._branches]
        branches = [self._owners[s] for s in self._branches]
        if not branch and 2 * len(branches) <= self.states.num_snapshot_slots:
            branches = []
        group = superseded or own or unmatched or ends or branches
        if not group:
            return None
        node = min(group)  # TreeNode orders by (last_access, id)
        snap = node.state
        assert snap is not None
        node.state = None
        self._forget(snap)
        self.snapshots_dropped += 1
        return snap

    def _forget(self, snap: int) -> None:
        """``snap`` leaves the tree."""
        del self._owners[snap]
        self._unmatched.discard(snap)
        self._branches.discard(snap)

    @staticmethod
    def _chain_snapshots_above(node: TreeNode | None) -> list[TreeNode]:
        """``node`` and its ancestors that hold a snapshot and have at most one child: a branch point's
        snapshot serves every path below it, so it is never taken for superseded."""
        out = []
        while node is not None:
            if node.state is not None and len(node.children) < 2:
                out.append(node)
            node = node.parent
        return out

    def _free_snapshot(self, snap: int) -> None:
        """The tree dropped the node holding ``snap``."""
        self._forget(snap)
        self.states.free_snapshot(snap)

    def release(self, pages: RequestPages, token_ids: Sequence[int] | None = None) -> None:
        key = id(pages)
        self._slots.pop(key, None)  # NOTE: first: no snapshot is taken of a released request's slot
        self._restore.pop(key, None)
        super().release(pages, token_ids)  # caches its pages, placing the snapshots whose points they reach
        self._branch.pop(key, None)
        for _, snap in self._taken.pop(key, []):
            self.states.free_snapshot(snap)

    def check(self, live: Iterable[RequestPages]) -> None:
        """The base's checks, and every snapshot slot free, held by one tree node, or waiting for one."""
        super().check(live)
        held = self.tree.state_slots()
        assert sorted(held) == sorted(self._owners), "snapshot owners out of sync with the tree"
        assert all(self._owners[s].state == s for s in held)
        assert self._unmatched | self._branches <= set(held), (
            "an unmatched or branch snapshot is not in the tree"
        )
        waiting = [s for taken in self._taken.values() for _, s in taken]
        assert len(held) + len(waiting) + self.states.num_snapshots_free == self.states.num_snapshot_slots, (
            "snapshot slots leaked"
        )
