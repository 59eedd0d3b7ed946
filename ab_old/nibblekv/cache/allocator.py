"""Page allocators: which pages of a pool are free."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable


class OutOfPagesError(RuntimeError):
    """Raised by :meth:`PageAllocator.alloc` when fewer pages are free than asked for."""


class PageAllocator(ABC):
    """Hands out page ids of one pool; a page id names the same page in every layer.

    Contract: ids are in ``[1, num_pages]`` (page 0 is reserved as a scratch page that padded
    batch entries may write into, so it is never handed out); an id is owned by at most one
    caller between :meth:`alloc` and :meth:`free`; :meth:`alloc` either returns exactly ``n`` ids
    or raises :class:`OutOfPagesError` and changes nothing.
    """

    @property
    @abstractmethod
    def num_pages(self) -> int:
        """Pages that can be handed out (the scratch page excluded)."""

    @property
    @abstractmethod
    def num_free(self) -> int:
        """Pages free right now."""

    @abstractmethod
    def alloc(self, n: int) -> list[int]:
        """Take ``n`` free pages."""

    @abstractmethod
    def free(self, pages: Iterable[int]) -> None:
        """Give pages back; raises ``ValueError`` on a page that is not allocated."""

    @property
    def num_used(self) -> int:
        return self.num_pages - self.num_free


class FreeListAllocator(PageAllocator):
    """A LIFO free list: recently freed pages are reused first (they are likely still in cache)."""

    def __init__(self, num_pages: int) -> None:
        if num_pages < 0:
            raise ValueError(f"num_pages must be >= 0, got {num_pages}")
        self._num_pages = num_pages
        # NOTE: popped from the end, so page 1 goes out first.
        self._free: list[int] = list(range(num_pages, 0, -1))
        self._used: set[int] = set()

    @property
    def num_pages(self) -> int:
        return self._num_pages

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> list[int]:
        if n < 0:
            raise ValueError(f"cannot allocate {n} pages")
        if n > len(self._free):
            raise OutOfPagesError(f"asked for {n} pages, {len(self._free)} free")
        pages = [self._free.pop() for _ in range(n)]
        self._used.update(pages)
        return pages

    def free(self, pages: Iterable[int]) -> None:
        pages = list(pages)
        bad = [p for p in pages if p not in self._used]
        if bad or len(set(pages)) != len(pages):
            raise ValueError(f"pages not allocated (or freed twice): {bad or pages}")
        self._used.difference_update(pages)
        self._free.extend(reversed(pages))
