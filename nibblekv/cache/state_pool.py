"""Per-request linear-attention state of hybrid models, beside the KV pool.

A Gated DeltaNet layer keeps, per request, a fixed-size recurrent state ``[HV, K, V]`` (float32) and the
causal conv's last ``W - 1`` inputs ``[C, W - 1]`` (model dtype), whatever the request's length. The
:class:`StatePool` holds one slot of both for every running request (``max_running_requests`` slots):
the scheduler takes a slot at admission and gives it back at finish, abort and preemption, so a slot
never runs out while a request can be admitted. The prefix cache's *snapshot* slots follow (a request's
state copied at a page boundary of its prompt, kept by the radix tree node ending there; see
``nibblekv.cache.state_prefix``), with a free list of their own. One more slot, the last,
:attr:`StatePool.scratch_slot`, is never handed out: a CUDA graph's padding rows read and write it, so they
never touch a running request's or a snapshot's state.
:class:`LinearStateBatch` is one forward's view: which slot each request of the flattened batch uses and
whether it starts from a zero state.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch


def snapshot_slots(max_running: int, max_mamba_cache_size: int | None, radix_cache: bool) -> int:
    """Snapshot slots of a hybrid model's prefix cache: ``max_mamba_cache_size`` (every state slot, SGLang's
    ``--max-mamba-cache-size``) less one per running request; as many as running requests when None; 0
    without the radix cache. ValueError when it leaves a running request without a slot."""
    if not radix_cache:
        return 0
    if max_mamba_cache_size is None:
        return max_running
    if max_mamba_cache_size < max_running:
        raise ValueError(
            f"--max-mamba-cache-size ({max_mamba_cache_size}) must be >= --max-running-requests "
            f"({max_running}): every running request holds a state slot"
        )
    return max_mamba_cache_size - max_running


class StatePool:
    """``conv [layers, S, C, W-1]`` and ``recurrent [layers, S, HV, K, V]`` with ``S`` = slots + snapshot
    slots + 1, plus a free list for each kind (the last slot is the scratch slot)."""

    def __init__(
        self, num_layers: int, num_slots: int, conv_shape: tuple[int, int], recurrent_shape: tuple[int, int, int],
        dtype: torch.dtype, device: torch.device, recurrent_dtype: torch.dtype = torch.float32,
        num_snapshot_slots: int = 0,
    ) -> None:  # fmt: skip
        """``num_layers`` linear-attention layers; per slot and layer a conv window ``conv_shape`` ``(C, W-1)``
        in ``dtype`` and a recurrent state ``recurrent_shape`` ``(HV, K, V)`` in ``recurrent_dtype``;
        ``num_slots`` slots for running requests, ``num_snapshot_slots`` for the prefix cache."""
        self.num_slots = num_slots
        self.num_snapshot_slots = num_snapshot_slots
        total = num_slots + num_snapshot_slots
        self.scratch_slot = total  # NOTE: never allocated; padding rows' reads and writes land here
        self.conv = torch.zeros(num_layers, total + 1, *conv_shape, dtype=dtype, device=device)
        self.recurrent = torch.zeros(
            num_layers, total + 1, *recurrent_shape, dtype=recurrent_dtype, device=device
        )
        self._free: list[int] = list(range(num_slots - 1, -1, -1))  # pop() hands out slot 0 first
        self._snap_free: list[int] = list(range(total - 1, num_slots - 1, -1))

    @property
    def nbytes(self) -> int:
        return self.conv.nbytes + self.recurrent.nbytes

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_slots - len(self._free)

    def alloc(self) -> int:
        """A free slot (its contents are stale: a request's first forward starts from zeros)."""
        if not self._free:
            raise RuntimeError(f"linear-attention state pool exhausted ({self.num_slots} slots)")
        return self._free.pop()

    def free(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots or slot in self._free:
            raise ValueError(f"state slot {slot} is not allocated")
        self._free.append(slot)

    @property
    def num_snapshots_free(self) -> int:
        return len(self._snap_free)

    def alloc_snapshot(self) -> int | None:
        """A free snapshot slot, or None when every one holds a snapshot (the caller evicts one)."""
        return self._snap_free.pop() if self._snap_free else None

    def free_snapshot(self, slot: int) -> None:
        if not self.num_slots <= slot < self.scratch_slot or slot in self._snap_free:
            raise ValueError(f"snapshot slot {slot} is not allocated")
        self._snap_free.append(slot)

    def copy(self, src: int, dst: int) -> None:
        """Slot ``dst`` := slot ``src`` in every layer (queued on the device's stream, after the forwards
        already launched and before later ones)."""
        self.conv[:, dst].copy_(self.conv[:, src])
        self.recurrent[:, dst].copy_(self.recurrent[:, src])

    def startup_line(self) -> str:
        ssm = str(self.recurrent.dtype).removeprefix("torch.")
        return (
            f"Linear-attention state pool: {self.num_slots} slots + {self.num_snapshot_slots} prefix-cache "
            f"snapshots (+1 scratch), {self.conv.shape[0]} layers, recurrent state {ssm}, "
            f"{self.nbytes / (1 << 30):.2f} GB"
        )


@dataclass(frozen=True)
class SplitPart:
    """One pass of a forward cut at snapshot points: token rows ``rows`` of the sequences ``seqs`` (bounds
    ``cu``). The first pass holds every sequence up to its first point (``seqs`` None); each later one the
    sequences cut once more, from their previous point on, after their state there is stored in the
    snapshot slots ``slots``. Index tensors on the states' device."""

    rows: torch.Tensor
    cu: list[int]
    seqs: torch.Tensor | None = None
    slots: torch.Tensor | None = None


@dataclass(frozen=True)
class SnapshotSplit:
    """A forward's sequences cut at their snapshot points, as passes (:class:`SplitPart`) run in order."""

    parts: list[SplitPart]

    @staticmethod
    def of(
        cu_seqlens: list[int], snapshots: list[tuple[int, int]], slots: list[int], device: torch.device
    ) -> SnapshotSplit:
        """``snapshots[j]`` = (sequence, its tokens before the point), stored in snapshot slot ``slots[j]``;
        a sequence may hold several points (each inside its chunk, distinct)."""
        # sequence -> [(tokens before a point, its slot)], ascending
        cuts: dict[int, list[tuple[int, int]]] = {}
        for (seq, k), slot in zip(snapshots, slots):
            cuts.setdefault(seq, []).append((k, slot))
        for c in cuts.values():
            c.sort()
        flat: list[int] = []
        sizes: list[int] = []
        cus: list[list[int]] = []
        for r in range(1 + max(map(len, cuts.values()), default=0)):
            rows: list[int] = []
            seqs: list[int] = []
            part_slots: list[int] = []
            cu = [0]
            for i in range(len(cu_seqlens) - 1):
                c = cuts.get(i, [])
                if r > len(c):
                    continue
                s = cu_seqlens[i]
                end = s + c[r][0] if r < len(c) else cu_seqlens[i + 1]
                rows.extend(range(s + (c[r - 1][0] if r else 0), end))
                cu.append(len(rows))
                if r:
                    seqs.append(i)
                    part_slots.append(c[r - 1][1])
            flat += rows + seqs + part_slots
            sizes += [len(rows), len(seqs), len(part_slots)]
            cus.append(cu)
        t = torch.tensor(flat, dtype=torch.long)  # NOTE: one host-to-device copy
        if device.type == "cuda":
            t = t.pin_memory().to(device, non_blocking=True)
        pieces = t.split(sizes)
        parts = [
            SplitPart(pieces[3 * r], cu, pieces[3 * r + 1] if r else None, pieces[3 * r + 2] if r else None)
            for r, cu in enumerate(cus)
        ]
        return SnapshotSplit(parts)


@dataclass
class LinearStateBatch:
    """One forward's states: request ``i`` of the batch is tokens ``[cu_seqlens[i], cu_seqlens[i+1])``,
    uses slot ``slots[i]`` and starts from zeros where ``fresh[i]`` (its first token is position 0).
    A decode batch over a pool (:attr:`in_place`) is not read or written here: the decode kernels update
    the pool's rows ``slots`` themselves.

    ``pool=None``: scratch states (every request fresh, nothing kept beyond this object): what a forward
    over whole sequences without an engine (tests, evals) uses; :attr:`scratch` keeps the final states.
    """

    cu_seqlens: list[int]
    is_decode: bool = False
    pool: StatePool | None = None
    slots: torch.Tensor | None = None  # [N] long, on the pool's device
    fresh: torch.Tensor | None = None  # [N] bool, on the pool's device
    carried: bool = True  # some request continues a stored state (False: every one is fresh, nothing to read)
    scratch: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    # (request, tokens of its chunk before a snapshot point): the state there is stored in the pool's row
    # ``snapshot_slots[j]`` (nibblekv.cache.state_prefix); the linear layers run such a request in parts, one
    # more per point (:class:`SnapshotSplit`)
    snapshots: list[tuple[int, int]] = field(default_factory=list)
    snapshot_slots: list[int] = field(default_factory=list)

    @property
    def num_seqs(self) -> int:
        return len(self.cu_seqlens) - 1

    @functools.cached_property
    def split(self) -> SnapshotSplit:
        """The passes of a forward holding :attr:`snapshots` (built once, every linear layer reuses it)."""
        device = self.slots.device if self.slots is not None else torch.device("cpu")
        return SnapshotSplit.of(self.cu_seqlens, self.snapshots, self.snapshot_slots, device)

    @property
    def in_place(self) -> bool:
        """A decode batch over a pool: each request continues its state in the pool's row ``slots[i]``."""
        return self.is_decode and self.pool is not None

    def read(
        self, layer: int, conv_shape: tuple[int, ...], rec_shape: tuple[int, ...], dtype: torch.dtype,
        device: torch.device,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """(conv ``[N, C, W-1]``, recurrent ``[N, HV, K, V]``) before this forward for linear layer ``layer``."""
        n = self.num_seqs
        if self.pool is None or not self.carried:
            return (torch.zeros(n, *conv_shape, dtype=dtype, device=device),
                    torch.zeros(n, *rec_shape, dtype=torch.float32, device=device))  # fmt: skip
        assert self.slots is not None and self.fresh is not None and not self.is_decode
        conv = self.pool.conv[layer].index_select(0, self.slots)
        rec = self.pool.recurrent[layer].index_select(0, self.slots)
        # NOTE: where, not a multiply: a slot's stale contents never leak into a fresh request, even non-finite
        zero = torch.zeros((), dtype=conv.dtype, device=conv.device)
        conv = torch.where(self.fresh[:, None, None], zero, conv)
        return conv, torch.where(self.fresh[:, None, None, None], zero.to(rec.dtype), rec)

    def write_snapshots(self, layer: int, slots: torch.Tensor, conv: torch.Tensor, rec: torch.Tensor) -> None:
        """Store linear layer ``layer``'s states at snapshot points into the pool's rows ``slots``."""
        assert self.pool is not None
        self.pool.conv[layer].index_copy_(0, slots, conv.to(self.pool.conv.dtype))
        self.pool.recurrent[layer].index_copy_(0, slots, rec.to(self.pool.recurrent.dtype))

    def write(self, layer: int, conv: torch.Tensor, rec: torch.Tensor) -> None:
        """Store this forward's final states of linear layer ``layer``."""
        if self.pool is None:
            self.scratch[layer] = (conv, rec)
            return
        assert self.slots is not None
        self.pool.conv[layer].index_copy_(0, self.slots, conv.to(self.pool.conv.dtype))
        self.pool.recurrent[layer].index_copy_(0, self.slots, rec.to(self.pool.recurrent.dtype))
