"""Extend-kernel rows for bench_kernels.py: a chunk of new tokens per request over a cached prefix.

Standalone, it sweeps launch configs (prefix splits x pipeline stages) against the run's read ceiling:

    PYTHONPATH=. python benchmarks/bench_extend.py --configs 1:0 4:0 4:3 8:2 --out DIR   # on the GPU
    TRITON_INTERPRET=1 python benchmarks/bench_extend.py --smoke --out DIR              # CPU (interpreter)

``SPLITS:STAGES[:WARPS[:BM[:BN[:OWN[:REGS[:MMA]]]]]]`` (0 = the default; OWN = the own-chunk loop's
stages; DEC=1: ``extend_decode`` -- the NVFP4 prefix through decode_mma, FP8's through decode_tok --
where it applies, kernel ``extend_decode``, WARPS / BN its own-chunk launch's; DEC=2: NVFP4 chunks of
more than 8 columns through decode_tok, kernel ``extend_decode_tok``; DEC=3: through 8-column decode_mma
groups (no decode_mma16), kernel
``extend_decode_mma8``); writes
``DIR/extend-sweep.json``. At BM = BN = 64,
head_dim 128, the default 5 stages take 180 KB of shared memory (one program per SM) and ~254 registers
(sm_90 compile): fewer stages / more warps are what splitting needs to pay off.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root, for `benchmarks.*`
from benchmarks import timing  # noqa: E402
from benchmarks.timing import DEV, GiB, bench_graph, kernel_breakdown, read_ceiling  # noqa: E402
from nibblekv.formats.kv_view import PagedKV  # noqa: E402
from nibblekv.formats.layer_kv import LayerKV  # noqa: E402
from nibblekv.formats.layout import KVDtype, PageLayout  # noqa: E402
from nibblekv.kernels.extend.paged import extend_triton  # noqa: E402
from nibblekv.kernels.extend.via_decode import (  # noqa: E402
    extend_decode,
    extend_decode_plan,
    extend_decode_unsupported,
)
from nibblekv.kernels.testing import decode_config_from_spec, fill_pool  # noqa: E402

PAGE = 16
NAMES = {KVDtype.BF16: "bf16", KVDtype.FP8: "fp8_e4m3", KVDtype.NVFP4: "nvfp4"}
# (batch, prefix, chunk): decode-like small chunks (speculative / short turns) up to prefill chunks
SHAPES = (
    (32, 8192, 16), (64, 8192, 8), (64, 8192, 4), (64, 8192, 2), (32, 32768, 1), (8, 8192, 128),
    (4, 32768, 64), (1, 32768, 512),
    (8, 2048, 512),
)  # fmt: skip
SMOKE_SHAPES = ((1, 80, 3),)  # 3 tokens x GQA 4: one group of 12 columns (NVFP4: decode_mma16, FP8: decode_tok)


def _decode_kw(dopts: str, kernel: str, dt: KVDtype, d: int) -> dict[str, object]:
    """A --decode-opts item -> extend_decode keywords: 'fold' / 'nofold' set fold_q on / off (else its
    default), the other options (``decode_config_from_spec``'s keys) make the prefix decode's config on the
    plan's ``kernel``."""
    toks = dopts.split(",")
    fold = {"fold_q": True} if "fold" in toks else {"fold_q": False} if "nofold" in toks else {}
    opts = ",".join(o for o in toks if o and o not in ("fold", "nofold"))
    cfg = {"prefix_config": decode_config_from_spec(f"{kernel}:{opts}", dt, d)} if opts else {}
    return {**cfg, **fold}


def extend_rows(
    bench: Callable[..., float], dev: str, smoke: bool = False, hq: int = 32, hkv: int = 8, d: int = 128,
    configs: Sequence[tuple[int, ...]] = ((0, 0),),
    shapes: Sequence[tuple[int, int, int]] | None = None,
    profile: Callable[..., dict[str, float]] | None = None,
    decode_opts: Sequence[str] = ("",),
) -> list[dict[str, object]]:  # fmt: skip
    """Time extend_triton per (dtype, shape, (splits, stages[, warps[, bm[, bn]]])); rows carry the keys
    bench_kernels' ``add`` takes (0 = the launcher's default). ``shapes``: (batch, prefix, chunk) items
    (default SHAPES; prefixes a multiple of the 16-token page); ``profile(fn)``: per-kernel GPU times of a
    call, kept as the row's ``kernels_us``; ``decode_opts``: the prefix decode's variant options of the
    ``extend_decode`` rows, one row each (``extend_decode``'s ``prefix_config``, see ``_decode_kw``)."""
    rows: list[dict[str, object]] = []
    if smoke:  # NOTE: one KV head: decode_mma (extend_decode rows) is slow in the interpreter
        hq, hkv = hq // hkv, 1
    for b, prefix, chunk in shapes or (SMOKE_SHAPES if smoke else SHAPES):
        if prefix % PAGE:
            raise ValueError(f"prefix {prefix} must be a multiple of the {PAGE}-token page")
        for dt in (KVDtype.BF16, KVDtype.FP8, KVDtype.NVFP4):
            lay = PageLayout(dt, hkv, d, PAGE)
            pages = b * (prefix // PAGE) + 4
            pool = LayerKV.allocate(lay, pages, dev, torch.tensor([0.9, 1.2], device=dev))
            fill_pool(pool)
            pt = torch.randperm(pages)[: b * (prefix // PAGE)].reshape(b, -1).to(torch.int32).to(dev)
            plens = torch.full((b,), prefix, dtype=torch.int32, device=dev)
            t = b * chunk
            cu = torch.arange(0, t + 1, chunk, dtype=torch.int32, device=dev)
            q = torch.randn(t, hq, d, device=dev).to(torch.bfloat16)
            k = torch.randn(t, hkv, d, device=dev).to(torch.bfloat16)
            v = torch.randn_like(k)
            out = torch.empty_like(q)
            view = PagedKV(pool, pt, plens, cu_seqlens=cu, max_chunk=chunk)
            runs = [(c, o) for c in configs for o in (decode_opts if len(c) > 7 and c[7] else ("",))]
            for cfg, dopts in runs:
                splits, stages, warps, bm, bn, own, regs, dec = (*cfg, 0, 0, 0, 0, 0, 0, 0)[:8]
                kw = {"num_splits": splits, "num_stages": stages or None, "num_warps": warps or None,
                      "block_m": bm or None, "block_n": bn or None, "own_stages": own or None,
                      "max_registers": regs or None}  # fmt: skip
                wide = {2: "tok", 3: "mma8"}.get(dec, "mma")
                if dec:
                    plan = extend_decode_plan(q, pool, chunk, wide)
                    same = dec >= 2 and plan == extend_decode_plan(q, pool, chunk)
                    if same or extend_decode_unsupported(q, pool, chunk, wide):
                        continue  # DEC >= 2 only where it differs from DEC=1's plan
                    # NOTE: WARPS / BN set step 2's launch (the own-chunk keys, the tail and the merge)
                    fn = partial(extend_decode, q, k, v, view, 1 / math.sqrt(d), out=out,
                                 num_splits=splits or None, wide=wide, own_warps=warps or None,
                                 own_block_n=bn or None, **_decode_kw(dopts, plan[0], dt, d))  # type: ignore[index]  # fmt: skip
                else:
                    fn = partial(extend_triton, q, k, v, view, 1 / math.sqrt(d), out=out, **kw)
                try:
                    us = bench(fn)
                except Exception as e:  # noqa: BLE001 - e.g. out of shared memory: reported, not fatal
                    print(
                        f"extend {NAMES[dt]} B{b} prefix {prefix} chunk {chunk} {kw} failed: {repr(e)[:160]}",
                        flush=True,
                    )
                    continue
                nbytes = b * prefix * lay.bytes_per_token() + (q.numel() + 2 * k.numel()) * 2
                prof = profile(fn) if profile is not None else {}
                kernel = ("extend", "extend_decode", "extend_decode_tok", "extend_decode_mma8")[dec]
                rows.append({"kernel": kernel, "dt": NAMES[dt], "b": b, "c": prefix, "hq": hq, "hkv": hkv,
                             "d": d,
                             "us": us, "nbytes": nbytes, "chunk": chunk, "splits": splits, "stages": stages, "warps": warps,
                             "bm": bm, "bn": bn, "own_stages": own, "max_registers": regs,
                             "decode_opts": dopts,
                             **({"kernels_us": prof} if prof else {})})  # fmt: skip
            del pool
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Extend-kernel launch-config sweep (see the module docstring).")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")),
                    help="folder for extend-sweep.json")
    ap.add_argument(
        "--configs", nargs="+", default=["0:0"],
        help="SPLITS:STAGES[:WARPS[:BM[:BN[:OWN[:REGS[:DEC]]]]]] (0 = default; REGS caps registers per thread; "
        "DEC=1 times extend_decode where it applies, DEC=2 its decode_tok path for wide NVFP4 chunks, "
        "DEC=3 its 8-column decode_mma groups)",
    )
    ap.add_argument("--decode-opts", nargs="+", default=[""],
                    help="prefix-decode variant options of the DEC rows, one row each (e.g. '' 'l2=1'); "
                    "'fold' / 'nofold': extend_decode's fold_q on / off")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny shapes on CPU (TRITON_INTERPRET=1): checks the code path, not the numbers")
    ap.add_argument("--shapes", nargs="*", default=None, help="BATCHxPREFIXxCHUNK items (default: SHAPES)")
    ap.add_argument("--breakdown", action="store_true", help="per-kernel GPU times of every timed call")
    ap.add_argument("--flush", choices=timing.FLUSH_MODES, default=timing.FLUSH,
                    help="how L2 is emptied before each timed call (timing.FLUSH)")
    args = ap.parse_args(argv)
    timing.set_flush(args.flush)
    configs = [tuple(int(x) for x in c.split(":")) for c in args.configs]
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes] if args.shapes else None
    t0 = time.time()
    ceil = read_ceiling(1 << 20 if args.smoke else 4 * GiB)
    ceiling = max(ceil["torch_sum_tbps"], ceil["triton_stream_tbps"])
    profile = kernel_breakdown if args.breakdown and DEV == "cuda" else None
    # kernel time (no launcher host work)
    rows = extend_rows(
        bench_graph, DEV, args.smoke, configs=configs, shapes=shapes,  # type: ignore[arg-type]
        profile=profile, decode_opts=args.decode_opts,
    )
    for r in rows:
        tb = float(r["nbytes"]) / float(r["us"]) / 1e6  # type: ignore[arg-type]
        r.update(tbps=round(tb, 4), frac_of_ceiling=round(tb / ceiling, 4), us=round(float(r["us"]), 2))  # type: ignore[arg-type]
        print(f"{r['kernel']:10s} {r['dt']:9s} B{r['b']} prefix {r['c']} chunk {r['chunk']} splits/stages/warps/bm/bn/own/regs "
              f"{r['splits']}/{r['stages']}/{r['warps']}/{r['bm']}/{r['bn']}/{r['own_stages']}/"
              f"{r['max_registers']}"
              f"{' ' + str(r['decode_opts']) if r['decode_opts'] else ''}: "
              f"{r['us']} us, {tb:.2f} TB/s ({tb / ceiling:.2f}) {r.get('kernels_us', '')}",
              flush=True)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"ceiling_probes": ceil, "flush": args.flush, "rows": rows}
    (args.out / "extend-sweep.json").write_text(json.dumps(doc, indent=1))
    print(f"done {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
