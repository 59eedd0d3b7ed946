"""The tuned knobs of each decode kernel family (``base_config``): what a launch of ``decode_tok``,
``decode_paged`` or the ``decode_mma`` family defaults to for a pool's format and head_dim. The NOTEs give the
measurements behind each default (docs/results.md, what we tried, has the rest); ``decode.config`` decides
which family serves a batch.
"""

from __future__ import annotations

from nibblekv.kernels._common import FMT_FLOAT, FMT_FP8, FMT_NVFP4, interpreting
from nibblekv.kernels.decode.launch_config import DecodeConfig, DecodeKernel

# NOTE: balanced=2 turns decode_balanced on from this many (request, KV head) pairs (DecodeConfig.bal_pairs).
# At 26 x 8 = 208 pairs the balanced kernel at 12 programs per SM reads .771 vs .760 for per-pair splits
# (B26x32K with the bf16 tail, H200; at 16 per SM it lost there, .714 vs .729); 8 x 8 = 64 pairs stay
# per-pair (.668 vs .585 at 16). Head_dim 128, with the L2 prefetch a step ahead (which the balanced kernel
# takes there since): B19x160K (152 pairs) .921 -> .938, B12x160K (96) .921 -> .922, B3x1M (24) .930 -> .942
# (H100, bench_decode_variants --tail, one run; without the prefetch .919 / .877 / .907): from 152 there
BALANCED_MIN_PAIRS = 208
BALANCED_MIN_PAIRS_128 = 152
# NOTE: the L2 prefetch distance the balanced kernel takes where DecodeConfig.l2_ahead is None, by head_dim
# (as WIDE_L2 for decode_mma16): at 128 +.01-.04 over bal=1 alone at every shape timed (the runs above);
# head_dim 256 has it on for every mma kernel (mma_knobs' l2_ahead)
BALANCED_L2 = {128: 1}

# NOTE: one-warp programs per SM, decode_mma16: 64 accumulators + 32 Q registers need more than 128 (16 a SM).
# 12 (168 registers, no spill) lost at GQA 16 on the H200: .52-.60 vs .56-.63 of the ceiling, B64x8K/32x8K/
# 8x32K/128x8K, two rounds each way. Its L2 prefetch a step ahead (option l2) gains 1-4% there
# (2.56-2.89 -> 2.64-2.93 TB/s, two rounds); two steps ahead (l2=2) gains less
WIDE_PPSM = 8
WIDE_L2 = 1


def paged_knobs(fmt: int, d: int, interp: bool) -> dict[str, int | bool]:
    """Launch config by format (H200 sweeps in benchmarks/bench_kernels.py).

    NOTE: with the page-table load in the loop, triton 3.6's pipeliner keeps ``num_stages - 3`` data
    buffers in flight at BN=64/128 (checked in the TTGIR): stages <= 4 means no overlap at all.
    """
    if interp:
        return {"block_n": 16, "tail_block_n": 16, "num_warps": 4, "num_stages": 1, "conv": 0}
    bn = 128 if d <= 128 else 64
    if fmt == FMT_NVFP4:
        return {"block_n": bn, "tail_block_n": 64, "num_warps": 4, "num_stages": 6, "conv": 1}
    if fmt == FMT_FLOAT:
        return {"block_n": 64, "tail_block_n": 64, "num_warps": 4, "num_stages": 6, "conv": 0}
    return {"block_n": bn, "tail_block_n": 64, "num_warps": 4, "num_stages": 5, "conv": 0}


