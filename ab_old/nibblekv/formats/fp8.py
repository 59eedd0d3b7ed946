"""FP8 E4M3 KV storage with one FP32 scale per layer (for K and for V).

``stored = e4m3(clamp(x / scale, -448, 448))`` (round to nearest even);
``dequant = stored * scale``. NaN -> 0, +-Inf -> +-448 (NOTE: the cache never holds NaN).
"""

from __future__ import annotations

import torch

from nibblekv.formats.nvfp4 import E4M3_MAX, sanitize


def quantize(x: torch.Tensor, scale: float | torch.Tensor = 1.0) -> torch.Tensor:
    """``x [..., D]`` -> float8_e4m3fn ``[..., D]``."""
    s = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
    q = torch.nan_to_num(x.float(), nan=0.0) / s
    return sanitize(q, E4M3_MAX).to(torch.float8_e4m3fn)


def dequantize(q: torch.Tensor, scale: float | torch.Tensor = 1.0) -> torch.Tensor:
    """float8_e4m3fn ``[..., D]`` -> float32."""
    s = torch.as_tensor(scale, dtype=torch.float32, device=q.device)
    return q.float() * s


def fake_quantize(x: torch.Tensor, scale: float | torch.Tensor = 1.0) -> torch.Tensor:
    return dequantize(quantize(x, scale), scale)
