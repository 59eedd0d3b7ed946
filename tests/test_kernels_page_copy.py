"""Page gather/scatter for the host tier: every byte equals the pure-torch twin's (interpreter on CPU)."""

from __future__ import annotations

import pytest
import torch

from nibblekv.kernels.page_copy import (
    gather_pages_ref,
    gather_pages_triton,
    scatter_pages_ref,
    scatter_pages_triton,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _segments(widths: list[int], pages: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (pages, w), generator=g, dtype=torch.uint8).to(DEVICE) for w in widths]


# 1 segment (bf16/fp8 K only), 2 (K, V), 4 (NVFP4: K, V data + scales); odd widths, one of 1 byte,
# one past the 4096-byte block (a second loop iteration)
@pytest.mark.parametrize("widths", [[7], [32, 32], [40, 40, 5, 5], [4100, 1, 3, 17]])
def test_gather_and_scatter_match_the_reference(widths: list[int]) -> None:
    segs = _segments(widths, 9, 0)
    idx = torch.tensor([3, 1, 8, 4], dtype=torch.int64, device=DEVICE)  # unordered, page 0 untouched
    ref = torch.full((4, sum(widths)), 0xAB, dtype=torch.uint8, device=DEVICE)
    out = torch.full_like(ref, 0x5C)  # a different poison: every byte must be written
    gather_pages_ref(segs, idx, ref)
    gather_pages_triton(segs, idx, out)
    assert torch.equal(out, ref)
    # scatter new rows back into copies of the segments: equal bytes, and pages not in idx unchanged
    rows = torch.randint(0, 256, ref.shape, dtype=torch.uint8, device=DEVICE)
    a, b = [s.clone() for s in segs], [s.clone() for s in segs]
    scatter_pages_ref(rows, a, idx)
    scatter_pages_triton(rows, b, idx)
    for x, y, s in zip(a, b, segs):
        assert torch.equal(x, y)
        assert torch.equal(y[[0, 2, 5, 6, 7]], s[[0, 2, 5, 6, 7]])
    # round trip: gathering the scattered pages gives the rows back
    back = torch.empty_like(rows)
    gather_pages_triton(b, idx, back)
    assert torch.equal(back, rows)


def test_strided_segment_views_and_empty_idx() -> None:
    # pool segments are views of [pages, heads, page, width] tensors: a page row's stride may exceed its width
    base = _segments([64], 6, 1)[0]
    seg = base[:, :48]  # stride 64, width 48
    idx = torch.tensor([5, 2], dtype=torch.int64, device=DEVICE)
    out = torch.empty((2, 48), dtype=torch.uint8, device=DEVICE)
    gather_pages_triton([seg], idx, out)
    assert torch.equal(out, seg[[5, 2]])
    gather_pages_triton([seg], idx[:0], out[:0])  # nothing to do


def test_launcher_rejects_bad_arguments() -> None:
    segs = _segments([8, 8], 4, 2)
    idx = torch.tensor([1], dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="rows must be"):
        gather_pages_triton(segs, idx, torch.empty((1, 15), dtype=torch.uint8, device=DEVICE))
    with pytest.raises(ValueError, match="idx must be"):
        gather_pages_triton(segs, idx.int(), torch.empty((1, 16), dtype=torch.uint8, device=DEVICE))
    with pytest.raises(ValueError, match="segments"):
        gather_pages_triton(_segments([1] * 5, 4, 3), idx, torch.empty((1, 5), dtype=torch.uint8, device=DEVICE))
    with pytest.raises(ValueError, match="segments must be"):
        gather_pages_triton([segs[0].float()], idx, torch.empty((1, 8), dtype=torch.uint8, device=DEVICE))