def mma_knobs(d: int) -> dict[str, int | bool]:
    """``mma`` (decode_mma): 16-token tiles per warp, ``num_warps`` warps per program, no Triton pipelining
    (the kernel prefetches the next tile itself); ``tail_block_n`` is the bf16 tail's ``tl.dot`` block."""
    return {
        "block_n": 16,
        "tail_block_n": 64,
        "num_warps": 1,
        "num_stages": 1,
        "conv": 0,
        # NOTE: one wave of 16 one-warp programs per SM (128 registers): 0.63 of the H200's read ceiling at
        # B8x32K / B32x8K vs 0.60 at 32 (two waves), 0.57 at 24 or 48, equal at B64x32K.
        # Head_dim 64 (two tokens a row): 12 (168 registers). At 128 ptxas sank the next step's loads into
        # the loop's last ~90 of ~780 SASS and moved a 64-bit value through local memory; at 168 they issue
        # ~300 SASS before the end: B8x32K / B64x8K / B64x32K .541/.599/.672 -> .637/.710/.775 (H200,
        # two runs). Head_dim 128 GQA 4 at 12 (158 registers, no spill): the same, at 128 registers the next
        # step's loads sit in the loop's last 7-13% (sm_90 SASS), at 158 at 49-61%. H200, when most shapes ran
        # per pair: B1x128K .623 -> .637, B8x32K equal (B32x8K .654 -> .697, B64x32K equal, B26x32K .770 ->
        # .745: balanced since); H100 with the tail, per pair (< 152 pairs): B1x128K .773 -> .791, B11x160K
        # .920 -> .926, B3x1M .933 -> .934 (bench_decode_variants, one run): 12 since
        # Head_dim 256 (decode.mma256): 64 accumulators + 32 Q registers + two prefetched tiles' raw words
        # (80) do not fit 168: 8 (248 registers). 12 (with spills) lost on the H100 (bench_kernels.py
        # --head-dims 256, GQA 6 B64x8K / B8x32K / B1x256K): .70/.75/.72 vs .83/.80/.81; pf=0 .68/.67/.67
        "ppsm": 8 if d == 256 else 12,
        # NOTE: programs per SM for a GQA group of 9-16 columns (decode_mma16: 213 registers at tpi=2, sm_90)
        "wppsm": WIDE_PPSM,
        # NOTE: head_dim 256: one tile a step (two, with the prefetch, would hold 160 registers of raw words)
        "tpi": 1 if d == 256 else 2,
        "pf": 1,
        # NOTE: >= 4 tiles per split: in the engine at B=1 x 3K (CUDA graphs, 256 splits) one tile per
        # warp took 27.7 us a layer, minc 64 23.9 (FP8: 10.7; H200, with the tail inside the kernel);
        # no effect at B*ctx >= 256K (chunks >= 512 there)
        "minc": 64,
        # NOTE: 1 = the partial o as 16-byte vector stores (VST) and Q as 16-byte vector loads (VQ): the
        # one-wave grid loads Q and stores partials all at once. H200, one run, fraction of the
        # read ceiling at B64x32K / B8x32K / B32x8K / B1x128K: GQA 8 .73/.56/.55/.43 -> .72/.62/.62/.57;
        # GQA 4 .75/.63/.63/.57 -> .72/.64/.64/.58
        "vst": 1,
        "vq": 1,
        # NOTE: 1 = the bf16 tail is one more one-warp program of the grid (bf16 mma.sync), 0 = its own launch
        # (decode_tail_kernel) on a side stream. In the engine at B=1 x 3K (CUDA graphs, H200)
        # that launch cost ~6 us a layer even beside the main kernel: nvfp4 steps 5.74 ms vs 5.29 with no tail
        "tin": 1,
        # NOTE: 1 = the tail program loads the next 16-token tile's page id during this tile (one dependent
        # round trip a tile instead of two where a tile lies in one page): at B=1 x 2.7K (8B, CUDA graphs)
        # the decode kernel took 0.311 vs 0.331 / 0.329 ms a step (H200; sm_90 tail loop 408 -> 361 SASS).
        # Not taken: loading V beside K (ptxas already issues a tile's V loads before its QK^T mma, sm_90
        # SASS) and the tail programs first in the 1-D grid (0.316 vs 0.321 ms of decode a step)
        "tail_page_prefetch": 1,
        # NOTE: one-warp programs sharing each (request, KV head)'s bf16 tail, whole 16-row tiles each (a
        # slot each): at B=1 x 2.7K the one tail program (4 tiles of W=64) outlasted every split (decode
        # 10.2 vs 7.5 us a layer without the tail). Two runs each, decode kernel / step ms: ts=1 0.310 /
        # 4.76, ts=2 0.254-0.257 / 4.70, ts=4 0.264 / 4.71, FP8 0.252 / 4.72-4.74 (8B, CUDA graphs, H200)
        "tail_splits": 2,
        # NOTE: 1 = token-balanced split-K (decode_balanced): the batch's tiles cut into one wave of equal
        # chunks, which may cross (request, KV head) pairs; 2 (default) = on from BALANCED_MIN_PAIRS pairs.
        # H200, fraction of the read ceiling, mma -> bal=1:
        # B91x32K .555 -> .744, ragged 1x32K+63x1K .061 -> .450 and 4x32K+60x2K .147 -> .607, B64x32K .740
        # -> .747, B32x32K .720 -> .725, B128x8K .713 -> .698, B32x8K .641 -> .629, B26x32K .729 -> .720,
        # B8x32K .668 -> .585, B1x128K .572 -> .506 (per-pair splits win only with few, equally long pairs).
        # tpi=1 builds: equal on ragged batches, .01-.03 lower on uniform ones
        "balanced": 2,
        "bal_pairs": BALANCED_MIN_PAIRS_128 if d == 128 else BALANCED_MIN_PAIRS,
        # NOTE: programs per SM of the token-balanced kernel (DecodeConfig.bal_ppsm): 12 (168 registers, no
        # spill; at 128 it spilled 32-40 bytes). H200, two runs, 16 -> 12: GQA 4 B32x8K .654/.661 ->
        # .697/.696, GQA 8 B32x8K .670 -> .688; GQA 4 B128x8K .742 -> .737, B64x32K .764 -> .761.
        # Head_dim 256: 8, as ppsm (untimed, as BALANCED_MIN_PAIRS there)
        "bal_ppsm": 8 if d == 256 else 12,
        # NOTE: head_dim 256: the L2 prefetch of the tile a step ahead (decode_mma16's, 1 line a lane). H100,
        # NVFP4, fraction of the read ceiling, off -> on: GQA 6 B64x8K (balanced) .830 -> .855, B8x32K .798 ->
        # .828, B1x256K .805 -> .832; GQA 8 B64x8K .783 -> .809 (bench_kernels --head-dims 256, one run)
        "l2_ahead": 1 if d == 256 else None,
        # NOTE: head_dim 256 (8 programs per SM): at 256 partial slots a pair, one request x 2 KV heads fills
        # half the grid. H200, NVFP4, GQA 8 B1x256K .49 -> .60 of the read ceiling at 512; equal (+-.01) at
        # every other head_dim-256 row (GQA 6 and 8, B64x8K / B8x32K; bench_kernels --head-dims 256, one run)
        "mma_slots": 512 if d == 256 else 256,
        # NOTE: head_dim 256: bf16 partial outputs (8 KB a warp in fp32 at GQA 8, ~6% of the KV bytes a call
        # at B8 x 32K, written in one burst at the one wave's end and read again by the combine step). H100,
        # NVFP4, fp32 -> bf16: GQA 8 B8x32K .737 -> .756, B1x256K .734 -> .759; GQA 6 B8x32K .827 -> .834,
        # B1x256K .829 -> .840, B64x8K (balanced) .861 -> .874; rel. RMS 1.7e-3 -> 1.9e-3. Head_dim 128 (with
        # the tail): B8x32K equal, B1x128K .780 -> .791, B32x8K (balanced) .846 -> .825, so off there
        # (bench_decode_variants; results.md, head_dim 256). decode_triton keeps them fp32 where the combine
        # step merges whole rows (bf16 there: 15.7 vs 5.8 us at GQA 8 B64x8K, H100)
        "part_bf16": 1 if d == 256 else 0,
        # NOTE: the lazy softmax rescale (DecodeConfig.lazy_rescale) is off: H200, lz=4 / lz=8 within +-0.3%
        # at head_dim 128 (B19x160K / B3x1M / B11x160K with the tail), lz=8 -1.0 to -1.4% at 256 (GQA 8); H100
        # from HBM -0.3 to -1.3% (256: -2%). It gains only where the pages sit in L2 (--page-order l2: +2-8%)
        "lazy_rescale": 0,
        # NOTE: the L2 prefetch as one bulk copy a tile (DecodeConfig.l2_bulk) is off: H100, within 0.006 of
        # the per-lane lines at l2=1 and 2 (head_dim 128 B3x1M / B19x160K / B11x160K, 256 GQA 8), the H200
        # untimed. Further ahead evicts: l2=3 0.82-0.83 vs 0.95-0.96 (three steps of 12 warps an SM ~ 22 MB
        # of prefetched lines, one 25 MB L2 partition); per-pair l2=1 at 128 -3% at B1x128K (results.md)
        "l2_bulk": 0,
        # NOTE: the shared-memory ring of bulk copies (DecodeConfig.smem_stages, ptx.ring) is off. It keeps
        # stages - 1 steps of 4.6 KB in flight a warp without registers (~110 KB an SM at sms=3 vs ~55 KB by
        # the register prefetch) and needs fewer (head_dim 128: 125 vs 158, 256: 197 vs 211 on sm_90), but
        # lost on the H100: head_dim 128 B19x160K / B3x1M .957/.963 -> .939/.952 (sms=3), .951/.959
        # (sms=2,ppsm=16); 256 GQA 8 -1 to -4% (decode-smem-ring-h100.json; ncu: 9.5% of samples waited on
        # the page-table read addressing each copy, a step ahead since). The H200 is untimed
        "smem_stages": 0,
    }


