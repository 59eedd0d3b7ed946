"""Radix prefix cache over page-aligned token sequences of main-pool pages.

Only full *main-pool* pages are shared: a request's bf16 tail pages are private, and its last page
is shared only once every slot of it is written. Each edge of the tree is a run of whole pages:
``key`` holds ``P * n`` token ids and the node holds the ``n`` page ids storing their K/V (the same
page id names the page in every layer). Children are keyed by their first page of tokens, so two
children of one node never share a first page and a match walks one edge per step.

Device eviction goes leaf-first in LRU order over unlocked nodes and drops them. A node may also
hold host-tier slots (``host``): :class:`nibblekv.cache.hiradix.HiRadixCache` moves evicted pages
there instead of dropping them; this class only keeps that state consistent.

NOTE: invariants (checked by :meth:`RadixCache.check`):

* a node on the device has its parent on the device (the device part is a rooted subtree);
* every non-root node is on the device, in the host tier, or both, with one page per ``P`` tokens;
* ``lock_ref(n) == own locks(n) + sum(lock_ref(children))``: locking a node protects its whole path;
* each device page id and each host slot appears at most once in the tree;
* ``evictable_pages`` / ``protected_pages`` are the device pages of unlocked / locked nodes.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nibblekv.cache.allocator import PageAllocator

if TYPE_CHECKING:
    from nibblekv.cache.host_tier import HostTier, Transfer


class TreeNode:
    """One edge of the tree: ``key`` (a multiple of ``P`` token ids) and where its pages are."""

    __slots__ = (
        "children", "host", "id", "key", "last_access", "lock_ref", "pages", "parent", "pending", "state",
    )  # fmt: skip
    _ids = itertools.count()

    def __init__(
        self,
        key: tuple[int, ...],
        pages: list[int] | None,
        host: list[int] | None,
        parent: TreeNode | None,
        last_access: int = 0,
    ) -> None:
        self.key = key
        self.pages = pages  # device (main-pool) page ids, or None when not on the device
        self.host = host  # host-tier slots, or None when there is no host copy
        self.children: dict[tuple[int, ...], TreeNode] = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access = last_access
        # A copy that may still be running on a side stream and touches this node's device pages.
        self.pending: Transfer | None = None
        # Hybrid models: a state-pool snapshot slot holding the linear layers' state after this node's last
        # token (nibblekv.cache.state_prefix); a split leaves it on the lower part, which keeps the end
        self.state: int | None = None
        self.id = next(TreeNode._ids)

    @property
    def on_device(self) -> bool:
        return self.pages is not None

    @property
    def on_host(self) -> bool:
        return self.host is not None

    def __lt__(self, other: TreeNode) -> bool:  # heap tie-break: older first, then creation order
        return (self.last_access, self.id) < (other.last_access, other.id)

    def __repr__(self) -> str:
        where = ("D" if self.on_device else "") + ("H" if self.on_host else "")
        return f"TreeNode(#{self.id}, {len(self.key)} tok, {where}, lock={self.lock_ref})"


@dataclass(frozen=True)
class PrefixMatch:
    """The longest cached page-aligned prefix of a key.

    ``pages`` are the device pages of its first part (root-first) ending at ``node`` (the root when
    nothing matched on the device); ``host_pages`` the host slots of the rest, ending at
    ``host_node`` (``node`` itself when the match never left the device).
    """

    pages: list[int]
    node: TreeNode
    host_pages: list[int]
    host_node: TreeNode

    @property
    def num_pages(self) -> int:
        return len(self.pages) + len(self.host_pages)


class RadixCache:
    """The prefix tree plus its eviction policy; owns every page id it holds.

    Contract: :meth:`insert` takes ownership of the caller's pages that it keeps (see its doc);
    pages of locked nodes are never evicted nor moved; :meth:`evict` frees device pages back to
    ``device_alloc`` and returns how many it freed. The tree never allocates device pages except in
    :meth:`load_back`.
    """

    def __init__(self, page_size: int, device_alloc: PageAllocator) -> None:
        self.page_size = page_size
        self.device_alloc = device_alloc
        self.host: HostTier | None = None  # set by HiRadixCache
        self._clock = itertools.count(1)
        self.root = TreeNode((), [], None, None)
        self.root.lock_ref = 1  # NOTE: the root is never evicted
        self.evictable_pages = 0
        self.protected_pages = 0
        self.host_pages = 0
        self.num_dropped = 0  # pages evicted for good (metrics, tests)
        # called with a dropped node's snapshot slot (nibblekv.cache.state_prefix frees it)
        self.on_state_drop: Callable[[int], None] | None = None
        # NOTE: bumped by every operation that may change what a key matches (insert, evict, evict_host), so
        # a caller may keep a peek_prefix result while it holds (the scheduler's lpm order)
        self.version = 0

    # ---- lookups --------------------------------------------------------------------------------
    def _chunk(self, key: Sequence[int], page: int) -> tuple[int, ...]:
        p = self.page_size
        return tuple(key[page * p : (page + 1) * p])

    def _common_pages(self, node: TreeNode, key: Sequence[int], start_page: int, max_pages: int) -> int:
        """Whole pages of ``node.key`` equal to ``key`` from page ``start_page`` (at most ``max_pages``)."""
        p = self.page_size
        n = min(len(node.key) // p, max_pages)
        if node.key[: n * p] == tuple(key[start_page * p : (start_page + n) * p]):
            return n  # the common case: the whole edge (or the whole rest of the key) matches
        for i in range(1, n):  # page 0 matched through the children dict
            off = (start_page + i) * p
            if node.key[i * p : (i + 1) * p] != tuple(key[off : off + p]):
                return i
        return n

    def match_prefix(self, key: Sequence[int], max_pages: int | None = None) -> PrefixMatch:
        """The longest cached prefix of ``key`` in whole pages (at most ``max_pages``).

        Splits the last edge when the match ends inside it, so the match always ends at a node;
        refreshes the LRU time of every node on the path.
        """
        limit = (
            len(key) // self.page_size if max_pages is None else min(max_pages, len(key) // self.page_size)
        )
        now = next(self._clock)
        node, done = self.root, 0
        dev: list[int] = []
        host: list[int] = []
        dev_node = self.root
        while done < limit:
            child = node.children.get(self._chunk(key, done))
            if child is None:
                break
            n = self._common_pages(child, key, done, limit - done)
            if n < len(child.key) // self.page_size:
                child = self._split(child, n)
            child.last_access = now
            if child.pages is not None:
                dev.extend(child.pages)
                dev_node = child
            else:
                assert child.host is not None
                host.extend(child.host)
            node, done = child, done + n
        return PrefixMatch(dev, dev_node, host, node)

    def peek_prefix(
        self, key: Sequence[int], max_pages: int | None = None, ends: Callable[[TreeNode], bool] | None = None
    ) -> int:
        """Pages :meth:`match_prefix` would match (device and host), changing nothing: no split, no LRU
        refresh (a scheduling policy asks this of every waiting request). With ``ends``: only up to the end
        of the deepest whole matched node for which it holds (0: none)."""
        limit = (
            len(key) // self.page_size if max_pages is None else min(max_pages, len(key) // self.page_size)
        )
        _, done, best = self._descend(key, limit, ends)
        return done if ends is None else best

    def branch_pages(self, key: Sequence[int], max_pages: int) -> int:
        """Pages of ``key``'s match where the match leaves the tree at a branch: inside an edge, or at the end
        of a node with other children (0: the match ends at a leaf's end, reaches ``max_pages``, or is empty).
        Changes nothing. Hybrid models snapshot there (``nibblekv.cache.state_prefix``)."""
        limit = min(max_pages, len(key) // self.page_size)
        node, done, _ = self._descend(key, limit)
        return done if done < limit and node.children else 0

    def _descend(
        self, key: Sequence[int], limit: int, ends: Callable[[TreeNode], bool] | None = None
    ) -> tuple[TreeNode, int, int]:
        """Walk ``key``'s first ``limit`` pages down the tree, changing nothing: the deepest whole matched
        node, the pages matched (the edge below that node may match in part), and the pages up to the
        deepest whole matched node for which ``ends`` holds (0: none)."""
        node, done, best = self.root, 0, 0
        while done < limit:
            child = node.children.get(self._chunk(key, done))
            if child is None:
                break
            n = self._common_pages(child, key, done, limit - done)
            done += n
            if n < len(child.key) // self.page_size:
                break
            node = child
            if ends is not None and ends(node):
                best = done
        return node, done, best

    # ---- structure ------------------------------------------------------------------------------
    def _split(self, node: TreeNode, n: int) -> TreeNode:
        """Cut ``node`` after ``n`` pages; return the new upper node (``node`` keeps the rest).

        NOTE: the lower part keeps the object, so locks held on ``node`` stay where they were; the
        upper part takes the same ``lock_ref`` because every lock through ``node`` passes it too.
        """
        assert 0 < n < len(node.key) // self.page_size
        cut = n * self.page_size
        parent = node.parent
        assert parent is not None
        upper = TreeNode(
            node.key[:cut],
            None if node.pages is None else node.pages[:n],
            None if node.host is None else node.host[:n],
            parent,
            node.last_access,
        )
        upper.lock_ref = node.lock_ref
        upper.pending = node.pending
        parent.children[upper.key[: self.page_size]] = upper
        node.key = node.key[cut:]
        node.pages = None if node.pages is None else node.pages[n:]
        node.host = None if node.host is None else node.host[n:]
        node.parent = upper
        upper.children[node.key[: self.page_size]] = node
        return upper

    def insert(self, key: Sequence[int], pages: Sequence[int]) -> tuple[list[int], TreeNode]:
        """Cache ``key[: P * len(pages)]`` stored in ``pages``; return (the tree's pages for it, last node).

        Ownership: where the tree already had a device copy, the returned page differs from the
        caller's unless the caller got it from the tree, and the caller must free its own (a
        duplicate); everywhere else the tree adopts the caller's page (new nodes, and host-only nodes
        whose device copy this restores) and the returned id is the caller's.
        """
        self.version += 1
        p = self.page_size
        if len(key) < len(pages) * p:
            raise ValueError(f"{len(pages)} pages need {len(pages) * p} tokens, got {len(key)}")
        now = next(self._clock)
        node, done, out = self.root, 0, []
        total = len(pages)
        while done < total:
            child = node.children.get(self._chunk(key, done))
            if child is None:
                new = TreeNode(tuple(key[done * p : total * p]), list(pages[done:]), None, node, now)
                node.children[new.key[:p]] = new
                self._count(new, +1)
                out.extend(pages[done:])
                self._inserted(new)
                return out, new
            n = self._common_pages(child, key, done, total - done)
            if n < len(child.key) // p:
                child = self._split(child, n)
            child.last_access = now
            if child.pages is None:  # host-only: the caller's pages become its device copy again
                child.pages = list(pages[done : done + n])
                self._count(child, +1)
            out.extend(child.pages)
            node, done = child, done + n
        return out, node

    # ---- locks ----------------------------------------------------------------------------------
    def lock(self, node: TreeNode) -> None:
        """Protect ``node`` and its ancestors from eviction (counted: one :meth:`unlock` per lock)."""
        n: TreeNode | None = node
        while n is not None:
            self._count(n, -1)
            n.lock_ref += 1
            self._count(n, +1)
            n = n.parent

    def unlock(self, node: TreeNode) -> None:
        n: TreeNode | None = node
        while n is not None:
            if n.lock_ref <= 0:
                raise RuntimeError(f"unlock of an unlocked node {n!r}")
            self._count(n, -1)
            n.lock_ref -= 1
            self._count(n, +1)
            n = n.parent

    def _count(self, node: TreeNode, sign: int) -> None:
        """Add (or remove) ``node``'s device pages to the evictable or protected count."""
        if node.pages is None or node is self.root:
            return
        if node.lock_ref == 0:
            self.evictable_pages += sign * len(node.pages)
        else:
            self.protected_pages += sign * len(node.pages)

    # ---- eviction -------------------------------------------------------------------------------
    def _nodes(self) -> Iterator[TreeNode]:
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    @staticmethod
    def _device_leaf(n: TreeNode) -> bool:
        return (
            n.pages is not None
            and n.lock_ref == 0
            and not any(c.pages is not None for c in n.children.values())
        )

    def evict(self, num_pages: int) -> int:
        """Free ``num_pages`` device pages (fewer if unlocked nodes hold fewer); return how many were freed.

        Takes the least recently used unlocked leaves first; a leaf longer than what is still
        needed is split and only its deepest pages go.
        """
        self.version += 1
        heap = [n for n in self._nodes() if self._device_leaf(n)]
        heapq.heapify(heap)
        freed = 0
        while freed < num_pages and heap:
            node = heapq.heappop(heap)
            assert node.pages is not None
            if len(node.pages) > num_pages - freed:
                # Evict only the newest pages of the edge: its prefix may still serve other requests.
                self._split(node, len(node.pages) - (num_pages - freed))
            pages = node.pages
            assert pages is not None
            if node.pending is not None:
                node.pending.wait()  # a copy touching these pages must finish before they are reused
                node.pending = None
            self._count(node, -1)
            if self._offload(node):
                node.pages = None  # stays in the tree, host-only
            else:
                self._drop(node)
            self.device_alloc.free(pages)
            freed += len(pages)
            parent = node.parent
            if parent is not None and parent is not self.root and self._device_leaf(parent):
                heapq.heappush(heap, parent)
        return freed

    def _drop(self, node: TreeNode) -> None:
        """Remove ``node`` (already off the device) and its subtree (host-only) from the tree."""
        assert node.parent is not None and node.lock_ref == 0
        del node.parent.children[node.key[: self.page_size]]
        stack = [node]
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            if n.host is not None:
                assert self.host is not None
                self.host.alloc.free(n.host)
                self.host_pages -= len(n.host)
                n.host = None
            if n.state is not None:
                assert self.on_state_drop is not None
                self.on_state_drop(n.state)
                n.state = None
            self.num_dropped += len(n.key) // self.page_size

    def _inserted(self, node: TreeNode) -> None:
        """Hook: a new node entered the tree (the host tier backs it up under write-through)."""

    def _offload(self, node: TreeNode) -> bool:
        """Hook: keep an evicted device node's pages elsewhere; False (here: always) drops the node."""
        return False

    # ---- checks ---------------------------------------------------------------------------------
    def device_page_ids(self) -> list[int]:
        return [p for n in self._nodes() for p in (n.pages or ())]

    def state_slots(self) -> list[int]:
        """The snapshot slots the tree's nodes hold (hybrid models)."""
        return [n.state for n in self._nodes() if n.state is not None]

    def check(self) -> None:
        """Raise ``AssertionError`` unless every invariant in the module docstring holds."""
        p = self.page_size
        seen_dev: set[int] = set()
        seen_host: set[int] = set()
        seen_states: set[int | None] = set()
        evictable = protected = host_pages = 0
        assert self.root.pages == [] and self.root.key == () and self.root.lock_ref >= 1
        for n in self._nodes():
            parent = n.parent
            assert parent is not None and parent.children.get(n.key[:p]) is n, f"{n!r}: bad parent link"
            assert len(n.key) > 0 and len(n.key) % p == 0, f"{n!r}: key of {len(n.key)} tokens"
            assert n.pages is not None or n.host is not None, f"{n!r}: in no tier"
            for ids, seen in ((n.pages, seen_dev), (n.host, seen_host)):
                if ids is not None:
                    assert len(ids) * p == len(n.key), f"{n!r}: {len(ids)} pages for {len(n.key)} tokens"
                    assert not seen.intersection(ids) and len(set(ids)) == len(ids), f"{n!r}: page shared"
                    seen.update(ids)
            if n.pages is not None:
                assert parent.pages is not None, f"{n!r}: on the device below a host-only parent"
                if n.lock_ref:
                    protected += len(n.pages)
                else:
                    evictable += len(n.pages)
            host_pages += len(n.host or ())
            assert n.state is None or n.state not in seen_states, f"{n!r}: snapshot shared"
            seen_states.add(n.state)
            assert n.lock_ref >= sum(c.lock_ref for c in n.children.values()) >= 0, f"{n!r}: lock counts"
        assert self.root.lock_ref >= 1 + sum(c.lock_ref for c in self.root.children.values())
        assert (evictable, protected) == (self.evictable_pages, self.protected_pages), (
            f"page counts {(self.evictable_pages, self.protected_pages)} != actual {(evictable, protected)}"
        )
        assert host_pages == self.host_pages
        assert len(seen_dev) <= self.device_alloc.num_used
        if self.host is not None:
            assert host_pages <= self.host.alloc.num_used
