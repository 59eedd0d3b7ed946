"""decode_mma's two nibble converters, exhaustively: every byte and every finite E4M3 block scale.

``_cvt_word`` (E4M3 bytes + ``cvt``) gives value * 2**-6 * s, ``_cvt_word_alu`` (integer ops only, variant
option ``cv``) value * 2**-14 * s; both must be exact. On CPU the interpreter runs their Triton twins, on a
GPU the inline PTX.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from nibblekv.kernels import _mma_tile as dm  # decode_mma / decode_mma16's fragment helpers

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


@triton.jit
def _convert_kernel(x_ptr, s_ptr, out_ptr, N: tl.constexpr, ALU: tl.constexpr):
    i = tl.arange(0, N)
    x = tl.load(x_ptr + i)
    s = tl.load(s_ptr + i)
    r0, r1, r2, r3 = dm._cvt(x, s, ALU)
    tl.store(out_ptr + 4 * i, r0)
    tl.store(out_ptr + 4 * i + 1, r1)
    tl.store(out_ptr + 4 * i + 2, r2)
    tl.store(out_ptr + 4 * i + 3, r3)


def _halves(packed: torch.Tensor) -> torch.Tensor:
    """uint32-as-int64 ``[N, 4]`` -> fp32 ``[N, 8]``: (lo, hi) half of each register."""
    lo = (packed & 0xFFFF).to(torch.int16).view(torch.float16)  # wraps above 0x7FFF: the sign bit
    hi = ((packed >> 16) & 0xFFFF).to(torch.int16).view(torch.float16)
    return torch.stack([lo, hi], -1).reshape(packed.shape[0], 8).float()


def _nibble_values(words: torch.Tensor) -> torch.Tensor:
    """The converters' output order: (lo0, lo1), (lo2, lo3), (hi0, hi1), (hi2, hi3) of the 4 bytes."""
    shifts = torch.tensor([0, 8, 16, 24, 4, 12, 20, 28])
    n = (words[:, None] >> shifts) & 0xF
    return torch.where(n >= 8, -1.0, 1.0) * E2M1[n & 7]


@pytest.mark.parametrize("alu", [0, 1])
def test_converters_exact_for_every_byte_and_scale(alu: int) -> None:
    n = 1024
    g = torch.Generator().manual_seed(alu)
    words = torch.randint(0, 2**32, (n,), generator=g, dtype=torch.int64)
    words[:256] = torch.arange(256) * 0x01010101  # every byte value, in every byte position
    # every finite positive E4M3 scale byte (0x01..0x7E), the same in both halves of the multiplier
    codes = torch.arange(n) % 126 + 1
    scale = codes.to(torch.uint8).view(torch.float8_e4m3fn).to(torch.float16)
    s_bits = scale.view(torch.int16).to(torch.int64) & 0xFFFF
    mult = s_bits | (s_bits << 16)
    x_dev = words.to(torch.int32).to(DEVICE)  # same bits (two's complement) as the uint32 words
    s_dev = mult.to(torch.int32).to(DEVICE)
    out = torch.full((n * 4,), -1, dtype=torch.int32, device=DEVICE)
    # NOTE: uint32 views: the converters shift logically
    _convert_kernel[(1,)](x_dev.view(torch.uint32), s_dev.view(torch.uint32), out.view(torch.uint32), N=n, ALU=alu)
    got = _halves(out.cpu().to(torch.int64).reshape(n, 4) & 0xFFFFFFFF)
    want = _nibble_values(words) * scale.float()[:, None] * (2.0**-14 if alu else 2.0**-6)
    assert torch.equal(got, want), (got - want).abs().max()
