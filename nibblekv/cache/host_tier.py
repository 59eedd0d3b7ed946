"""The host tier of the hierarchical prefix cache: main-pool pages kept in host memory, as stored.

A host page holds one main-pool page of every layer in its stored form: K and V data plus, for
NVFP4, the block scales, byte for byte, so a round trip restores identical pages (the per-layer
global scales stay on the device and are not part of a page). Layout: one contiguous uint8 tensor
``[host_pages + 1, layer_page_bytes]`` per layer, a row holding the page's segments side by side (K data
and V data; an NVFP4 page is one segment, its row of the pool's ``pages`` tensor). A transfer moves a layer
through a device staging row per page: one gather/scatter launch (``kernels.gather_pages``) plus one copy per
run of consecutive host slots, whatever the dtype (NOTE: a tensor per segment cost NVFP4 twice FP8's calls:
``segments * (runs + 1)`` per layer, with runs ~ pages once host slots fragment).

On CUDA the memory is pinned and copies run on a side stream: the side stream first waits for the
current stream (the pages are final), and each :class:`Transfer` records an event per layer, so the
forward can start on layer 0 while later layers still load (:meth:`Transfer.wait_layer`). On CPU the
same code runs synchronously (a second in-memory tier, so CI can test it).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch

from nibblekv.cache.allocator import FreeListAllocator
from nibblekv.cache.pool import SCRATCH_PAGES, KVPool, PoolSpec
from nibblekv.formats.layer_kv import LayerKV
from nibblekv.kernels import gather_pages, scatter_pages

GIB: int = 1 << 30


def host_page_bytes(spec: PoolSpec) -> int:
    """Bytes one host page takes: a main-pool page of every layer, K and V, scales included."""
    return spec.page_size * spec.layout.bytes_per_token() * spec.num_layers


def host_pages_for(spec: PoolSpec, size_gib: float) -> int:
    """Host pages that fit in ``size_gib`` GiB (``--hicache-size``)."""
    return int(size_gib * GIB) // host_page_bytes(spec)


def _runs(ids: Sequence[int]) -> list[tuple[int, int, int]]:
    """``(first id, index in ids, length)`` of each run of consecutive ids, in order."""
    runs: list[tuple[int, int, int]] = []
    for i, h in enumerate(ids):
        if runs and runs[-1][0] + runs[-1][2] == h:
            first, at, n = runs[-1]
            runs[-1] = (first, at, n + 1)
        else:
            runs.append((h, i, 1))
    return runs


def _host_buffer(nbytes: int, pin: bool) -> tuple[torch.Tensor, bool]:
    """``nbytes`` of host memory, page-locked when ``pin``; True when it must be unregistered later.

    NOTE: pinned via ``cudaHostRegister`` rather than ``pin_memory=True``, whose caching allocator
    rounds a block up to a power of two (up to 2x the ``--hicache-size`` asked for).
    """
    buf = torch.empty(nbytes, dtype=torch.uint8)
    if not pin:
        return buf, False
    try:
        ok = int(torch.cuda.cudart().cudaHostRegister(buf.data_ptr(), nbytes, 0)) == 0
    except (AttributeError, RuntimeError, TypeError):  # no cudart binding in this build
        ok = False
    if not ok:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True), False
    return buf, True


def _unregister(buf: torch.Tensor) -> None:
    torch.cuda.cudart().cudaHostUnregister(buf.data_ptr())


class Transfer:
    """A copy between tiers, possibly still running on a side stream.

    :meth:`wait` / :meth:`wait_layer` make the *current* stream wait (the host is never blocked);
    on CPU the copy is already done and both are no-ops.
    """

    def __init__(self, events: list[torch.cuda.Event] | None = None) -> None:
        self.events = events

    def wait_layer(self, layer: int) -> None:
        if self.events is not None:
            torch.cuda.current_stream().wait_event(self.events[layer])

    def wait(self) -> None:
        if self.events:
            torch.cuda.current_stream().wait_event(self.events[-1])  # NOTE: layers are copied in order

    def done(self) -> bool:
        return self.events is None or all(e.query() for e in self.events)


class HostTier:
    """A page store of stored-form main-pool pages in host memory, with its own slot allocator.

    Contract: :meth:`write` copies device pages into host slots and :meth:`load` host slots into
    device pages, every layer, bytes unchanged; both return a :class:`Transfer`. A caller must not
    reuse a device page a transfer reads or writes before the current stream waited on it; host
    slots may be reused at once (all copies run in order on one side stream).
    """

    def __init__(self, pool: KVPool, num_pages: int, *, pin_memory: bool | None = None) -> None:
        if num_pages < 1:
            raise ValueError(f"the host tier needs at least one page, got {num_pages}")
        self.pool = pool
        self.num_pages = num_pages
        self.alloc = FreeListAllocator(num_pages)
        cuda = pool.device.type == "cuda"
        pin = cuda if pin_memory is None else pin_memory
        # NOTE: pool tensors are contiguous with pages first, so each page of a segment is a row.
        self._device: list[list[torch.Tensor]] = [self._segments(layer) for layer in pool.main]
        self._widths = [sum(seg.shape[1] for seg in segs) for segs in self._device]
        self.page_bytes = sum(self._widths)
        # One allocation carved into per-layer tensors [rows, layer page bytes].
        self._buffer, registered = _host_buffer(self.nbytes, pin)
        if registered:  # NOTE: unpinned when the tier goes away, before the memory is freed
            weakref.finalize(self, _unregister, self._buffer)
        self._host: list[torch.Tensor] = []
        offset, rows = 0, num_pages + SCRATCH_PAGES
        for width in self._widths:
            self._host.append(self._buffer[offset : offset + rows * width].view(rows, width))
            offset += rows * width
        self.stream: torch.cuda.Stream | None = torch.cuda.Stream(pool.device) if cuda else None

    @staticmethod
    def _segments(layer: LayerKV) -> list[torch.Tensor]:
        if layer.pages is not None:
            return [layer.pages]
        tensors = [layer.k_data, layer.v_data]
        if layer.k_scale is not None and layer.v_scale is not None:
            tensors += [layer.k_scale, layer.v_scale]
        return [t.view(t.shape[0], -1).view(torch.uint8) for t in tensors]

    def host_segment(self, layer: int, seg: int) -> torch.Tensor:
        """Host rows ``[slots, width]`` of one segment of a layer (a column view; for tests and tools)."""
        lo = sum(s.shape[1] for s in self._device[layer][:seg])
        return self._host[layer][:, lo : lo + self._device[layer][seg].shape[1]]

    @property
    def nbytes(self) -> int:
        return self.page_bytes * (self.num_pages + SCRATCH_PAGES)

    def write(self, device_pages: Sequence[int], host_pages: Sequence[int]) -> Transfer:
        """Device pages -> host slots (all layers)."""
        return self._copy(list(device_pages), list(host_pages), to_host=True)

    def load(self, host_pages: Sequence[int], device_pages: Sequence[int]) -> Transfer:
        """Host slots -> device pages (all layers)."""
        return self._copy(list(device_pages), list(host_pages), to_host=False)

    def _copy(self, dev: list[int], host: list[int], to_host: bool) -> Transfer:
        if len(dev) != len(host):
            raise ValueError(f"{len(dev)} device pages but {len(host)} host slots")
        if not dev:
            return Transfer()
        if self.stream is None:
            self._copy_layers(dev, host, to_host, None)
            return Transfer()
        events = [torch.cuda.Event() for _ in self._device]
        # NOTE: the side stream starts after everything already queued (the forward that wrote the pages).
        self.stream.wait_stream(torch.cuda.current_stream(self.pool.device))
        with torch.cuda.stream(self.stream):
            self._copy_layers(dev, host, to_host, events)
        return Transfer(events)

    def _copy_layers(
        self, dev: list[int], host: list[int], to_host: bool, events: list[torch.cuda.Event] | None
    ) -> None:
        idx = torch.tensor(dev, dtype=torch.int64, device=self.pool.device)
        runs = _runs(host)
        non_blocking = self.stream is not None
        for layer, (dsegs, hrows) in enumerate(zip(self._device, self._host)):
            # NOTE: one staging row per page (all segments), allocated on the copy stream
            rows = torch.empty((len(dev), self._widths[layer]), dtype=torch.uint8, device=self.pool.device)
            if to_host:
                gather_pages(dsegs, idx, rows)
                for first, at, n in runs:
                    hrows[first : first + n].copy_(rows[at : at + n], non_blocking=non_blocking)
            else:
                for first, at, n in runs:
                    rows[at : at + n].copy_(hrows[first : first + n], non_blocking=non_blocking)
                scatter_pages(rows, dsegs, idx)
            if events is not None:
                events[layer].record()
