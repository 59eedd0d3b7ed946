"""Question: which FP8 GEMM launch makes the engine's decode step fastest at 1-16 tokens? Runs
``bench_engine.py``'s long part with ``gemm_tile``'s choice for <= 16 tokens replaced by one variant.

Usage on the device (one variant a run; the rest of the arguments go to ``bench_engine.py``)::

    PYTHONPATH=. python benchmarks/tools/fp8_decode_tiles.py p4 --part long --long-requests 1 16 \
        --long-input 2048 --long-output 40 --quantization fp8 --kv-dtypes fp8_e4m3 --synthetic-prefill \
        --out DIR

Variants: ``default`` (``gemm_tile`` as it is); ``p<N>``: 16x64 tiles, 4 warps, 5 stages, k-splits for
~N programs an SM (at least 4 k-blocks a split, at most 16 splits); ``p<N>x``: the same swapped
(``GemmTile.swap_ab``), 4 stages, the splits rounded down to a power of two; ``t<BN>w<W>s<S>k<K>``: 16 x BN
tiles, W warps, S stages, K splits.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable
from pathlib import Path

import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for bench_engine
import bench_engine  # noqa: E402

from nibblekv.kernels.fp8 import gemm, tiles  # noqa: E402


def variant_tile(spec: str, default: tiles.GemmTile, n: int, kblocks: int) -> tiles.GemmTile:
    """The launch ``spec`` names for an output of ``n`` columns over ``kblocks`` k-blocks at <= 16 tokens."""
    if spec == "default":
        return default
    if m := re.fullmatch(r"p(\d+)", spec):
        return tiles.GemmTile(16, 64, 4, 5, tiles.decode_splits(int(m[1]), triton.cdiv(n, 64), kblocks))
    if m := re.fullmatch(r"p(\d+)x", spec):
        split = tiles.decode_splits(int(m[1]), triton.cdiv(n, 64), kblocks, pow2=True)
        return tiles.GemmTile(16, 64, 4, 4, split, swap_ab=True)
    if m := re.fullmatch(r"t(\d+)w(\d+)s(\d+)k(\d+)", spec):
        bn, warps, stages, split = (int(g) for g in m.groups())
        return tiles.GemmTile(16, bn, warps, stages, min(split, kblocks))
    raise SystemExit(f"unknown variant {spec!r}: default, p<N>, p<N>x or t<BN>w<W>s<S>k<K>")


def override(spec: str, original: Callable[..., tiles.GemmTile]) -> Callable[..., tiles.GemmTile]:
    """``gemm_tile`` (``original``, same arguments) with ``spec``'s launch at <= 16 tokens; ``main`` puts it
    where the launcher looks it up (``gemm.gemm_tile``)."""

    @functools.lru_cache(maxsize=1024)
    def tile(m: int, n: int, kblocks: int, block: bool = False) -> tiles.GemmTile:
        chosen = original(m, n, kblocks, block)
        return chosen if m > 16 else variant_tile(spec, chosen, n, kblocks)

    return tile


def main() -> int:
    spec = sys.argv.pop(1)
    variant_tile(spec, gemm.gemm_tile(1, 4096, 32), 4096, 32)  # a bad spec fails before the model loads
    gemm.gemm_tile = override(spec, gemm.gemm_tile)  # type: ignore[assignment]
    print(f"fp8_decode_tiles: variant {spec}", flush=True)
    return bench_engine.main()


if __name__ == "__main__":
    sys.exit(main())
