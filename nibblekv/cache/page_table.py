"""Device copy of every live request's page lists, so a batch's page table is one GPU gather.

Row ``r`` holds the main pages (``main[r]``) and tail pages (``tail[r]``) attention reads for one
request: :meth:`RequestPages.attn_main` / :meth:`RequestPages.attn_tail` (with a sink page, main page 0
is left out and the sink leads the tail row); row 0 stays all zeros (the scratch page) and pads batches.
NOTE: a request's sink page is set when its main list is still empty, so the main row never shifts. Only entries that changed since the last sync are
written: a request gains a main page every ``page_size`` tokens, so the per-step host-to-device
traffic is a few integers instead of the whole ``[B, pages]`` table.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from nibblekv.cache.pages import RequestPages

# (main, tail) entries written by one sync, each as [row indices, column indices, page ids]
TableUpdates = tuple[list[list[int]], list[list[int]]]


class PageTable:
    """``num_rows`` request rows (plus the padding row 0) of ``main_width`` / ``tail_width`` page ids."""

    def __init__(self, num_rows: int, main_width: int, tail_width: int, device: torch.device) -> None:
        self.main = torch.zeros(num_rows + 1, main_width, dtype=torch.int32, device=device)
        self.tail = torch.zeros(num_rows + 1, max(1, tail_width), dtype=torch.int32, device=device)
        self._free = list(range(num_rows, 0, -1))
        self.last_updates: TableUpdates = ([[], [], []], [[], [], []])

    def sync(self, batch: Sequence[RequestPages]) -> list[int]:
        """Give each request a row (if it has none), push changed entries; returns the rows, in order."""
        main_idx: list[list[int]] = [[], [], []]  # rows, cols, page ids
        tail_idx: list[list[int]] = [[], [], []]
        rows = []
        for p in batch:
            same_main = len(p.main) - (p.sink is not None) == p.synced_main
            if p.table_row and p.synced_tail_src is p.tail and same_main:
                rows.append(p.table_row)  # NOTE: nothing changed since its last sync (most decode steps)
                continue
            if p.table_row == 0:
                if not self._free:
                    raise RuntimeError(
                        "page table rows exhausted (more live requests than max_running_requests)"
                    )
                p.table_row, p.synced_main, p.synced_tail = self._free.pop(), 0, []
            start, tail = p.attn_main_start, p.attn_tail()
            n = len(p.main) - start  # the row's length: p.attn_main() without copying a long list
            if n > self.main.shape[1]:
                raise ValueError(f"a request needs {n} pages, more than the context length allows")
            for col in range(p.synced_main, n):
                _push(main_idx, p.table_row, col, p.main[start + col])
            p.synced_main = n
            if tail != p.synced_tail:
                for col, page in enumerate(tail):
                    _push(tail_idx, p.table_row, col, page)
                p.synced_tail = tail
            p.synced_tail_src = p.tail
            rows.append(p.table_row)
        self.last_updates = (main_idx, tail_idx)
        self.apply(self.last_updates)
        return rows

    def apply(self, updates: TableUpdates) -> None:
        """Write ``(main, tail)`` entries, each ``[rows, cols, page ids]``: what :meth:`sync` pushed.

        Tensor-parallel workers replay rank 0's ``last_updates`` here to keep identical tables.
        """
        for table, idx in ((self.main, updates[0]), (self.tail, updates[1])):
            if idx[0]:
                t = torch.tensor(idx, dtype=torch.int64).to(table.device, non_blocking=True)
                table[t[0], t[1]] = t[2].to(torch.int32)

    def free(self, pages: RequestPages) -> None:
        """Return the request's row (its entries are rewritten by the next owner before use)."""
        if pages.table_row:
            self._free.append(pages.table_row)
            pages.table_row, pages.synced_main, pages.synced_tail, pages.synced_tail_src = 0, 0, [], None


def _push(idx: list[list[int]], row: int, col: int, page: int) -> None:
    idx[0].append(row)
    idx[1].append(col)
    idx[2].append(page)
