"""Head_dim-256 decode rows for bench_kernels.py (``--head-dims 256``): the hybrid models' full-attention
layers (Qwen3.5 / Qwen3-Next: GQA 6 and 8, 16-token pages) in every KV dtype, each default kernel with and
without the 64-token bf16 tail, the other kernels that could serve them and decode_mma's untimed knobs.
"""

from __future__ import annotations

from benchmarks.bench_kernels import DTYPES, NAMES, AddRow, Pools, run_decode
from benchmarks.timing import _empty_cache
from nibblekv.formats.layout import KVDtype
from nibblekv.kernels._common import fmt_code
from nibblekv.kernels.decode.knobs import base_config
from nibblekv.kernels.decode.launch_config import DecodeKernel

# The hybrid models' full-attention layers at head_dim 256, (q heads, KV heads): Qwen3.5-27B (GQA 6) and
# Qwen3-Next-80B (GQA 8); batch x context >= 256K tokens (issue 50's acceptance shapes)
HD256_HEADS = ((24, 4), (16, 2))
HD256_SHAPES = ((64, 8192), (8, 32768), (1, 262144))
# NOTE: decode_mma's launch knobs at head_dim 256 (decode.knobs.mma_knobs: 8 programs per SM, the next tile
# prefetched, the tile a step ahead prefetched into L2, token-balanced from 208 pairs, 512 partial slots a
# pair), each beside the default (no tail). H100 / H200, one run each: 12 per SM and pf=0 lost 0.05-0.25 of
# the ceiling (dropped from the sweep since), per-pair splits within 0.02, the L2 prefetch won 0.02-0.03 /
# 0.03-0.08 (l2off times it off; the H200 gains more, so l2x2 / l2x3 time it two and three steps ahead);
# 256 slots a pair lost 0.11 at GQA 8 B1x256K (one request over 2 KV heads fills half the program slots)
HD256_MMA_VARIANTS: dict[str, dict[str, int]] = {
    "decode_mma_bal0": {"balanced": 0},
    "decode_mma_l2off": {"l2_ahead": 0},
    "decode_mma_l2x2": {"l2_ahead": 2},
    "decode_mma_l2x3": {"l2_ahead": 3},
    "decode_mma_slots256": {"mma_slots": 256},
}
# FP8 `tok` with the tail at the 64-token tail tile it had before 32 (decode.knobs.tok_knobs: the 64-token
# tile's buffers took the shared memory of a second program per SM)
HD256_FP8_TAIL_VARIANTS: dict[str, dict[str, int]] = {"decode_tail64_tok_tbn64": {"tail_block_n": 64}}
# the other kernel that could serve these pools: "paged", every dtype's default at 256 before decode_mma
# (NVFP4) and decode_tok (FP8 / BF16, decode.config.TOK_VERIFIED_HEAD_DIMS) were timed there
HD256_OTHERS = tuple((dt, DecodeKernel.PAGED) for dt in (KVDtype.NVFP4, KVDtype.FP8, KVDtype.BF16))
def hd256_rows(add: AddRow, smoke: bool, alternatives: bool) -> None:
    """Decode rows at head_dim 256 through ``add`` (``main``'s row builder): every dtype's default kernel with
    and without the 64-token bf16 tail at every shape (the acceptance rows), or (``alternatives``)
    ``HD256_OTHERS`` and (NVFP4) ``HD256_MMA_VARIANTS`` without it. The smoke run: one shape of 80 tokens,
    GQA 6 on one KV head."""
    heads = ((6, 1),) if smoke else HD256_HEADS
    shapes = ((1, 80),) if smoke else HD256_SHAPES
    for hq, hkv in heads:
        pools = Pools({dt: max(b * c for b, c in shapes) + 4096 for dt in DTYPES}, hkv, 256)
        for b, c in shapes:
            if alternatives:
                _alternative_rows(add, pools, b, c, hq, hkv)
                continue
            for dt in DTYPES:
                for tail in (False, True):
                    us, nb = run_decode(pools, dt, b, c, hq, tail)
                    add("decode_tail64" if tail else "decode", NAMES[dt], b, c, hq, hkv, 256, us, nb)
        del pools
        _empty_cache()


def _alternative_rows(add: AddRow, pools: Pools, b: int, c: int, hq: int, hkv: int) -> None:
    """``HD256_OTHERS`` with and without the tail, ``HD256_FP8_TAIL_VARIANTS`` with it, ``HD256_MMA_VARIANTS``
    without, at one shape."""
    for dt, kernel in HD256_OTHERS:
        for tail in (False, True):
            cfg = base_config(kernel, fmt_code(dt), 256)
            us, nb = run_decode(pools, dt, b, c, hq, tail, cfg)
            add(f"decode{'_tail64' if tail else ''}_{kernel.value}", NAMES[dt], b, c, hq, hkv, 256, us, nb)
    for name, knobs in HD256_FP8_TAIL_VARIANTS.items():
        cfg = base_config(DecodeKernel.TOK, fmt_code(KVDtype.FP8), 256).replace(**knobs)
        us, nb = run_decode(pools, KVDtype.FP8, b, c, hq, True, cfg)
        add(name, "fp8_e4m3", b, c, hq, hkv, 256, us, nb)
    for name, knobs in HD256_MMA_VARIANTS.items():
        cfg = base_config(DecodeKernel.MMA, fmt_code(KVDtype.NVFP4), 256).replace(**knobs)
        us, nb = run_decode(pools, KVDtype.NVFP4, b, c, hq, False, cfg)
        add(name, "nvfp4", b, c, hq, hkv, 256, us, nb)
