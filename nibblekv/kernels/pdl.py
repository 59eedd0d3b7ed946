"""Programmatic dependent launch (PDL, sm_90+): a kernel launched with ``launch_pdl`` may be scheduled while
the kernel before it in the stream is still draining, and waits for that kernel's results only where it
first needs them. The FP8 linear path's kernels (norms and SiLU * mul that quantize, activation
quantization, GEMMs, split-K sums) use it: at decode batches each GEMM is a ~10-40 us weight stream, and
PDL lets the next one start (and prefetch its first weights into L2) during the previous kernel's tail.

Contract of a kernel built with ``PDL`` true (the helpers are no-ops when it is false, as on CPU):

* :func:`pdl_release` first: the next PDL launch may be scheduled once every program of this one ran it
  (:func:`pdl_enter`: both, for a kernel with nothing to do before its input);
* :func:`pdl_wait` before any read of another kernel's output and before any store (the kernel before may
  still read what a store would overwrite); reads of weights (nobody writes them) may go before it;
* NOTE: every program calls :func:`pdl_wait` on every path, even one with nothing to read: a kernel that
  finished without waiting would let its own dependents start before its predecessor had finished.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from nibblekv.kernels._common import interpreting


@triton.jit
def pdl_release(PDL: tl.constexpr):
    """With ``PDL``: let the next PDL launch in the stream be scheduled (its programs wait for ours in turn).
    Safe at a kernel's start: it runs only once every program of this kernel is resident, so none of them
    waits for room the next one holds."""
    if PDL:
        gdc_launch_dependents()


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """With ``PDL``: wait until the kernel before this one in the stream has finished and its writes are
    visible."""
    if PDL:
        gdc_wait()


_enabled = True  # use_pdl's switch


@contextlib.contextmanager
def use_pdl(enabled: bool) -> Iterator[None]:
    """Launches inside use PDL where available (``True``, the default outside) or never (``False``: e.g. to
    compare a chain of kernels with and without it)."""
    global _enabled
    before, _enabled = _enabled, enabled
    try:
        yield
    finally:
        _enabled = before


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """:func:`pdl_release` then :func:`pdl_wait`: the start of a PDL kernel with nothing to do before its
    input is ready."""
    pdl_release(PDL)
    pdl_wait(PDL)


@functools.cache
def _sm90(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def pdl_available(device: torch.device) -> bool:
    """Whether kernels on ``device`` can use PDL: a CUDA GPU of compute capability >= 9.0, not the
    interpreter, and not inside ``use_pdl(False)``."""
    if not _enabled or device.type != "cuda" or interpreting():
        return False
    return _sm90(device.index if device.index is not None else torch.cuda.current_device())


def pdl_launch(device: torch.device, pdl: bool | None = None) -> dict[str, bool]:
    """A PDL kernel's launch arguments (its ``PDL`` constexpr, and ``launch_pdl`` when on): ``pdl=None``
    means on wherever :func:`pdl_available`; ``True`` where it is not available is refused."""
    on = pdl_available(device) if pdl is None else pdl
    if not on:
        return {"PDL": False}
    if not pdl_available(device):
        raise ValueError(f"programmatic dependent launch needs a CUDA GPU of sm_90 or newer, not {device}")
    return {"PDL": True, "launch_pdl": True}
