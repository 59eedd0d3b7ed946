"""Kernel benchmark on one GPU: read ceiling, paged decode (BF16/FP8/NVFP4, +-bf16 tail), extend, cache write.

Usage (on the GPU machine)::

    PYTHONPATH=. python benchmarks/bench_kernels.py --out DIR [--sweep] [--quick] [--head-dims 128,64,256]
    TRITON_INTERPRET=1 python benchmarks/bench_kernels.py --smoke --out DIR   # CPU (interpreter), seconds

``--head-dims`` picks the decode row sets (default 128,64; the smoke run all three): 128 (Llama-3.1-8B's
heads, with the SDPA, cache-write and extend rows), 64, 256 (the hybrid models' full-attention layers:
``bench_kernels_hd256``).

Writes ``DIR/kernels-h200.json`` (rows: kernel, kv_dtype, batch, context, q_heads, kv_heads, head_dim,
page_size, us, bytes, tbps, frac_of_ceiling, ...) and ``DIR/kernels-h200.png``; prints a table last.
``bytes`` counts what a kernel must read: K+V data and scales of every context token, the bf16 tail,
q and the page tables (outputs and partials are written, not counted).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root, for `benchmarks.*`
from benchmarks import timing  # noqa: E402
from benchmarks.bench_extend import extend_rows  # noqa: E402
from benchmarks.timing import (  # noqa: E402
    DEV,
    GiB,
    _empty_cache,
    bench,
    bench_graph,
    gpu_state,
    kernel_breakdown,
    read_ceiling,
)
from nibblekv.formats.kv_view import PagedKV  # noqa: E402
from nibblekv.formats.layer_kv import LayerKV  # noqa: E402
from nibblekv.formats.layout import KVDtype, PageLayout  # noqa: E402
from nibblekv.kernels._common import fmt_code  # noqa: E402
from nibblekv.kernels.decode.config import default_kernel  # noqa: E402
from nibblekv.kernels.decode.knobs import base_config  # noqa: E402
from nibblekv.kernels.decode.launch import decode_triton  # noqa: E402
from nibblekv.kernels.decode.launch_config import DecodeConfig, DecodeKernel  # noqa: E402
from nibblekv.kernels.testing import fill_pool, place_scales  # noqa: E402
from nibblekv.kernels.write import write_kv_triton  # noqa: E402

PAGE = 16
DTYPES = (KVDtype.BF16, KVDtype.FP8, KVDtype.NVFP4)
NAMES = {KVDtype.BF16: "bf16", KVDtype.FP8: "fp8_e4m3", KVDtype.NVFP4: "nvfp4"}
# main's row builder: add(kernel, kv_dtype, batch, context, q_heads, kv_heads, head_dim, us, bytes, **extra)
AddRow = Callable[..., None]


# NOTE: "random" (the default, what a long-running engine's free list gives) or "sequential" (each request's
# pages one after another in the pool): bench_decode_variants' --page-order sets it, to see what placement
# costs. "l2" is a probe, not a placement: every page-table entry points at one of the pool's first
# L2_ALIAS_BYTES of pages (at random, repeating), so a long context is read from L2 and the call is bound by
# the kernel's own instruction stream, not HBM -- what a GPU with more bandwidth per SM (the H200) would meet.
PAGE_ORDER = "random"
PAGE_ORDERS = ("random", "sequential", "l2")
L2_ALIAS_BYTES = 8 << 20  # well inside one half of the H100's / H200's 50 MB L2


# ----------------------------------------------------------------------------- decode


class Pools:
    """One big pool per (dtype, head_dim); shapes take random pages of it."""

    def __init__(
        self, max_tokens: dict[KVDtype, int], kv_heads: int, head_dim: int, scales: str = "page"
    ) -> None:
        """``scales``: where NVFP4's block scales sit (``nibblekv.kernels.testing.place_scales``)."""
        self.kv_heads, self.head_dim = kv_heads, head_dim
        self.pools: dict[KVDtype, LayerKV] = {}
        for dt, toks in max_tokens.items():
            lay = PageLayout(dt, kv_heads, head_dim, PAGE)
            pool = LayerKV.allocate(lay, toks // PAGE, DEV, torch.tensor([0.8, 1.1], device=DEV))
            fill_pool(pool)
            self.pools[dt] = place_scales(pool, scales)
        tlay = PageLayout(KVDtype.BF16, kv_heads, head_dim, PAGE)
        # 4 pages of 16 = the 64-token tail, for batches up to 256
        self.tail = LayerKV.allocate(tlay, 256 * 4 + 8, DEV)
        fill_pool(self.tail)

    def fits(self, dt: KVDtype, tokens: int) -> bool:
        return dt in self.pools and tokens // PAGE + 1 <= self.pools[dt].num_pages


def decode_bytes(pool: LayerKV, batch: int, main: int, tail: int, q_heads: int) -> int:
    per_tok = pool.layout.bytes_per_token()  # K+V, all KV heads, scales included
    tail_tok = 2 * pool.layout.num_kv_heads * pool.layout.head_dim * 2
    pt = batch * (main // PAGE + tail // PAGE + 2) * 4
    return batch * (main * per_tok + tail * tail_tok) + batch * q_heads * pool.layout.head_dim * 2 + pt


def page_table(pool: LayerKV, batch: int, pages: int, gen: torch.Generator) -> torch.Tensor:
    """``[batch, pages]`` int32 page ids of ``pool`` placed by ``PAGE_ORDER`` (CPU tensor)."""
    n = pool.num_pages
    if PAGE_ORDER == "l2":
        hot = max(1, min(n, L2_ALIAS_BYTES // (PAGE * pool.layout.bytes_per_token())))
        order = torch.randint(0, hot, (batch * pages,), generator=gen)
    else:
        order = torch.randperm(n, generator=gen) if PAGE_ORDER == "random" else torch.arange(n)
    return order[: batch * pages].reshape(batch, pages).to(torch.int32)


def decode_call(pools: Pools, dt: KVDtype, batch: int, ctx: int, q_heads: int, with_tail: bool,
                cfg: DecodeConfig | None = None, ctxs: list[int] | None = None):  # type: ignore[no-untyped-def]  # fmt: skip
    """A ready decode call on random pages of the pool (and the main-pool lengths it reads): ``cfg`` the
    launch config (default: the launcher's choice); ``ctxs`` gives per-request contexts (a ragged batch of
    ``len(ctxs)``; ``ctx`` then sizes the page tables)."""
    pool = pools.pools[dt]
    tail = 64 if with_tail else 0
    main = ctx - tail
    pages = triton.cdiv(main, PAGE)
    gen = torch.Generator().manual_seed(batch * 7919 + ctx)
    pt = page_table(pool, batch, pages, gen).to(DEV)
    mains = [c - tail for c in ctxs] if ctxs else [main] * batch
    lens = torch.tensor(mains, dtype=torch.int32, device=DEV)
    q = torch.randn(batch, q_heads, pools.head_dim, device=DEV).to(torch.bfloat16)
    kv = PagedKV(pool, pt, lens)
    if with_tail:
        tpt = torch.randperm(pools.tail.num_pages, generator=gen)[: batch * 4].reshape(batch, 4).to(torch.int32).to(DEV)
        kv = PagedKV(pool, pt, lens, pools.tail, tpt, torch.full((batch,), tail, dtype=torch.int32, device=DEV))
    sm = 1.0 / math.sqrt(pools.head_dim)
    out = torch.empty_like(q)
    return (lambda: decode_triton(q, kv, sm, out=out, config=cfg)), mains


def run_decode(pools: Pools, dt: KVDtype, batch: int, ctx: int, q_heads: int, with_tail: bool,
               cfg: DecodeConfig | None = None, profile: dict[str, float] | None = None,
               ctxs: list[int] | None = None) -> tuple[float, int]:  # fmt: skip
    """Median microseconds and bytes read of one decode call; ``profile`` (CUDA) gets its per-kernel times.
    ``ctxs``: per-request contexts (a ragged batch of ``len(ctxs)``; ``ctx`` then sizes the page tables)."""
    fn, mains = decode_call(pools, dt, batch, ctx, q_heads, with_tail, cfg, ctxs)
    fn()
    us = bench_graph(fn)
    if profile is not None and DEV == "cuda":
        profile.update(kernel_breakdown(fn))
    tail = 64 if with_tail else 0
    return us, sum(decode_bytes(pools.pools[dt], 1, m, tail, q_heads) for m in mains)


def run_sdpa(batch: int, ctx: int, q_heads: int, kv_heads: int, d: int) -> tuple[float, int]:
    k = torch.randn(batch, kv_heads, ctx, d, device=DEV, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q = torch.randn(batch, q_heads, 1, d, device=DEV, dtype=torch.bfloat16)
    fn = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
    fn()
    us = bench(fn)
    return us, 2 * k.numel() * 2 + q.numel() * 2  # NOTE: k, v freed on return (the lambda holds them)


def head_dims(text: str) -> tuple[int, ...]:
    """``--head-dims``: a comma list of 64, 128 and 256."""
    dims = tuple(int(x) for x in text.split(",") if x)
    if not dims or any(d not in (64, 128, 256) for d in dims):
        raise argparse.ArgumentTypeError(f"head dims must be of 64, 128, 256, got {text!r}")
    return dims


# ----------------------------------------------------------------------------- sweep


def sweep_config(dt: KVDtype, head_dim: int, knobs: dict[str, int]) -> DecodeConfig:
    """The default kernel's config for ``dt`` with the sweep's ``knobs`` replaced."""
    fmt = fmt_code(dt)
    return base_config(default_kernel(fmt, head_dim, DEV == "cpu"), fmt, head_dim).replace(**knobs)


def _swept(cfgs: dict[str, dict[str, int]], dt: KVDtype, head_dim: int) -> DecodeConfig | None:
    """The sweep's best config for ``dt`` (None without a sweep: the launcher's choice)."""
    knobs = cfgs.get(NAMES[dt])
    return None if knobs is None else sweep_config(dt, head_dim, knobs)


def sweep(pools: Pools, log: list[dict[str, object]]) -> dict[str, dict[str, int]]:
    """Try launch configs on two decode shapes per dtype; returns the best config per dtype."""
    best: dict[str, dict[str, int]] = {}
    shapes = [(64, 32768), (1, 131072)]
    for dt in DTYPES:
        space: list[dict[str, int]] = []
        stage_opts = {KVDtype.NVFP4: (5, 6, 8), KVDtype.FP8: (5, 7), KVDtype.BF16: (5, 6)}[dt]
        for bn in (64, 128):
            for stages in stage_opts:
                space.append(dict(block_n=bn, num_warps=4, num_stages=stages, conv=int(dt is KVDtype.NVFP4)))
        scores = []
        for cfg in space:
            tot = 0.0
            try:
                for b, c in shapes:
                    if not pools.fits(dt, b * c):
                        continue
                    us, nbytes = run_decode(pools, dt, b, c, 32, False, sweep_config(dt, pools.head_dim, cfg))
                    tot += math.log(us)
                    log.append(dict(kernel="decode_sweep", kv_dtype=NAMES[dt], batch=b, context=c, us=us, bytes=nbytes, **cfg))
            except Exception as e:  # noqa: BLE001 - a config that fails to compile is skipped
                print("sweep config failed", NAMES[dt], cfg, repr(e)[:200], flush=True)
                continue
            scores.append((tot, cfg))
        scores.sort(key=lambda t: t[0])
        best[NAMES[dt]] = scores[0][1]
        print("best", NAMES[dt], scores[0][1], [round(math.exp(s / 2)) for s, _ in scores[:5]], flush=True)
    return best


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--out", default="benchmarks/results", help="folder for kernels-h200.{json,png}")
    ap.add_argument("--sweep", action="store_true", help="first try decode launch configs, then use the best")
    ap.add_argument("--quick", action="store_true", help="fewer batches and contexts")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny shapes on CPU (TRITON_INTERPRET=1): checks the code path, not the numbers")
    ap.add_argument("--flush", choices=timing.FLUSH_MODES, default=timing.FLUSH,
                    help="how L2 is emptied before each call (timing.FLUSH)")
    ap.add_argument("--head-dims", type=head_dims, default=None,
                    help="decode row sets, e.g. 256 or 128,64,256 (default 128,64; with --smoke 128,64,256)")
    args = ap.parse_args(argv)
    dims = args.head_dims or ((128, 64, 256) if args.smoke else (128, 64))
    timing.set_flush(args.flush)
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    rows: list[dict[str, object]] = []
    ceil = read_ceiling(1 << 20 if args.smoke else 4 * GiB)
    print("ceiling probes", ceil, flush=True)

    batches = (1, 8, 32, 64, 128)
    ctxs = (1024, 8192, 32768, 131072)
    if args.quick:
        batches, ctxs = (1, 64), (8192, 32768, 131072)
        max_tok_quick = {KVDtype.NVFP4: 64 * 131072 + 4096, KVDtype.FP8: 64 * 131072 + 4096, KVDtype.BF16: 64 * 32768 + 4096}
    # pools: nvfp4 1.15 KB/token (D=128, 8 KV heads), fp8 2 KB, bf16 4 KB
    max_tok = {KVDtype.NVFP4: 128 * 131072 + 4096, KVDtype.FP8: 64 * 131072 + 4096, KVDtype.BF16: 32 * 131072 + 4096}
    big = (8, 32768, 64, 8192, 64, 32768, 4096)
    if args.quick:
        max_tok = max_tok_quick
    if args.smoke:
        batches, ctxs = (1,), (80,)
        max_tok = {dt: 512 for dt in DTYPES}
        big = (1, 64, 2, 64, 2, 96, 256)
    # Llama-3.1-8B's heads (8 KV heads, GQA 4 and 8); the smoke run: one KV head (the interpreter is slow)
    hkv = 1 if args.smoke else 8
    sweep_log: list[dict[str, object]] = []
    cfgs: dict[str, dict[str, int]] = {}

    def add(kernel: str, dt: str, b: int, c: int, hq: int, hkv: int, d: int, us: float, nbytes: int, **extra: object) -> None:
        rows.append(dict(kernel=kernel, kv_dtype=dt, batch=b, context=c, q_heads=hq, kv_heads=hkv, head_dim=d,
                         page_size=PAGE, us=round(us, 2), bytes=nbytes, tbps=round(nbytes / us / 1e6, 4),
                         **(gpu_state() if kernel.startswith("decode") else {}), **extra))  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)  # NOTE: a run cut by its timeout keeps its rows in the log

    if 256 in dims:
        from benchmarks.bench_kernels_hd256 import hd256_rows  # NOTE: it imports this module's Pools

        for alternatives in (False,) if args.smoke else (False, True):  # the default kernels' rows first
            hd256_rows(add, args.smoke, alternatives)
            print(f"head_dim 256{' alternatives' if alternatives else ''} done {time.time() - t0:.0f}s", flush=True)
            write_results(rows, ceil, cfgs, sweep_log, args.out)  # NOTE: kept if the timeout cuts what follows
    if 128 in dims:
        pools = Pools(max_tok, hkv, 128)
        print(f"pools ready {time.time() - t0:.0f}s", flush=True)
        if args.sweep:
            cfgs = sweep(pools, sweep_log)
            print(f"sweep done {time.time() - t0:.0f}s", flush=True)
        decode_128_rows(add, pools, hkv, batches, ctxs, cfgs, args.smoke)
        print(f"decode done {time.time() - t0:.0f}s", flush=True)
        write_results(rows, ceil, cfgs, sweep_log, args.out)
        del pools
        _empty_cache()
    if 64 in dims:
        decode_64_rows(add, hkv, big, cfgs, args.smoke)
    if 128 in dims:
        other_rows(add, hkv, args.smoke)
    print(f"all done {time.time() - t0:.0f}s", flush=True)

    doc = write_results(rows, ceil, cfgs, sweep_log, args.out)
    plot(doc, os.path.join(args.out, "kernels-h200.png"))
    print_table(doc)
    return 0


def decode_128_rows(add: AddRow, pools: Pools, hkv: int, batches: tuple[int, ...], ctxs: tuple[int, ...],
                    cfgs: dict[str, dict[str, int]], smoke: bool) -> None:  # fmt: skip
    """Decode rows at head_dim 128 (GQA 4 with and without the bf16 tail, GQA 8 without) through ``add``."""
    for hq in (4 * hkv,) if smoke else (4 * hkv, 8 * hkv):
        for b in batches:
            for c in ctxs:
                for dt in DTYPES:
                    if not pools.fits(dt, b * c):
                        continue
                    for tail in (False, True):
                        if hq == 8 * hkv and tail:
                            continue
                        try:
                            us, nb = run_decode(pools, dt, b, c, hq, tail, _swept(cfgs, dt, 128))
                        except torch.OutOfMemoryError:
                            continue
                        add("decode_tail64" if tail else "decode", NAMES[dt], b, c, hq, hkv, 128, us, nb)


def decode_64_rows(add: AddRow, hkv: int, big: tuple[int, ...], cfgs: dict[str, dict[str, int]], smoke: bool) -> None:
    """Decode rows at head_dim 64 (GQA 4, no tail; NVFP4 decode_mma beside the default) through ``add``."""
    pools64 = Pools({dt: big[4] * big[5] + big[6] for dt in DTYPES}, hkv, 64)
    for b, c in ((big[0], big[1]),) if smoke else ((big[0], big[1]), (big[2], big[3]), (big[4], big[5])):
        for dt in DTYPES:
            us, nb = run_decode(pools64, dt, b, c, 4 * hkv, False, _swept(cfgs, dt, 64))
            add("decode", NAMES[dt], b, c, 4 * hkv, hkv, 64, us, nb)
        if not smoke:  # decode_mma reading head_dim 64 two tokens a row (opt-in until measured here)
            mma = base_config(DecodeKernel.MMA, fmt_code(KVDtype.NVFP4), 64)
            us, nb = run_decode(pools64, KVDtype.NVFP4, b, c, 4 * hkv, False, mma)
            add("decode_mma", "nvfp4", b, c, 4 * hkv, hkv, 64, us, nb)
    del pools64
    _empty_cache()


def other_rows(add: AddRow, hkv: int, smoke: bool) -> None:
    """SDPA on contiguous bf16, the cache write and extend rows (head_dim 128) through ``add``."""
    for b, c in ((2, 64),) if smoke else ((64, 32768), (32, 8192), (8, 32768), (1, 131072)):
        us, nb = run_sdpa(b, c, 4 * hkv, hkv, 128)
        add("sdpa_bf16_contiguous", "bf16", b, c, 4 * hkv, hkv, 128, us, nb)
    # cache write: T new tokens, hkv KV heads x 128
    for dt in DTYPES:
        pool = LayerKV.allocate(PageLayout(dt, hkv, 128, PAGE), 8192 // PAGE + 8, DEV)
        for t in (16,) if smoke else (64, 8192):
            k = torch.randn(t, hkv, 128, device=DEV).to(torch.bfloat16)
            v = torch.randn_like(k)
            slots = torch.randperm(pool.num_pages * PAGE, device=DEV)[:t]
            us = bench_graph(lambda: write_kv_triton(k, v, pool, slots))  # noqa: B023 - timed right here
            add("write_kv", NAMES[dt], t, 0, 0, hkv, 128, us, 2 * k.numel() * 2 + t * hkv)
    # kernel time, as for decode: extend_triton, and extend_decode (NVFP4 / FP8, short chunks) where it applies
    # (NVFP4 also with 8-column decode_mma groups where its plan differs: decode_mma16's comparison)
    # (the smoke run leaves extend_decode to bench_extend's: decode_mma takes ~15 s a call in the interpreter)
    dec = [] if smoke else [(0, 0, 0, 0, 0, 0, 0, x) for x in (1, 3)]
    for r in extend_rows(bench_graph, DEV, smoke, configs=((0, 0), *dec)):
        add(**r)


def write_results(
    rows: list[dict[str, object]], ceil: dict[str, float], cfgs: dict[str, dict[str, object]],
    sweep_log: list[dict[str, object]], out: str,
) -> dict[str, object]:
    """Fractions of the ceiling and NVFP4 time ratios on ``rows``; writes ``kernels-h200.json`` under ``out``.

    NOTE: called after the decode rows too, so a call that times out later keeps them.
    """
    ceiling = max(ceil["torch_sum_tbps"], ceil["triton_stream_tbps"],
                  max(float(r["tbps"]) for r in rows if r["kernel"].startswith("decode") and r["kv_dtype"] == "bf16"))  # type: ignore[union-attr]  # fmt: skip
    for r in rows:
        r["frac_of_ceiling"] = round(float(r["tbps"]) / ceiling, 4)  # type: ignore[arg-type]
    key = {(r["kernel"], r["kv_dtype"], r["batch"], r["context"], r["q_heads"], r["head_dim"]): r for r in rows}
    for r in rows:
        if r["kv_dtype"] == "nvfp4" and str(r["kernel"]).startswith("decode"):
            for other, name in (("fp8_e4m3", "ratio_vs_fp8"), ("bf16", "ratio_vs_bf16")):
                o = key.get((r["kernel"], other, r["batch"], r["context"], r["q_heads"], r["head_dim"]))
                if o:
                    r[name] = round(float(r["us"]) / float(o["us"]), 3)  # type: ignore[arg-type]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        commit = os.environ.get("COMMIT") or (commit if len(commit) == 40 else "unknown")
    except OSError:
        commit = "unknown"
    doc = dict(ceiling_tbps=round(ceiling, 4), ceiling_probes=ceil, commit=commit or os.environ.get("COMMIT", "unknown"),
               gpu=torch.cuda.get_device_name() if DEV == "cuda" else "cpu", torch=torch.__version__, triton=triton.__version__,
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               timing=f"decode, extend and write_kv: CUDA-graph replay, L2 emptied per call by a {timing.FLUSH} of"
                      f" 256 MB, {timing.SETTLE_S} s of untimed replays first (bench_graph); sdpa: triton do_bench",
               configs=cfgs, rows=rows, sweep=sweep_log)  # fmt: skip
    with open(os.path.join(out, "kernels-h200.json"), "w") as f:
        json.dump(doc, f, indent=1)
    return doc




def _plot_extend(ax, rows: list[dict[str, object]]) -> None:  # type: ignore[no-untyped-def]
    """Extend over >= 8K-token prefixes by chunk length: extend_triton dashed, extend_decode solid."""
    for dt, color in (("bf16", "tab:blue"), ("fp8_e4m3", "tab:orange"), ("nvfp4", "tab:green")):
        for kernel, ls in (("extend", "--"), ("extend_decode", "-")):
            pts = sorted(
                (int(r["chunk"]), float(r["frac_of_ceiling"]))  # type: ignore[arg-type]
                for r in rows
                if r["kernel"] == kernel and r["kv_dtype"] == dt
                and int(r["context"]) >= 8192 and int(r["chunk"]) <= 16  # type: ignore[call-overload]
            )
            if pts:
                xs, ys = [p[0] for p in pts], [p[1] for p in pts]
                ax.plot(xs, ys, ls, marker="o", color=color, label=f"{dt} {kernel}")
    ax.axhline(0.60, color="gray", lw=0.8, ls=":")
    _style_axes(ax, "chunk (query tokens per request), prefix >= 8K")


def _style_axes(ax, xlabel: str) -> None:  # type: ignore[no-untyped-def]
    ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of read ceiling")
    ax.set_ylim(0, 1.1)
    if ax.get_legend_handles_labels()[0]:  # a panel with no rows (e.g. a smoke run's) draws no legend
        ax.legend(fontsize=7)


def plot(doc: dict[str, object], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rows = [r for r in doc["rows"] if r["kernel"] == "decode" and r["q_heads"] == 4 * r["kv_heads"]  # type: ignore[index]
            and r["head_dim"] == 128]  # type: ignore[union-attr]
    fig, axes = plt.subplots(1, 3, figsize=(19, 5))
    _plot_extend(axes[2], doc["rows"])  # type: ignore[arg-type]
    for ax, ctx_set in zip(axes, ((1024, 8192), (32768, 131072))):
        for dt, color in (("bf16", "tab:blue"), ("fp8_e4m3", "tab:orange"), ("nvfp4", "tab:green")):
            for c, ls in zip(ctx_set, ("-", "--")):
                pts = sorted((r["batch"], r["frac_of_ceiling"]) for r in rows if r["kv_dtype"] == dt and r["context"] == c)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], ls, marker="o", color=color, label=f"{dt} ctx={c}")
        ax.axhline(0.65, color="tab:green", lw=0.8, ls=":")
        ax.axhline(0.85, color="tab:blue", lw=0.8, ls=":")
        _style_axes(ax, "batch")
    fig.suptitle(f"paged decode (left, middle) and extend (right), Hq=32 Hkv=8 D=128, page 16 "
                 f"(ceiling {doc['ceiling_tbps']} TB/s, {doc['gpu']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def print_table(doc: dict[str, object]) -> None:
    print(f"\nceiling {doc['ceiling_tbps']} TB/s  probes {doc['ceiling_probes']}  configs {doc['configs']}")
    print(f"{'kernel':22s} {'dtype':9s} {'B':>4s} {'ctx':>7s} {'Hq':>3s} {'D':>4s} {'us':>9s} {'TB/s':>6s} {'frac':>5s} {'/fp8':>5s} {'/bf16':>5s}")
    for r in doc["rows"]:  # type: ignore[union-attr]
        print(f"{r['kernel']:22s} {r['kv_dtype']:9s} {r['batch']:4d} {r['context']:7d} {r['q_heads']:3d} {r['head_dim']:4d} "
              f"{r['us']:9.1f} {r['tbps']:6.2f} {r['frac_of_ceiling']:5.2f} {r.get('ratio_vs_fp8', ''):>5} {r.get('ratio_vs_bf16', ''):>5}")  # fmt: skip
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
