"""Where one request's cached tokens live (:class:`RequestPages`): the record that the cache manager
(``nibblekv.cache.manager``, the tail rule) grows and the device page table (``nibblekv.cache.page_table``)
mirrors; both import it from here."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestPages:
    """Where one request's cached tokens live.

    NOTE: invariants: ``len(main) * page_size == num_main``; ``len(tail) ==
    ceil(max(num_tokens - num_main, 0) / page_size)``; token ``i < num_main`` is at
    ``main[i // P]``, token ``i >= num_main`` at ``tail[(i - num_main) // P]``, offset ``i % P``;
    ``sink`` (a tail-pool page) is set only while ``main`` is not empty and then holds a bf16 copy of
    positions ``[0, P)``, and it never changes until the request is released.
    """

    main: list[int] = field(default_factory=list)
    tail: list[int] = field(default_factory=list)
    num_tokens: int = 0
    num_main: int = 0
    sink: int | None = None  # bf16 copy of main[0], in the tail pool (see the module docstring)
    # Device mirror bookkeeping (see nibblekv.cache.page_table): row 0 = none yet.
    table_row: int = 0
    synced_main: int = 0
    synced_tail: list[int] = field(default_factory=list)
    # the ``tail`` list object at the last sync: a growth that changes the tail pages replaces the list (never
    # mutates it), so the same object means the same tail row
    synced_tail_src: list[int] | None = None

    def slot(self, pos: int, page_size: int) -> tuple[bool, int]:
        """``(in_main, slot)`` of stored position ``pos``."""
        if pos < self.num_main:
            return True, self.main[pos // page_size] * page_size + pos % page_size
        return False, self.tail[(pos - self.num_main) // page_size] * page_size + pos % page_size

    def attn_main(self) -> list[int]:
        """The main pages attention reads (the device page-table row): all but page 0 when it has a sink."""
        return self.main[self.attn_main_start :]

    @property
    def attn_main_start(self) -> int:
        """Index in ``main`` of the page-table row's first entry (1 with a sink page: page 0 is read
        from the tail pool). NOTE: lets the per-step page-table sync index ``main`` without copying it."""
        return 1 if self.sink is not None else 0

    def attn_tail(self) -> list[int]:
        """The tail pages attention reads: the sink page first (when there is one), then the tail."""
        return self.tail if self.sink is None else [self.sink, *self.tail]

    def resync_main_from(self, index: int) -> None:
        """Make the next page-table sync rewrite main entries from ``main[index]`` on."""
        col = index - (self.sink is not None)  # NOTE: main[0] is not in the row when there is a sink
        self.synced_main = min(self.synced_main, max(col, 0))
