"""The "sm" bit order of NVFP4 data: each aligned 32-bit word's 8 nibbles, signs and magnitudes apart.

The standard order (:func:`nibblekv.formats.e2m1.pack`) keeps element ``e`` of a little-endian word in bits
``4e .. 4e+3`` (code ``s e1 e0 m``). Turning such a word into 4 half2 takes 5 ALU-pipe integer ops, 2
``IMAD`` shifts and 4 ``cvt.rn.f16x2.e4m3x2`` (ALU pipe too): on Hopper the ALU pipe issues at half the
rate of the FMA pipe, and it limits the NVFP4 decode kernel. In the sm order each 16-bit half holds its
4 elements' signs in bits 12..15 and their 3-bit magnitudes (``e1 e0 m``) in bits 0..11, so left shifts
(``IMAD.SHL``, FMA pipe) and masks put them at an fp16's bit 15 (s) and bits 11..9 (e1 e0 m) =
``value * 2**-14`` -- 6 ALU ops (masks), one shift and two multiplies give the same 4 half2 (``M =
0x8E008E00``)::

    out0 = w & M                                                 = (e0, e2)
    out1 = (w << 3) & M                                          = (e4, e6)
    out2 = ((w << 9) & 0x0E000E00) | ((w << 1) & 0x80008000)     = (e1, e3)
         = ((w & 0x40074007) * 514) & M                           (514 = 2**9 + 2**1)
    out3 = ((w << 6) & 0x0E000E00) | ((w << 2) & 0x80008000)     = (e5, e7)
         = ((w & 0x20382038) * 68) & M                            (68 = 2**6 + 2**2)

The multiply puts two shifted copies of the isolated bits in one word; in this order they never overlap each
other or a wanted bit, so it adds without a carry and the mask keeps the wanted copy (equal to the two-shift
form for all 2**32 words). With e1 and e5's magnitudes swapped (e1 at 3..5, e5 at 0..2) only out3 has
that form (out2's copies collide); a search over the shift choices that partition a 16-bit half
found this order, which gives both.

(low half, high half) each. The low 16 bits hold e0, e4, e1, e5 and the high 16 bits e2, e6, e3, e7 in
the same places (+16), so pairing two tokens' low (high) halves with one ``prmt`` and decoding that gives
(token x, token y) half2 of one element -- what the value operand of ``mma.sync`` wants. No order lets
every output be one shift and one mask (4 translates of the pattern cannot tile 32 bits; checked
exhaustively), so two outputs take two masks (and a multiply).
"""

from __future__ import annotations

import torch

# SM_BITS[e] = bit positions of element e's (m, e0, e1, s) within its 32-bit word
SM_BITS: tuple[tuple[int, int, int, int], ...] = (
    (9, 10, 11, 15),  # e0
    (0, 1, 2, 14),  # e1
    (25, 26, 27, 31),  # e2
    (16, 17, 18, 30),  # e3
    (6, 7, 8, 12),  # e4
    (3, 4, 5, 13),  # e5
    (22, 23, 24, 28),  # e6
    (19, 20, 21, 29),  # e7
)


def _words(packed: torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., 4n]`` -> int64 ``[..., n]`` little-endian words."""
    if packed.dtype != torch.uint8 or packed.shape[-1] % 4:
        raise ValueError(
            f"needs uint8 data with a last dimension divisible by 4, got {packed.dtype} {packed.shape}"
        )
    b = packed.reshape(*packed.shape[:-1], packed.shape[-1] // 4, 4).to(torch.int64)
    return b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)


def _bytes(w: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Inverse of :func:`_words`."""
    return torch.stack([(w >> (8 * i)) & 0xFF for i in range(4)], dim=-1).to(torch.uint8).reshape(shape)


def to_sm(packed: torch.Tensor) -> torch.Tensor:
    """Standard-order NVFP4 bytes ``[..., 4n]`` (uint8) -> the same data in sm order."""
    w = _words(packed)
    out = torch.zeros_like(w)
    for e, pos in enumerate(SM_BITS):
        for bit, p in enumerate(pos):
            out |= ((w >> (4 * e + bit)) & 1) << p
    return _bytes(out, packed.shape)


def from_sm(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`to_sm`."""
    w = _words(packed)
    out = torch.zeros_like(w)
    for e, pos in enumerate(SM_BITS):
        for bit, p in enumerate(pos):
            out |= ((w >> p) & 1) << (4 * e + bit)
    return _bytes(out, packed.shape)


__all__ = ["SM_BITS", "from_sm", "to_sm"]
