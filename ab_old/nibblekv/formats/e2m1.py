"""E2M1 (FP4) codes: the 4-bit element format of NVFP4.

A code is 4 bits: bit 3 is the sign, bits 2..0 index the magnitude grid
``{0, 0.5, 1, 1.5, 2, 3, 4, 6}``. Two codes share a byte, the *low* nibble holding
the even element (element 2i) and the high nibble the odd one (element 2i+1).
"""

from __future__ import annotations

import torch

E2M1_GRID: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX: float = 6.0

# Rounding of a magnitude |q| (already divided by its scale) to a grid index, ties to
# even code index: a threshold listed as "<=" sends its tie down (to the even index),
# one listed as "<" sends it up (to the even index above).
#   |q| <= .25 -> 0, < .75 -> 1, <= 1.25 -> 2, < 1.75 -> 3,
#   <= 2.5 -> 4, < 3.5 -> 5, <= 5 -> 6, else 7
_UPPER_BOUNDS: tuple[tuple[float, bool], ...] = (
    (0.25, True),
    (0.75, False),
    (1.25, True),
    (1.75, False),
    (2.5, True),
    (3.5, False),
    (5.0, True),
)


def magnitude_to_index(mag: torch.Tensor) -> torch.Tensor:
    """Round non-negative float magnitudes to E2M1 grid indices (int32, 0..7), ties to even."""
    idx = torch.zeros(mag.shape, dtype=torch.int32, device=mag.device)
    for bound, inclusive in _UPPER_BOUNDS:
        above = mag > bound if inclusive else mag >= bound
        idx += above.to(torch.int32)
    return idx


def encode(q: torch.Tensor) -> torch.Tensor:
    """Values already divided by their scale -> 4-bit codes (uint8 in 0..15).

    Magnitudes above 6 saturate to 6. A value that rounds to zero gets a positive
    sign, so zero has one code (0) and never dequantizes to -0.0.
    """
    q = q.float()
    idx = magnitude_to_index(q.abs())
    sign = ((q < 0) & (idx > 0)).to(torch.int32) << 3
    return (sign | idx).to(torch.uint8)


def decode(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes (uint8 0..15) -> float32 values on the E2M1 grid."""
    grid = torch.tensor(E2M1_GRID, dtype=torch.float32, device=codes.device)
    c = codes.to(torch.int64)
    mag = grid[c & 7]
    return torch.where((c & 8) != 0, -mag, mag)


def pack(codes: torch.Tensor) -> torch.Tensor:
    """[..., n] codes (n even) -> [..., n/2] bytes; low nibble = even element."""
    if codes.shape[-1] % 2:
        raise ValueError(f"pack needs an even last dimension, got {codes.shape[-1]}")
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """[..., n/2] bytes -> [..., n] codes; inverse of :func:`pack`."""
    p = packed.to(torch.uint8)
    lo = p & 0x0F
    hi = p >> 4
    return torch.stack((lo, hi), dim=-1).flatten(-2)
