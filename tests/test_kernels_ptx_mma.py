"""decode_mma's nibble converter, exhaustively: every byte and every finite E4M3 block scale.

``_cvt_word_sm`` turns a word of the pool's sm bit order (``nibblekv.formats.sm_words``) into 4 half2
``value * 2**-14 * s``, which must be exact; ``_pair_halves`` pairs two tokens' words for V. On CPU the
interpreter runs their Triton twins, on a GPU the inline PTX.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from nibblekv.formats.sm_words import from_sm, to_sm
from nibblekv.kernels.ptx import mma as mp  # decode_mma / decode_mma16's per-lane helpers

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


@triton.jit
def _convert_kernel(x_ptr, s_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    x = tl.load(x_ptr + i)
    s = tl.load(s_ptr + i)
    r0, r1, r2, r3 = mp._cvt_word_sm(x, s)
    tl.store(out_ptr + 4 * i, r0)
    tl.store(out_ptr + 4 * i + 1, r1)
    tl.store(out_ptr + 4 * i + 2, r2)
    tl.store(out_ptr + 4 * i + 3, r3)


def _halves(packed: torch.Tensor) -> torch.Tensor:
    """uint32-as-int64 ``[N, 4]`` -> fp32 ``[N, 8]``: (lo, hi) half of each register."""
    lo = (packed & 0xFFFF).to(torch.int16).view(torch.float16)  # wraps above 0x7FFF: the sign bit
    hi = ((packed >> 16) & 0xFFFF).to(torch.int16).view(torch.float16)
    return torch.stack([lo, hi], -1).reshape(packed.shape[0], 8).float()


def _words_bytes(words: torch.Tensor) -> torch.Tensor:
    """int64 words ``[N]`` -> their little-endian bytes ``[N, 4]`` (uint8)."""
    return torch.stack([(words >> (8 * i)) & 0xFF for i in range(4)], -1).to(torch.uint8)


def _nibble_values(words: torch.Tensor) -> torch.Tensor:
    """sm-order words -> the converter's output order: elements (e0, e2), (e4, e6), (e1, e3), (e5, e7)."""
    std = from_sm(_words_bytes(words)).to(torch.int64)
    std = std[:, 0] | (std[:, 1] << 8) | (std[:, 2] << 16) | (std[:, 3] << 24)
    shifts = torch.tensor([0, 8, 16, 24, 4, 12, 20, 28])  # element e sits at bits 4e..4e+3
    n = (std[:, None] >> shifts) & 0xF
    return torch.where(n >= 8, -1.0, 1.0) * E2M1[n & 7]


