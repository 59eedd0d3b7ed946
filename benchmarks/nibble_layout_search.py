"""Could a re-encoded NVFP4 byte make the in-register conversion cheaper? An exhaustive check (CPU, seconds).

Until stop 38 a word of 8 nibbles cost 7 integer ops before ``cvt.rn.f16x2.e4m3x2`` (the E4M3 route; since
then the pool stores words in sm order, ``nibblekv/formats/sm_words.py``, decoded without cvt): the high nibbles sit 2 bits above their E4M3 place (sign already at
bit 7), the low ones need two shifts. If a byte's 8 bits were stored in another order, one value could sit
at its E4M3 (``s..e1 e0 m..``: bits 7,4,3,2) or E5M2 (bits 7,3,2,1) place -- one mask -- and the question
is whether the other value can then be moved into place by ONE rotation of the word, or by ONE multiply of
its masked bits by a constant with <= 4 power-of-two terms (an ``IMAD``: several shifts summed), without
carries corrupting any output bit. Prints the solutions; there are none, so a storage re-layout saves at
most ~2 of the word's 15 conversion instructions.

Usage: ``python benchmarks/nibble_layout_search.py``
"""

from __future__ import annotations

import itertools
import random

# output bit positions of (m, e0, e1, sign) inside a byte
TARGETS = {"e4m3": (2, 3, 4, 7), "e5m2": (1, 2, 3, 7)}


def rotation_solutions() -> list[tuple[str, str, int]]:
    """(first format, second format, rotation) where the complement of the first value's bits, rotated,
    is exactly the second format's bits in every byte."""
    out = []
    for n1, t1 in TARGETS.items():
        first = {b + 8 * j for b in t1 for j in range(4)}
        rest = set(range(32)) - first
        for n2, t2 in TARGETS.items():
            want = {b + 8 * j for b in t2 for j in range(4)}
            out += [(n1, n2, k) for k in range(1, 32) if {(b + k) % 32 for b in rest} == want]
    return out


def multiply_solutions(samples: int = 2000) -> list[tuple[str, str, tuple[int, ...], int, list[int]]]:
    """(first format, second format, the second value's source bits, output byte offset, shifts summed)."""
    rng = random.Random(1)
    words = [rng.getrandbits(32) for _ in range(samples)] + [0xFFFFFFFF, 0]
    out = []
    for n1, t1 in TARGETS.items():
        free = [b for b in range(8) if b not in t1]
        for n2, t2 in TARGETS.items():
            for src in itertools.permutations(free, 4):
                mask = sum(1 << (b + 8 * j) for b in src for j in range(4))
                for off in (0, 1):  # the value lands in its own byte or the next one (64-bit product)
                    shifts = [t2[i] + 8 * off - src[i] for i in range(4)]
                    if min(shifts) < 0 or len(set(shifts)) > 4:
                        continue
                    mult = sum(1 << k for k in set(shifts))
                    if all(
                        (w >> (src[i] + 8 * j)) & 1 == ((w & mask) * mult >> (t2[i] + 8 * (j + off))) & 1
                        for w in words
                        for j in range(4)
                        for i in range(4)
                    ):
                        out.append((n1, n2, src, off, sorted(set(shifts))))
    return out


if __name__ == "__main__":
    print("one rotation:", rotation_solutions())
    print("one multiply:", multiply_solutions())
