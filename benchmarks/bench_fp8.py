"""FP8 linear layers vs bf16 ``torch.mm`` at Llama-3.1-8B's shapes (issue 48's GEMM rows).

Usage (on the GPU machine)::

    PYTHONPATH=. python benchmarks/bench_fp8.py --out DIR
    TRITON_INTERPRET=1 python benchmarks/bench_fp8.py --smoke --out DIR   # CPU: tiny shapes, seconds

For every projection (qkv, o, gate_up, down) and token count M (decode batches 1-512, the 8K prefill
chunk) and both checkpoint formats, times the whole FP8 layer (activation quantization + GEMM: ``fp8_us``),
the GEMM alone (``fp8_gemm_us``) and bf16 ``x @ W^T`` (``bf16_us``), each a CUDA-graph replay with L2 emptied
before every call. ``channel``: per-channel weight scales, per-token activations; the layer runs the Triton
GEMM up to ``rowwise_triton_max_m(N)`` tokens and ``torch._scaled_mm`` above, and every row times both
alone (``triton_us``, ``scaled_mm_us``: where they cross sets that constant). ``block``: 128x128 weight
blocks, per token-group activations; the layer runs the Triton block GEMM up to ``BLOCK_TRITON_MAX_M`` tokens
and cuBLASLt's block-scaled kernel above (``torch._scaled_mm`` with 1x128 / 128x128 scales, sm_90), both
timed alone as well from 64 tokens (below ``MIN_ROWS`` = 256 rows zero-padded to it; ``scaled_mm_error``
says why cuBLASLt's could not run). Rows up to 256 tokens time their format's Triton GEMM with other decode
tiles too (``decode_tiles_us``; block rows also the default tile with its scales loaded in each k-step,
``default_in_step``; up to 32 tokens the default tile not swapped, ``default_unswapped``), block rows from
512 tokens the block GEMM with other prefill tiles (``block_tiles_us``). Rows with M <= 16 also get
``read_frac``: the FP8 weight bytes over ``fp8_us`` as a fraction of the read ceiling measured in the same
run. Every row's FP8 output is checked against the pure-torch reference first. Writes
``DIR/fp8-weights-<gpu>.json`` (rows ``kind: gemm``; ``<gpu>`` = ``timing.gpu_tag()``: h200, h100, ...) and a
PNG. ``--tma`` instead times the GEMM alone per row -- the grid GEMM's tile for the batch, cuBLASLt, bf16 mm
and each launch of the persistent TMA GEMM (``kernels.fp8.gemm_tma``) -- into ``DIR/fp8-tma-<gpu>.json``
(rows ``kind: tma``).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root, for `benchmarks.*`
from benchmarks import timing  # noqa: E402
from benchmarks.fp8_tma import tma_row  # noqa: E402
from benchmarks.timing import DEV, bench_graph, gpu_state, read_ceiling  # noqa: E402
from nibblekv.formats.fp8_weights import quantize_weight_block, quantize_weight_channel  # noqa: E402
from nibblekv.kernels.fp8.gemm import (  # noqa: E402
    BLOCK_TRITON_MAX_M,
    ROWWISE_K_STEP,
    fp8_block_gemm,
    fp8_linear_block,
    fp8_linear_rowwise,
    fp8_rowwise_gemm,
    rowwise_triton_max_m,
)
from nibblekv.kernels.fp8.quant import quant_fp8_groups  # noqa: E402
from nibblekv.kernels.fp8.reference import fp8_gemm_ref, fp8_linear_ref  # noqa: E402
from nibblekv.kernels.fp8.scaled_mm import (  # noqa: E402
    block_scaled_mm_unavailable,
    fp8_block_scaled_mm,
)
from nibblekv.kernels.fp8.tiles import GemmTile, gemm_tile  # noqa: E402

BLOCK = 128
# Llama-3.1-8B: (projection, N, K)
SHAPES_8B: tuple[tuple[str, int, int], ...] = (
    ("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336),
)  # fmt: skip
MS_8B: tuple[int, ...] = (1, 16, 64, 128, 256, 512, 8192)
SHAPES_SMOKE: tuple[tuple[str, int, int], ...] = (("qkv", 384, 256), ("down", 256, 200))
MS_SMOKE: tuple[int, ...] = (1, 5)
FORMATS = ("channel", "block")
# the block GEMM's prefill tiles timed beside gemm_tile's (64x128, 4 warps, 3 stages) at M >= 512:
# (BLOCK_M, BLOCK_N, warps, stages); 64x128 / 4 warps is the usual Triton block-FP8 default elsewhere. None
# spills on sm_90 (ptxas; 200-254 registers); left out: 128x128 / 4 warps, 128x256, 256x128 (200-1,000 bytes)
_TILES = (
    (128, 128, 8, 3), (64, 128, 4, 4), (64, 256, 8, 3), (128, 64, 4, 4), (128, 128, 8, 4),
)
PREFILL_TILES: dict[str, GemmTile] = {f"{t[0]}x{t[1]}w{t[2]}s{t[3]}": GemmTile(*t) for t in _TILES}
# the Triton GEMM's decode tiles timed beside gemm_tile's at M <= 256 (its choice depends on the format):
# (BLOCK_M, BLOCK_N, warps, stages, split-K); the batch's own BLOCK_M, narrower / wider weight tiles, deeper
# pipelines and more k-splits (more programs a weight column, each with fewer bytes in flight)
_DECODE_TILES = (
    (64, 4, 4, 1), (64, 4, 6, 1), (64, 4, 4, 2), (64, 4, 4, 4), (64, 4, 4, 8), (32, 4, 4, 4), (32, 4, 6, 8),
    (128, 4, 4, 2), (128, 8, 4, 4),
)


# 64-256 tokens also: deeper pipelines without k-splits (more weight bytes in flight a program, no sum kernel)
# and, from 128 tokens, 128-row tiles (each weight tile read by one program, not one per 64 rows)
_DEEP_TILES = ((64, 64, 4, 8, 1), (64, 64, 4, 10, 1), (64, 32, 4, 8, 1), (64, 32, 2, 8, 1))
_WIDE_M_TILES = ((128, 64, 8, 6, 1), (128, 64, 4, 6, 1), (128, 32, 4, 8, 1), (128, 64, 8, 4, 2))
# up to 32 tokens also with the MMA swapped (GemmTile.swap_ab: the weight tile is wgmma's 64-row M side): the
# defaults' shapes, deeper pipelines and more k-splits (40-56 registers: more programs fit an SM)
_SWAP_TILES = ((64, 4, 4, 1), (64, 4, 4, 2), (64, 4, 4, 4), (64, 4, 6, 4), (128, 8, 4, 4))


def decode_tiles(m: int) -> dict[str, GemmTile]:
    """:data:`_DECODE_TILES` with ``m``'s BLOCK_M (16 up to 16 tokens, 32 up to 32, else 64); from 33 tokens
    :data:`_DEEP_TILES` and from 128 :data:`_WIDE_M_TILES`; up to 32 tokens also :data:`_SWAP_TILES` (names
    ending in ``x``)."""
    bm = 16 if m <= 16 else 32 if m <= 32 else 64
    tiles = {f"{bm}x{bn}w{w}s{st}k{sp}": GemmTile(bm, bn, w, st, sp) for bn, w, st, sp in _DECODE_TILES}
    extra = (_DEEP_TILES if m > 32 else ()) + (_WIDE_M_TILES if m >= 128 else ())
    tiles |= {f"{tm}x{bn}w{w}s{st}k{sp}": GemmTile(tm, bn, w, st, sp) for tm, bn, w, st, sp in extra}
    if m <= 32:
        for bn, w, st, sp in _SWAP_TILES:
            tiles[f"{bm}x{bn}w{w}s{st}k{sp}x"] = GemmTile(bm, bn, w, st, sp, swap_ab=True)
    return tiles


def _row(name: str, n: int, k: int, m: int, fmt: str, w: torch.Tensor, ceiling: float) -> dict[str, Any]:
    """One timed row (FP8 layer, FP8 GEMM alone, bf16 mm), after checking the FP8 output."""
    x = torch.randn(m, k, device=DEV).to(torch.bfloat16)
    wb = w.to(torch.bfloat16)
    alternatives: dict[str, Any] = {}  # channel rows: both GEMMs the layer chooses between, timed apart
    if fmt == "channel":
        wq, ws = quantize_weight_channel(w)
        xq, xs = quant_fp8_groups(x, None)

        def layer() -> torch.Tensor:
            return fp8_linear_rowwise(x, wq, ws.view(1, -1), None)

        def triton_gemm() -> torch.Tensor:
            return fp8_rowwise_gemm(xq, xs, wq, ws, torch.bfloat16)

        alternatives["triton_us"] = triton_gemm
        if x.is_cuda:
            alternatives["scaled_mm_us"] = lambda: torch._scaled_mm(
                xq, wq.t(), scale_a=xs, scale_b=ws.view(1, -1), out_dtype=torch.bfloat16
            )
        gemm = alternatives.get("scaled_mm_us", triton_gemm) if m > rowwise_triton_max_m(n) else triton_gemm
        block = None
    else:
        wq, ws = quantize_weight_block(w, BLOCK)
        xq, xs = quant_fp8_groups(x, BLOCK)

        def layer() -> torch.Tensor:
            return fp8_linear_block(x, wq, ws, BLOCK, None)

        def triton_block() -> torch.Tensor:
            return fp8_block_gemm(xq, xs, wq, ws, BLOCK, torch.bfloat16)

        alternatives["triton_us"] = triton_block
        why = block_scaled_mm_unavailable(x.device) if x.is_cuda else "CPU"
        cublas = not why
        if cublas and m >= 64:  # NOTE: fewer than MIN_ROWS rows run zero-padded to it (fp8_block_scaled_mm)
            cublas_mm = functools.partial(fp8_block_scaled_mm, xq, xs, wq, ws, torch.bfloat16)
            alternatives["scaled_mm_us"] = cublas_mm
        elif why and x.is_cuda:
            alternatives["scaled_mm_error"] = f"no block-scaled torch._scaled_mm here: {why}"
        gemm = alternatives["scaled_mm_us"] if cublas and m > BLOCK_TRITON_MAX_M else triton_block
        block = BLOCK
    if m <= 512:  # the reference dequantizes W in fp32: checked where that stays small
        got, want = layer().float(), fp8_linear_ref(x, wq, ws, block, None).float()
        err = ((got - want).norm() / want.norm()).item()
        if not err < 1e-2:
            raise AssertionError(f"{name} m={m} {fmt}: FP8 layer is {err:.3g} (rel. L2) off the reference")
    row: dict[str, Any] = dict(kind="gemm", name=name, m=m, n=n, k=k, format=fmt)
    row["fp8_us"] = round(bench_graph(layer), 2)
    row["fp8_gemm_us"] = round(bench_graph(gemm), 2)
    for key, fn in alternatives.items():
        if isinstance(fn, str):  # an alternative that cannot run here: why
            row[key] = fn
        else:
            if m <= 512 and key == "scaled_mm_us":  # the layer may not route here at this M: check it too
                want = fp8_gemm_ref(xq, xs, wq, ws, block, torch.float32)
                err = ((fn().float() - want).norm() / want.norm()).item()
                if not err < 1e-2:  # NOTE: kept in the row, not raised: the layer's own check guards it
                    row["scaled_mm_error"] = f"{err:.3g} (rel. L2) off the reference at m={m}"
                    continue
            row[key] = round(bench_graph(fn), 2)
    if fmt == "block" and m >= 512 and x.is_cuda:  # prefill tiles of the Triton block GEMM, side by side
        row["block_tiles_us"] = _tile_times(xq, xs, wq, ws, PREFILL_TILES, check=m == 512, block=BLOCK)
    if m <= 256:  # decode tiles of the Triton GEMM of this format (CPU: --smoke checks them)
        tiles = decode_tiles(m)
        default = gemm_tile(m, n, triton.cdiv(k, block or ROWWISE_K_STEP), block=block is not None)
        if block is not None:  # the default tile with each k-step's scales loaded in the step, not before
            tiles["default_in_step"] = dataclasses.replace(default, scale_ahead=False)
        if m <= 32:  # and not swapped (tokens as the M side: fp16 mma.sync on converted operands)
            tiles["default_unswapped"] = dataclasses.replace(default, swap_ab=False)
        row["decode_tiles_us"] = _tile_times(xq, xs, wq, ws, tiles, check=True, block=block)
    row["bf16_us"] = round(bench_graph(lambda: torch.mm(x, wb.t())), 2)
    row["speedup"] = round(row["bf16_us"] / max(row["fp8_us"], 1e-3), 3)
    # NOTE: the engine quantizes most layers' activations in the kernel before (the norms, SiLU * mul): the
    # GEMM alone is what those layers add to a step
    row["gemm_speedup"] = round(row["bf16_us"] / max(row["fp8_gemm_us"], 1e-3), 3)
    if m <= 16:
        nbytes = wq.numel() + ws.numel() * 4 + x.numel() * 2
        row["read_frac"] = round(nbytes / row["fp8_us"] / 1e6 / ceiling, 4)
    row.update(gpu_state())
    return row


def _tile_times(
    xq: torch.Tensor, xs: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor, tiles: dict[str, GemmTile],
    check: bool, block: int | None,
) -> dict[str, float]:
    """us of the Triton GEMM (``block``: the block-scaled one; None: the row-wise one) with each of
    ``tiles`` (checked against the twin first when ``check``); a tile that fails to compile (shared memory,
    registers) is left out."""
    out: dict[str, float] = {}
    want = fp8_gemm_ref(xq, xs, wq, ws, block, torch.float32) if check else None
    for name, tile in tiles.items():
        if block is None:
            fn = lambda t=tile: fp8_rowwise_gemm(xq, xs, wq, ws, torch.bfloat16, tile=t)  # noqa: E731
        else:
            fn = lambda t=tile: fp8_block_gemm(xq, xs, wq, ws, block, torch.bfloat16, tile=t)  # noqa: E731
        try:
            got = fn()
        except Exception as e:  # noqa: BLE001 - triton's OutOfResources and compile errors alike
            print(f"tile {name}: {type(e).__name__}: {str(e)[:120]}", flush=True)
            continue
        if want is not None:
            err = ((got.float() - want).norm() / want.norm()).item()
            if not err < 1e-2:
                raise AssertionError(f"GEMM tile {name}: {err:.3g} (rel. L2) off the reference")
        out[name] = round(bench_graph(fn), 2)
    return out


def acceptance(rows: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per format, issue 48's GEMM criteria: the lowest speedup at decode batches >= 64 (>= 1.6 asked; the
    layer, and the GEMM alone) and at the 8K prefill chunk (>= 1.5), the lowest read fraction at batches <= 16
    (>= 0.8)."""
    res: dict[str, dict[str, float | None]] = {}
    for fmt in FORMATS:
        mine = [r for r in rows if r["format"] == fmt]
        decode = [r["speedup"] for r in mine if 64 <= r["m"] <= 256]
        decode_gemm = [r["gemm_speedup"] for r in mine if 64 <= r["m"] <= 256]
        prefill = [r["speedup"] for r in mine if r["m"] >= 8192]
        reads = [r["read_frac"] for r in mine if "read_frac" in r]
        res[fmt] = {
            "min_speedup_decode_ge64": min(decode, default=None),
            "min_gemm_speedup_decode_ge64": min(decode_gemm, default=None),
            "min_speedup_prefill_8k": min(prefill, default=None),
            "min_read_frac_le16": min(reads, default=None),
        }
    return res


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        out = ""
    return os.environ.get("COMMIT") or (out if len(out) == 40 else "unknown")


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Speedup over bf16 vs tokens, one panel per projection, a line per format."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["name"] for r in rows))
    fig, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3.4), squeeze=False)
    for ax, name in zip(axes[0], names):
        for fmt, style in zip(FORMATS, ("o-", "s--")):
            pts = sorted((r["m"], r["speedup"]) for r in rows if r["name"] == name and r["format"] == fmt)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=fmt)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.axhline(1.6, color="tab:red", lw=0.8, ls=":")
        ax.set_xscale("log", base=2)
        n, k = next((r["n"], r["k"]) for r in rows if r["name"] == name)
        ax.set_title(f"{name} (N={n}, K={k})")
        ax.set_xlabel("tokens (M)")
    axes[0][0].set_ylabel("FP8 layer speedup vs bf16 mm")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"), help="output folder")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU (interpreter / reference)")
    ap.add_argument("--name", default=None, help="output file stem (default fp8-weights-<gpu tag>)")
    ap.add_argument("--ms", type=int, nargs="+", default=None, help="token counts (default: 1 ... 8192)")
    ap.add_argument("--shapes", nargs="+", default=None, choices=[s[0] for s in SHAPES_8B])
    ap.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS)
    ap.add_argument("--tma", action="store_true", help="the persistent TMA GEMM's tiles beside the default "
                    "GEMM, cuBLASLt and bf16 (rows kind tma; --ms default 64 128 256)")  # fmt: skip
    args = ap.parse_args(argv)
    if DEV != "cuda" and not args.smoke:
        ap.error("no CUDA device: run with --smoke (CPU, Triton interpreter)")
    shapes = tuple(s for s in SHAPES_8B if not args.shapes or s[0] in args.shapes)
    shapes = SHAPES_SMOKE if args.smoke else shapes
    ms = tuple(args.ms) if args.ms else (MS_SMOKE if args.smoke else (64, 128, 256) if args.tma else MS_8B)
    ceil = read_ceiling(1 << 20) if args.smoke else read_ceiling()
    ceiling = max(ceil.values())
    torch.manual_seed(0)
    rows = []
    for name, n, k in shapes:
        w = torch.randn(n, k, device=DEV) * 0.02
        for m in ms:
            for fmt in args.formats:
                row = tma_row(name, n, k, m, fmt, w) if args.tma else _row(name, n, k, m, fmt, w, ceiling)
                rows.append(row)
                print(json.dumps(rows[-1]), flush=True)
        del w
    doc = dict(
        commit=_commit(), gpu=torch.cuda.get_device_name() if DEV == "cuda" else "cpu",
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        torch=torch.__version__, triton=triton.__version__, ceiling_tbps=round(ceiling, 4),
        ceiling_probes=ceil,
        timing=f"CUDA-graph replay, L2 emptied per call by a {timing.FLUSH} of 256 MB (timing.bench_graph)",
        rows=rows,
    )  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = args.name or f"fp8-{'tma' if args.tma else 'weights'}-{timing.gpu_tag()}"
    if args.tma:
        (out / f"{name}.json").write_text(json.dumps(doc, indent=1))
        print(f"{'name':8} {'m':>5} {'format':8} {'triton':>8} {'cublas':>8} {'bf16':>8} {'tma':>8}  best")
        for r in rows:
            print(f"{r['name']:8} {r['m']:5d} {r['format']:8} {r['triton_us']:8.2f} "
                  f"{r.get('scaled_mm_us', float('nan')):8.2f} {r['bf16_us']:8.2f} "
                  f"{r.get('tma_best_us', float('nan')):8.2f}  {r.get('tma_best')}")  # fmt: skip
        return 0
    doc["acceptance"] = acceptance(rows)
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1))
    plot(rows, out / f"{name}.png")
    head = ("name", "m", "format", "fp8_us", "gemm_us", "triton_us", "cublas_us", "bf16_us", "speedup")
    print(f"{head[0]:8} {head[1]:>5} {head[2]:8} " + " ".join(f"{h:>9}" for h in head[3:]) + " read_frac")
    for r in rows:
        alt = " ".join(f"{r.get(c, float('nan')):9.2f}" for c in ("triton_us", "scaled_mm_us"))
        print(f"{r['name']:8} {r['m']:5d} {r['format']:8} {r['fp8_us']:9.2f} {r['fp8_gemm_us']:9.2f} {alt} "
              f"{r['bf16_us']:9.2f} {r['speedup']:7.3f} {r.get('read_frac', '')}")  # fmt: skip
    print(json.dumps(doc["acceptance"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