def test_sm_order_round_trips_and_places_each_element_once() -> None:
    x = torch.randint(0, 256, (64, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    assert torch.equal(from_sm(to_sm(x)), x)
    one = torch.zeros(1, 4, dtype=torch.uint8)
    seen = set()
    for bit in range(32):  # each standard bit lands on its own sm bit
        one.zero_()
        one[0, bit // 8] = 1 << (bit % 8)
        w = to_sm(one).to(torch.int64)
        seen.add(int(w[0, 0] | (w[0, 1] << 8) | (w[0, 2] << 16) | (w[0, 3] << 24)))
    assert len(seen) == 32 and all(v & (v - 1) == 0 for v in seen)


def _cases(seed: int, n: int = 1024) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(words, half2 scale multipliers, the exact outputs ``[n, 8]``): every byte value in every byte
    position, then random words; every finite positive E4M3 scale byte (0x01..0x7E) in both halves."""
    g = torch.Generator().manual_seed(seed)
    words = torch.randint(0, 2**32, (n,), generator=g, dtype=torch.int64)
    words[:256] = torch.arange(256) * 0x01010101
    scale = (torch.arange(n) % 126 + 1).to(torch.uint8).view(torch.float8_e4m3fn).to(torch.float16)
    s_bits = scale.view(torch.int16).to(torch.int64) & 0xFFFF
    want = _nibble_values(words) * scale.float()[:, None] * 2.0**-14
    return words, s_bits | (s_bits << 16), want


def test_converter_exact_for_every_byte_and_scale() -> None:
    words, mult, want = _cases(0)
    n = words.shape[0]
    x_dev = words.to(torch.int32).to(DEVICE)  # same bits (two's complement) as the uint32 words
    s_dev = mult.to(torch.int32).to(DEVICE)
    out = torch.full((n * 4,), -1, dtype=torch.int32, device=DEVICE)
    # NOTE: uint32 views: the converters shift logically
    _convert_kernel[(1,)](x_dev.view(torch.uint32), s_dev.view(torch.uint32), out.view(torch.uint32), N=n)
    got = _halves(out.cpu().to(torch.int64).reshape(n, 4) & 0xFFFFFFFF)
    assert torch.equal(got, want), (got - want).abs().max()


def _emulate_ptx(ptx: str, regs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Runs the subset of PTX that ``_CVT_WORD_SM_PTX`` uses (b32 and / or / shl, mul.lo.u32, mul.rn.f16x2)
    on uint32 arrays, register by register -- the converter's own text, which the interpreter never runs."""
    m32 = np.uint64(0xFFFFFFFF)
    for stmt in ptx.replace("{", ";").replace("}", ";").split(";"):
        words = stmt.replace(",", " ").split()
        if not words or words[0] == ".reg":
            continue
        op, dst, *src = words
        a, b = (regs[x] if x in regs else np.uint64(int(x, 0)) for x in src)
        a, b = a.astype(np.uint64), b.astype(np.uint64)
        if op == "mul.rn.f16x2":  # each 16-bit half as fp16, rounded to nearest even
            halves = [(x >> np.uint64(k)) & np.uint64(0xFFFF) for x in (a, b) for k in (0, 16)]
            f = [h.astype(np.uint16).view(np.float16) for h in halves]
            lo, hi = ((f[i] * f[i + 2]).view(np.uint16).astype(np.uint64) for i in (0, 1))
            regs[dst] = lo | (hi << np.uint64(16))
        else:
            fn = {"and.b32": np.bitwise_and, "or.b32": np.bitwise_or, "mul.lo.u32": np.multiply,
                  "shl.b32": np.left_shift}[op]  # fmt: skip
            regs[dst] = fn(a, b) & m32
    return regs


def test_converter_ptx_text_is_exact_on_the_cpu() -> None:
    # the inline PTX of _cvt_word_sm (GPU only) emulated: every byte in every position, random words, every
    # finite positive E4M3 scale -> the same fp16 bits as E2M1 value * 2**-14 * scale
    words, mult, want = _cases(1)
    regs = {"$4": words.numpy().astype(np.uint64), "$5": mult.numpy().astype(np.uint64)}
    out = _emulate_ptx(str(mp._CVT_WORD_SM_PTX.value), regs)
    got = _halves(torch.from_numpy(np.stack([out[f"${i}"] for i in range(4)], -1).astype(np.int64)))
    assert torch.equal(got, want), (got - want).abs().max()


@triton.jit
def _pair_kernel(a_ptr, b_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    p, q = mp._pair_halves(tl.load(a_ptr + i), tl.load(b_ptr + i))
    tl.store(out_ptr + 2 * i, p)
    tl.store(out_ptr + 2 * i + 1, q)


def test_pair_halves_takes_each_tokens_low_then_high_half() -> None:
    a = torch.tensor([0x11223344, 0x7FFF0000, 0x0000FFFF, 0x80000001], dtype=torch.int64)
    b = torch.tensor([0x55667788, 0x00018000, 0x12345678, 0xFFFFFFFF], dtype=torch.int64)
    out = torch.full((8,), -1, dtype=torch.int32, device=DEVICE)
    a_dev, b_dev = a.to(torch.int32).to(DEVICE), b.to(torch.int32).to(DEVICE)
    _pair_kernel[(1,)](a_dev.view(torch.uint32), b_dev.view(torch.uint32), out.view(torch.uint32), N=4)
    got = out.cpu().to(torch.int64).reshape(4, 2) & 0xFFFFFFFF
    assert torch.equal(got[:, 0], (a & 0xFFFF) | ((b & 0xFFFF) << 16))
    assert torch.equal(got[:, 1], (a >> 16) | (b & 0xFFFF0000))
