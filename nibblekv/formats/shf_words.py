"""The "shf" bit order of NVFP4 data: each aligned 32-bit word's 8 nibbles, bits placed for a cheap decoder.

The standard order (:func:`nibblekv.formats.e2m1.pack`) keeps element ``e`` of a little-endian word in bits
``4e .. 4e+3`` (code ``s e1 e0 m``). Turning such a word into 4 half2 takes ~7 integer ops plus 4
``cvt.rn.f16x2.e4m3x2``, a low-throughput instruction on Hopper. In the shf order every element's 4 bits
sit where a right rotation of the word (``shf.r.wrap``) and a mask put them at an fp16's bits 15 (s) and
11..9 (e1 e0 m) = ``value * 2**-14`` -- 4 rotations and 6 masks (10 integer ops) give the same 4 half2:

    out0 = rotr(w, 23) & 0x8E008E00                                  = (e0, e2)
    out1 = rotr(w, 26) & 0x8E008E00                                  = (e4, e6)
    out2 = (w & 0x8C008C00) | (rotr(w, 3) & 0x02000200)              = (e1, e3)
    out3 = (rotr(w, 30) & 0x86008600) | (rotr(w, 3) & 0x08000800)    = (e5, e7)

(low half, high half) each. The low 16 bits hold e0, e4, e1, e5 and the high 16 bits e2, e6, e3, e7 in
the same places (+16), so pairing two tokens' low (high) halves with one ``prmt`` and decoding that gives
(token x, token y) half2 of one element -- what the value operand of ``mma.sync`` wants. No 4-shift
layout exists (4 translates of the pattern cannot tile 32 bits; checked exhaustively), so 10 is the least
for shift-and-mask decoders; the search found this one among those that also pair tokens with one prmt.
"""

from __future__ import annotations

import torch

# SHF_BITS[e] = bit positions of element e's (m, e0, e1, s) within its 32-bit word
SHF_BITS: tuple[tuple[int, int, int, int], ...] = (
    (0, 1, 2, 6),  # e0
    (12, 10, 11, 15),  # e1
    (16, 17, 18, 22),  # e2
    (28, 26, 27, 31),  # e3
    (3, 4, 5, 9),  # e4
    (7, 8, 14, 13),  # e5
    (19, 20, 21, 25),  # e6
    (23, 24, 30, 29),  # e7
)


def _words(packed: torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., 4n]`` -> int64 ``[..., n]`` little-endian words."""
    if packed.dtype != torch.uint8 or packed.shape[-1] % 4:
        raise ValueError(f"needs uint8 data with a last dimension divisible by 4, got {packed.dtype} {packed.shape}")
    b = packed.reshape(*packed.shape[:-1], packed.shape[-1] // 4, 4).to(torch.int64)
    return b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)


def _bytes(w: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Inverse of :func:`_words`."""
    return torch.stack([(w >> (8 * i)) & 0xFF for i in range(4)], dim=-1).to(torch.uint8).reshape(shape)


def to_shf(packed: torch.Tensor) -> torch.Tensor:
    """Standard-order NVFP4 bytes ``[..., 4n]`` (uint8) -> the same data in shf order."""
    w = _words(packed)
    out = torch.zeros_like(w)
    for e, pos in enumerate(SHF_BITS):
        for bit, p in enumerate(pos):
            out |= ((w >> (4 * e + bit)) & 1) << p
    return _bytes(out, packed.shape)


def from_shf(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`to_shf`."""
    w = _words(packed)
    out = torch.zeros_like(w)
    for e, pos in enumerate(SHF_BITS):
        for bit, p in enumerate(pos):
            out |= ((w >> p) & 1) << (4 * e + bit)
    return _bytes(out, packed.shape)


__all__ = ["SHF_BITS", "from_shf", "to_shf"]
