"""The hierarchical prefix cache: a :class:`RadixCache` whose evicted pages move to a host tier.

Device eviction copies a node's pages to host slots (write-back) unless a copy already exists
(write-through makes one as soon as a node is inserted), and keeps the node as host-only instead of
dropping it. A match that reaches host-only nodes is loaded back by :meth:`HiRadixCache.load_back`
into fresh device pages before the forward reads them. Host eviction drops the least recently used
unlocked host-only leaves, or the host copies of nodes still on the device.

NOTE: a node's device pages with a copy possibly still running (``node.pending``) are never freed
before the current stream waited for it; host slots may be reused at once (one side stream, in order).
"""

from __future__ import annotations

import heapq

from nibblekv.cache.allocator import PageAllocator
from nibblekv.cache.host_tier import HostTier, Transfer
from nibblekv.cache.radix import PrefixMatch, RadixCache, TreeNode

WRITE_POLICIES: tuple[str, ...] = ("write_back", "write_through")


class HiRadixCache(RadixCache):
    """:class:`RadixCache` over the device plus ``host`` (see the module docstring).

    Contract (on top of the base one): :meth:`load_back` is the only way host-only pages reach the
    device; the returned transfer must be waited for before the pages are read.
    """

    def __init__(
        self, page_size: int, device_alloc: PageAllocator, host: HostTier, write_policy: str = "write_back"
    ) -> None:
        if write_policy not in WRITE_POLICIES:
            raise ValueError(f"write policy must be one of {', '.join(WRITE_POLICIES)}, got {write_policy!r}")
        super().__init__(page_size, device_alloc)
        self.host: HostTier = host
        self.write_through = write_policy == "write_through"
        self.num_written_back = 0  # pages copied device -> host at eviction
        self.num_loaded_back = 0  # pages copied host -> device for a match

    def _inserted(self, node: TreeNode) -> None:
        if self.write_through:
            self._backup(node)

    def _offload(self, node: TreeNode) -> bool:
        assert node.pages is not None
        if node.host is None:
            if not self._backup(node, keep=node):
                return False
            self.num_written_back += len(node.pages)
            assert node.pending is not None
            node.pending.wait()  # the write-back copy must finish before the pages are reused
            node.pending = None
        return True

    def _backup(self, node: TreeNode, keep: TreeNode | None = None) -> bool:
        """Copy ``node``'s device pages to new host slots (evicting host LRU first); False if no room."""
        assert node.pages is not None and node.host is None
        n = len(node.pages)
        if self.host.alloc.num_free < n:
            self.evict_host(n - self.host.alloc.num_free, keep=keep)
        if self.host.alloc.num_free < n:
            return False
        slots = self.host.alloc.alloc(n)
        node.pending = self.host.write(node.pages, slots)
        node.host = slots
        self.host_pages += n
        return True

    def evict_host(self, num_pages: int, keep: TreeNode | None = None) -> int:
        """Free host slots: LRU unlocked host-only leaves, or host copies of device nodes."""
        self.version += 1

        def candidate(n: TreeNode) -> bool:
            return (
                n.host is not None
                and n.lock_ref == 0
                and n is not keep
                and (n.pages is not None or not n.children)
            )

        heap = [n for n in self._nodes() if candidate(n)]
        heapq.heapify(heap)
        freed = 0
        while freed < num_pages and heap:
            node = heapq.heappop(heap)
            assert node.host is not None
            freed += len(node.host)
            if node.pages is not None:  # keep the device copy, drop the backup
                self.host.alloc.free(node.host)
                self.host_pages -= len(node.host)
                node.host = None
                continue
            parent = node.parent
            self._drop(node)
            if parent is not None and parent is not self.root and candidate(parent):
                heapq.heappush(heap, parent)
        return freed

    # ---- host -> device -------------------------------------------------------------------------
    def load_back(self, match: PrefixMatch) -> tuple[PrefixMatch, Transfer | None]:
        """Copy the host part of ``match`` back to fresh device pages (evicting device LRU for room).

        Returns the match as it now stands on the device (possibly shorter when the device is full)
        and the copy to wait for before the pages are read (None when nothing was loaded).
        """
        if not match.host_pages:
            return match, None
        self.lock(match.host_node)  # NOTE: nothing on the path may be evicted while making room
        try:
            chain: list[TreeNode] = []
            n: TreeNode | None = match.host_node
            while n is not None and n is not match.node:
                chain.append(n)
                n = n.parent
            chain.reverse()
            want = len(match.host_pages)
            if self.device_alloc.num_free < want:
                self.evict(want - self.device_alloc.num_free)
            room = min(want, self.device_alloc.num_free)
        finally:
            self.unlock(match.host_node)
        if room == 0:
            return PrefixMatch(match.pages, match.node, [], match.node), None
        host_src: list[int] = []
        loaded: list[TreeNode] = []
        for node in chain:
            assert node.host is not None and node.pages is None
            take = len(node.host)
            if len(host_src) + take > room:
                take = room - len(host_src)
                if take == 0:
                    break
                node = self._split(node, take)
            host_src.extend(node.host or ())
            loaded.append(node)
        dst = self.device_alloc.alloc(len(host_src))
        transfer = self.host.load(host_src, dst)
        i = 0
        for node in loaded:
            assert node.host is not None
            node.pages = dst[i : i + len(node.host)]
            node.pending = transfer
            self._count(node, +1)
            i += len(node.host)
        self.num_loaded_back += len(dst)
        last = loaded[-1]
        return PrefixMatch(match.pages + dst, last, [], last), transfer
