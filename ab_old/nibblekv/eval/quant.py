"""Fake quantization for the accuracy study: the exact storage formats, round-tripped in float32.

Everything here reproduces what the cache stores bit for bit (``nibblekv.formats``, whose NVFP4
writer also does 4over6 block scales), plus the Hadamard matrix the rotation option uses.
"""

from __future__ import annotations

import torch

from nibblekv.attention.paged import hadamard_matrix
from nibblekv.formats import fp8, nvfp4


def hadamard(d: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The normalized ``d x d`` Hadamard matrix the engine's ``--kv-hadamard`` uses (its own inverse)."""
    return hadamard_matrix(d, device, dtype)


def fake_quantize(
    x: torch.Tensor, kv_dtype: str, global_scale: float | torch.Tensor = 1.0, four_over_six: bool = False
) -> torch.Tensor:
    """Round-trip ``x [..., D]`` through ``kv_dtype`` (``auto``: unchanged) -> float32."""
    if kv_dtype == "auto":
        return x.float()
    if kv_dtype == "fp8_e4m3":
        return fp8.fake_quantize(x, global_scale)
    if kv_dtype != "nvfp4":
        raise ValueError(f"unknown kv_dtype {kv_dtype!r}")
    return nvfp4.fake_quantize(x, global_scale, four_over_six)