def tok_knobs(fmt: int, d: int) -> dict[str, int | bool]:
    """Launch config of the per-token kernels (measured on the H200 at these settings; see
    ``decode.config.TOK_VERIFIED_HEAD_DIMS``).

    Picked by SASS instruction counts per token-head of the main loop (benchmarks/tools/sass_decode.py):
    FP8 with V as uint16-pair halves (sv=1, conv=1) at BN=128 is ~20 warp-instructions vs ~30 for "paged".
    NVFP4 decodes the pool's sm words (``_common.nvfp4_split``); ``conv`` applies to FP8 only.
    """
    if fmt == FMT_NVFP4:
        bn = 128 if d <= 128 else 64
        return {"block_n": bn, "tail_block_n": 64, "num_warps": 4, "num_stages": 4, "conv": 0, "split": 0}
    if fmt == FMT_FP8:
        # NOTE: num_stages 5 (2 buffers in flight): 0.92 / 0.74 / 0.74 / 0.67 of the H200's read ceiling at
        # B64x32K / B8x32K / B32x8K / B1x128K vs 0.80 / 0.66 / 0.66 / 0.62 at 4 (same run).
        # wave_ctas 2 (head_dim 128; default_num_splits): H200, with the tail: B8x32K .768 -> .826 (4
        # splits), B16x16K .768 -> .820 (2), B32x8K .746 -> .825 (1); GQA 8 B8x32K .756 -> .848, B32x8K
        # .744 -> .852; B64x32K .930 either way. Head_dim 64 (122
        # registers: 4 programs per SM) wave_ctas 4: B8x32K .693 -> .750, B32x8K .688 -> .751, B64x8K .770 ->
        # .832 (H200, one run)
        # NOTE: head_dim 256 with the bf16 tail: a 64-token tail tile took the shared memory from 76,800 to
        # 141,824 B (sm_90 build, 5 stages), one program per SM instead of two, and FP8 read 0.42-0.61 of the
        # H200's ceiling against 0.53-0.74 without the tail (bench_kernels --head-dims 256). A 32-token tile
        # keeps 76,800 B (206 registers, no spill); not yet timed (the sweep's decode_tail64_tok_tbn64 rows)
        return {
            "wave_ctas": {128: 2, 64: 4}.get(d, 0),
            "block_n": 128 if d <= 128 else 64,
            "tail_block_n": 32 if d == 256 else 64,
            "num_warps": 4,
            "num_stages": 5,
            "conv": 1,
            "split": 1,
        }
    # NOTE: BF16 at head_dim 128: 5 stages (2 tiles in flight instead of 1) with the bf16 tail, 4 without.
    # H200, fraction of the read ceiling, s=4 -> s=5: with the 64-token tail, GQA 4, B26x32K /
    # B64x8K / B8x32K / B32x8K / B1x128K .944/.894/.842/.856/.678 -> .953/.917/.889/.883/.737;
    # no tail, B64x32K / B128x8K / B8x32K / B32x8K / B1x128K GQA 4
    # .970/.948/.898/.876/.854 -> .954/.944/.874/.879/.708, GQA 8 .965/.933/.882/.864/.854 ->
    # .953/.928/.856/.862/.729. Head_dim 64 (no tail): 128-token tiles,
    # 4 stages, one wave of 3 programs per SM: B64x32K / B64x8K / B8x32K .927/.861/.744 -> .960/.896/.854
    # (with the tail not timed)
    if d == 64:
        return {"block_n": 128, "tail_block_n": 64, "num_warps": 4, "num_stages": 4, "conv": 0, "split": 0,
                "wave_ctas": 3}  # fmt: skip
    return {
        "block_n": 64 if d <= 128 else 32,
        "tail_block_n": 64,
        "num_warps": 4,
        "num_stages": 4,
        "tail_stages": 5 if d == 128 else 4,
        "conv": 0,
        "split": 0,
    }


def base_config(kernel: DecodeKernel, fmt: int, d: int, interp: bool | None = None) -> DecodeConfig:
    """The tuned launch config of ``kernel`` for a pool of format ``fmt`` (``_common.fmt_code``) and head_dim
    ``d``; under the interpreter the non-mma kernels take small tiles (``paged_knobs``)."""
    interp = interpreting() if interp is None else interp
    if kernel in (DecodeKernel.MMA, DecodeKernel.MMA16, DecodeKernel.BALANCED):
        knobs = mma_knobs(d)
    elif kernel in (DecodeKernel.PAGED, DecodeKernel.ROWS) or interp:
        knobs = paged_knobs(fmt, d, interp)
    else:
        knobs = tok_knobs(fmt, d)
    return DecodeConfig(kernel=kernel, **knobs)  # type: ignore[arg-type]
