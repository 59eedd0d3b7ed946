"""Programmatic dependent launch (variant option ``pdl``): a kernel may start while the one before it in the
stream drains; each such kernel waits for its predecessor's results before its first load of them.
Measured on the H200: within +-0.012 of the read ceiling of plain launches for decode + combine, so
opt-in."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from nibblekv.kernels._common import interpreting


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """With ``PDL`` (the kernel launched with ``launch_pdl``: it may start while the previous kernel in the
    stream still runs): wait for that kernel's results, then let the next PDL launch start early (its
    programs wait for ours in turn). NOTE: call before any load of another kernel's output."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def pdl_release(PDL: tl.constexpr):
    """With ``PDL``: let the next PDL launch start now, before this kernel waits for its own predecessor
    (``pdl_wait``). Safe: a PDL kernel starts only once every program of the one before it has released
    it, so those programs are all resident and nothing waits for room they hold."""
    if PDL:
        gdc_launch_dependents()


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """With ``PDL``: wait until the previous kernel in the stream has finished and its writes are visible."""
    if PDL:
        gdc_wait()


def pdl_args(cfg: dict[str, int | bool], device: torch.device) -> dict[str, object]:
    """Launch arguments for a kernel with a ``PDL`` constexpr: on for variant option ``pdl`` where it can
    run (CUDA, not the interpreter), else none (the kernel's default is off)."""
    if cfg.get("pdl", 0) and device.type == "cuda" and not interpreting():
        return {"PDL": 1, "launch_pdl": True}
    return {}
