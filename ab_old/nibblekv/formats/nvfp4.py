"""NVFP4 quantization: the exact reference every kernel is tested against.

Per 16 consecutive values along head_dim (a *block*):

* ``s = e4m3(amax16 / (6 * g))`` -- the block scale, rounded to nearest-even E4M3 and
  saturated to [0, 448]; ``g`` is the layer's FP32 global scale (one for K, one for V).
* each value ``x`` becomes the E2M1 code of ``x / (s * g)`` (``s`` the *rounded* scale),
  rounded to nearest grid value, ties to even code index, saturating at 6.
* dequant: ``(code_value * s) * g`` in FP32.

Special inputs (NOTE: the cache never holds NaN):

* NaN -> 0; +-Inf -> +-(6 * 448 * g), the largest magnitude the format can represent;
  every finite value is first clamped to that range too.
* A block whose rounded scale is 0 (all zeros, or amax below E4M3's smallest subnormal
  times 6g) stores scale 0 and codes 0, and dequantizes to exact zeros.

All arithmetic is FP32 with IEEE round-to-nearest division, which the Triton kernels
reproduce (``tl.math.div_rn``) to stay bit-exact.
"""

from __future__ import annotations

import torch

from nibblekv.formats import e2m1

BLOCK: int = 16
E4M3_MAX: float = 448.0
NVFP4_MAX: float = e2m1.E2M1_MAX * E4M3_MAX  # 2688: largest |value| / g representable


def sanitize(x: torch.Tensor, limit: float) -> torch.Tensor:
    """NaN -> 0, +-Inf -> +-limit, then clamp to [-limit, limit] (float32)."""
    x = torch.nan_to_num(x.float(), nan=0.0, posinf=limit, neginf=-limit)
    return x.clamp(-limit, limit)


def quantize(
    x: torch.Tensor, global_scale: float | torch.Tensor = 1.0, four_over_six: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x [..., D]`` (D % 16 == 0) to NVFP4.

    Returns ``(packed uint8 [..., D/2], scales float8_e4m3fn [..., D/16])``.

    ``four_over_six`` ("4over6"): per block, also try the scale ``e4m3(amax16 / (4 * g))`` and keep
    whichever of the two gives the lower squared error (ties keep the standard one). Mapping a
    block's amax to 4 instead of 6 trades the top grid step (4 -> 6) for finer steps below it; the
    stored format and :func:`dequantize` are unchanged, so only writers need to know.
    """
    d = x.shape[-1]
    if d % BLOCK:
        raise ValueError(f"NVFP4 needs the last dimension to be a multiple of {BLOCK}, got {d}")
    g = torch.as_tensor(global_scale, dtype=torch.float32, device=x.device)
    xs = sanitize(x, float(NVFP4_MAX * g))
    blocks = xs.reshape(*xs.shape[:-1], d // BLOCK, BLOCK)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    codes, s = _encode_blocks(blocks, amax, g, e2m1.E2M1_MAX)
    if four_over_six:
        codes4, s4 = _encode_blocks(blocks, amax, g, 4.0)
        better = _block_sq_error(blocks, codes4, s4, g) < _block_sq_error(blocks, codes, s, g)
        codes = torch.where(better, codes4, codes)
        s = torch.where(better, s4.float(), s.float()).to(torch.float8_e4m3fn)
    return e2m1.pack(codes.reshape(xs.shape)), s.squeeze(-1)


def _encode_blocks(
    blocks: torch.Tensor, amax: torch.Tensor, g: torch.Tensor, top: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes ``[..., n, 16]`` and E4M3 scales ``[..., n, 1]`` with each block's amax mapped to ``top``."""
    s = (amax / (g * top)).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    denom = s.float() * g
    safe = torch.where(denom > 0, denom, torch.ones_like(denom))
    q = torch.where(denom > 0, blocks / safe, torch.zeros_like(blocks))
    return e2m1.encode(q), s


def _block_sq_error(
    blocks: torch.Tensor, codes: torch.Tensor, s: torch.Tensor, g: torch.Tensor
) -> torch.Tensor:
    """Squared error ``[..., n, 1]`` of each block, summed as a fixed tree of adjacent pairs.

    NOTE: not ``.sum(-1)``, whose fp32 order depends on the shape and the CPU's vector width: 4over6
    compares two of these sums, and the Triton writers must reproduce them bit for bit.
    """
    e = (e2m1.decode(codes) * s.float() * g - blocks) ** 2
    while e.shape[-1] > 1:
        e = e[..., 0::2] + e[..., 1::2]
    return e


def dequantize(
    packed: torch.Tensor, scales: torch.Tensor, global_scale: float | torch.Tensor = 1.0
) -> torch.Tensor:
    """Inverse of :func:`quantize`: ``packed [..., D/2]``, ``scales [..., D/16]`` -> float32 ``[..., D]``."""
    g = torch.as_tensor(global_scale, dtype=torch.float32, device=packed.device)
    vals = e2m1.decode(e2m1.unpack(packed))
    d = vals.shape[-1]
    blocks = vals.reshape(*vals.shape[:-1], d // BLOCK, BLOCK)
    out = (blocks * scales.float().unsqueeze(-1)) * g
    return out.reshape(vals.shape)


def fake_quantize(
    x: torch.Tensor, global_scale: float | torch.Tensor = 1.0, four_over_six: bool = False
) -> torch.Tensor:
    """Quantize then dequantize (float32), for accuracy studies."""
    return dequantize(*quantize(x, global_scale, four_over_six), global_scale)
