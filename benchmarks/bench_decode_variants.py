"""Decode kernel variants side by side on one GPU, in one device call (a variant: a spec
``kernel[:key=value,...]`` -- ``nibblekv.kernels.testing.decode_config_from_spec`` -- turned into the typed
``DecodeConfig`` the launcher takes).

Usage (on the GPU machine, from the repo root)::

    PYTHONPATH=. python benchmarks/bench_decode_variants.py --out $OUT [--budget-s 330] [--variants SPEC...]
    TRITON_INTERPRET=1 python benchmarks/bench_decode_variants.py --smoke --out DIR   # CPU (interpreter)

A kernel A/B: e.g. ``--variants nvfp4=mma nvfp4=mma:wppsm=12 --shapes 64x8192``, run twice in reverse
order to see past the GPU's drift between runs. ``--page-order l2`` (every page in 8 MiB of the pool, read
from L2) times a kernel at its instruction-bound rate: on an H100 it predicts the H200 (the head_dim-128
kernels read HBM there at 0.84-0.87 of that rate; docs/results.md). ``--scales apart`` / ``beside`` time NVFP4
with its block scales in tensors of their own / next to their data (``kernels.testing.place_scales``) instead
of the pool's layout (K and V of a (page, head) in one run of bytes).

For each (kv dtype, variant spec) in priority order: compile + check against ``decode_ref`` on a small odd
batch (lengths 1, 15, 16, 17, 1000, 4099; tails 0/1/32/7/64/0; Hq=32 Hkv=8 D=128), print registers and
spills of the compiled kernel, then time the acceptance shapes (16-token pages at random places).
A variant that fails to compile or is wrong is reported and skipped. Results are written after every
variant (``$OUT/decode-variants.json``), so a run cut short keeps what it measured; a table comes last:
per shape, each variant's fraction of this run's read ceiling, and the best NVFP4 / best FP8 time ratio.

Several runs (e.g. ``--page-order l2`` and from HBM, or two head_dims) become one result file with
``--merge RUN.json... --name NAME --title TEXT``: top-level ``commit`` (``$COMMIT``, else the first run's),
``gpu``, ``date``, ``torch``, ``triton``, ``title`` and ``runs`` (each run's ``command`` and rows);
``benchmarks/device/decode_variants.sh`` runs and merges in one device call.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shlex
import sys
import time
import traceback
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root, for `benchmarks.*`
from benchmarks import bench_kernels, timing  # noqa: E402
from benchmarks.bench_kernels import NAMES, Pools, run_decode  # noqa: E402
from benchmarks.timing import DEV, read_ceiling  # noqa: E402
from nibblekv.formats.kv_view import PagedKV  # noqa: E402
from nibblekv.formats.layout import KVDtype  # noqa: E402
from nibblekv.kernels.decode import launch as dec  # noqa: E402
from nibblekv.kernels.reference import decode_ref  # noqa: E402
from nibblekv.kernels.testing import (  # noqa: E402
    SCALE_PLACEMENTS,
    decode_config_from_spec,
    make_batch,
    place_scales,
    rel_rms,
)

# Acceptance shapes (B, ctx): B*ctx >= 256K and B=1 x 128K; (32, 8192) is a mid row.
SHAPES = [(64, 32768), (8, 32768), (1, 131072), (32, 8192)]

# (dtype, spec) in priority order (a run that hits --budget-s skips the rest): baselines, the new kernels'
# defaults (decode.knobs.tok_knobs: FP8 = tok:bn=128,sv=1,conv=1, NVFP4 = tok:bn=128, BF16 = tok:bn=64),
# then block size, pipeline depth, and the ablations of the FP8 V path.
DEFAULT_PLAN: list[tuple[KVDtype, str]] = [
    # (the removed variants bs and kq were measured and dropped as dead ends; mma supersedes them)
    (KVDtype.BF16, "paged"), (KVDtype.FP8, "paged"), (KVDtype.NVFP4, "paged"),
    (KVDtype.BF16, "tok"), (KVDtype.FP8, "tok"), (KVDtype.NVFP4, "tok"),
    (KVDtype.BF16, "tok:bn=128"), (KVDtype.FP8, "tok:bn=64"), (KVDtype.NVFP4, "tok:bn=64"),
    (KVDtype.BF16, "tok:s=3"), (KVDtype.FP8, "tok:s=3"), (KVDtype.NVFP4, "tok:s=3"),
    (KVDtype.BF16, "tok:s=5"), (KVDtype.FP8, "tok:s=5"), (KVDtype.NVFP4, "tok:s=5"),
    (KVDtype.FP8, "tok:sv=0,conv=1"), (KVDtype.FP8, "tok:sv=0,conv=0"), (KVDtype.NVFP4, "tok:sv=1"),
    (KVDtype.NVFP4, "tok:w=8"), (KVDtype.BF16, "tok:bn=32"), (KVDtype.BF16, "tok:bn=128,w=8"),
    (KVDtype.FP8, "tok:w=8"), (KVDtype.NVFP4, "tok:sv=2"), (KVDtype.BF16, "rows"), (KVDtype.FP8, "rows"),
    (KVDtype.BF16, "tok:s=6"), (KVDtype.FP8, "tok:s=6"), (KVDtype.NVFP4, "tok:s=6"),
]  # fmt: skip


def check(dt: KVDtype, spec: str, batch: object) -> tuple[float, dict[str, object]]:
    """rel. RMS error of one variant vs decode_ref on the small odd batch (+ the compiled kernel's resources)."""
    pb, q, ref = batch  # type: ignore[misc]
    out = torch.full_like(q, float("nan"))
    cfg = decode_config_from_spec(spec, dt, q.shape[-1])
    dec.decode_triton(
        q, pb.view(), 1 / math.sqrt(q.shape[-1]), out=out, config=cfg
    )
    torch.cuda.synchronize() if DEV == "cuda" else None
    k = dec.LAST_KERNEL.get("decode")
    res: dict[str, object] = {}
    for attr in ("n_regs", "n_spills"):
        res[attr] = getattr(k, attr, None)
    # the tail-free launch compiles the main-pool-only specialization that the timed shapes use
    out2 = torch.full_like(q, float("nan"))
    no_tail = PagedKV(pb.cache, pb.page_table, pb.lens)
    dec.decode_triton(q, no_tail, 1 / math.sqrt(q.shape[-1]), out=out2, config=cfg)
    k2 = dec.LAST_KERNEL.get("decode")
    res["n_regs_notail"], res["n_spills_notail"] = getattr(k2, "n_regs", None), getattr(k2, "n_spills", None)
    ref2 = decode_ref(q.float(), no_tail, 1 / math.sqrt(q.shape[-1]))
    return max(rel_rms(out, ref), rel_rms(out2, ref2)), res


def _pad16(t: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(t.shape[0], -(-t.shape[1] // 16) * 16, dtype=t.dtype, device=t.device)
    out[:, : t.shape[1]] = t
    return out


def make_check_batch(
    dt: KVDtype, smoke: bool, head_dim: int = 128, q_heads: int = 32, kv_heads: int = 8, scales: str = "page"
) -> object:
    torch.manual_seed(1234)
    lens = [1, 17, 40] if smoke else [1, 15, 16, 17, 1000, 4099]
    tails = [0, 7, 32] if smoke else [0, 1, 32, 7, 64, 0]
    pb = make_batch(dt, lens, kv_heads, head_dim, 16, DEV, tail_lens=tails, global_scale=(0.7, 1.3))
    # NOTE: page tables padded to 16 columns, like the timed shapes', so Triton's divisibility
    # specialization of their row stride matches and the timed launches reuse the checked compile.
    pb.page_table, pb.tail_page_table = _pad16(pb.page_table), _pad16(pb.tail_page_table)
    pb.cache = place_scales(pb.cache, scales)
    q = torch.randn(len(lens), q_heads, head_dim, device=DEV).to(torch.bfloat16)
    ref = decode_ref(q.float(), pb.view(), 1 / math.sqrt(head_dim))
    return pb, q, ref


# a run's own keys in a merged file (the rest -- commit, gpu, torch, triton -- moves to the top level)
RUN_KEYS = ("command", "date", "flush", "ceiling_probes", "ceiling_tbps", "variants", "rows", "best")


def merge_runs(paths: list[Path], title: str, commit: str | None = None) -> dict[str, object]:
    """Runs' ``decode-variants.json`` files -> one result document (see the module docstring). The runs
    must come from one GPU."""
    docs = [json.loads(p.read_text()) for p in paths]
    if not docs:
        raise ValueError("--merge needs at least one run file")
    gpus = {d.get("gpu") for d in docs}
    if len(gpus) != 1:
        raise ValueError(f"--merge: runs from different GPUs {sorted(map(str, gpus))}")
    first = docs[0]
    return dict(
        commit=commit or first.get("commit", "unknown"), gpu=first.get("gpu"), date=str(first.get("date", ""))[:10],
        torch=first.get("torch"), triton=first.get("triton"), title=title,
        runs=[{k: d[k] for k in RUN_KEYS if k in d} for d in docs],
    )  # fmt: skip


def command_line(argv: list[str]) -> str:
    """The run's command as a result file cites it: ``--out``'s folder written as ``DIR``."""
    args = list(argv)
    for i, a in enumerate(args[:-1]):
        if a == "--out":
            args[i + 1] = "DIR"
    return "PYTHONPATH=. python benchmarks/bench_decode_variants.py " + " ".join(map(shlex.quote, args))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Decode kernel variants side by side (see the module docstring).")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"), help="folder for decode-variants.json")
    ap.add_argument("--budget-s", type=float, default=330.0, help="stop starting new variants after this")
    ap.add_argument("--variants", nargs="*", default=None, help="dtype=spec items, e.g. nvfp4=tok:bn=128")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny shapes on CPU (TRITON_INTERPRET=1): checks the code path, not the numbers")
    ap.add_argument(
        "--shapes", nargs="*", default=None, help="BxCTX items, e.g. 1x4096 12x3072 (default: SHAPES)"
    )
    ap.add_argument("--ragged", nargs="*", default=[], help="ragged batches, e.g. 1x32768+63x1024 (NxCTX groups)")
    ap.add_argument("--head-dim", type=int, default=128, help="64: e.g. nvfp4=mma (two tokens a row) vs tok")
    ap.add_argument("--q-heads", type=int, default=32, help="query heads over 8 KV heads (64: GQA 8)")
    ap.add_argument("--kv-heads", type=int, default=8,
                    help="KV heads (the query heads scale with it: --kv-heads 2 --q-heads 64 is Qwen3-Next's 16 / 2)")
    ap.add_argument("--breakdown", action="store_true", help="per-kernel GPU times of every timed call")
    ap.add_argument("--tail", action="store_true", help="with a 64-token bf16 tail per request (the engine's default)")
    ap.add_argument("--page-order", choices=bench_kernels.PAGE_ORDERS, default="random",
                    help="where a request's pages lie (bench_kernels.PAGE_ORDER; l2: all in 8 MiB)")
    ap.add_argument("--scales", choices=SCALE_PLACEMENTS, default="page",
                    help="where NVFP4's block scales sit (kernels.testing.place_scales; page: the pool's)")
    ap.add_argument("--flush", choices=timing.FLUSH_MODES, default=timing.FLUSH,
                    help="how L2 is emptied before each timed call (timing.FLUSH)")
    ap.add_argument("--merge", type=Path, nargs="+", default=None,
                    help="no run: merge these runs' decode-variants.json into --out/--name.json")
    ap.add_argument("--name", default="decode-variants-merged", help="--merge's result file name (no .json)")
    ap.add_argument("--title", default="", help="--merge's title: the question the runs answer")
    args = ap.parse_args(argv)
    if args.merge:
        doc_m = merge_runs(args.merge, args.title, os.environ.get("COMMIT"))
        os.makedirs(args.out, exist_ok=True)
        dest = Path(args.out) / f"{args.name}.json"
        dest.write_text(json.dumps(doc_m, indent=1))
        print(f"merged {len(args.merge)} runs into {dest}")
        return 0
    bench_kernels.PAGE_ORDER = args.page_order
    timing.set_flush(args.flush)
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    plan = DEFAULT_PLAN
    if args.variants:
        by_name = {v: k for k, v in NAMES.items()}
        plan = [(by_name[s.split("=", 1)[0]], s.split("=", 1)[1]) for s in args.variants]
    shapes = list([(1, 96), (2, 64)] if args.smoke else SHAPES)
    if args.shapes:
        shapes = [(int(b), int(c)) for b, c in (x.split("x") for x in args.shapes)]
    # ragged batches "1x32768+63x1024": rows carry batch, the mean context and the spec as "lens"
    ragged = {}
    for spec in args.ragged:
        ctxs = [int(c) for part in spec.split("+") for n, c in [part.split("x")] for _ in range(int(n))]
        key = (len(ctxs), sum(ctxs) // len(ctxs))
        ragged[key] = (spec, ctxs)
        shapes.append(key)
    ceil = read_ceiling(1 << 20 if args.smoke else 4 << 30)
    print("ceiling probes", ceil, flush=True)
    probe_ceiling = max(ceil["torch_sum_tbps"], ceil["triton_stream_tbps"])  # per-line fractions use this
    max_tok = max([b * c for b, c in shapes] + [len(x) * max(x) for _, x in ragged.values()]) + 4096
    # --kv-heads (8: Llama-3.1-8B); the smoke run: one, at the same GQA ratio (the interpreter is slow)
    hkv = 1 if args.smoke else args.kv_heads
    if args.q_heads * hkv % 8:
        ap.error(f"--q-heads {args.q_heads} over 8 KV heads does not scale to --kv-heads {hkv}")
    q_heads = args.q_heads * hkv // 8
    pools = Pools({dt: max_tok for dt in NAMES}, hkv, args.head_dim, args.scales)
    print(f"pools ready {time.time() - t0:.0f}s", flush=True)
    checks = {dt: make_check_batch(dt, args.smoke, args.head_dim, q_heads, hkv, args.scales) for dt in NAMES}
    print(f"check batches ready {time.time() - t0:.0f}s", flush=True)
    doc: dict[str, object] = dict(
        ceiling_probes=ceil, gpu=torch.cuda.get_device_name() if DEV == "cuda" else "cpu", torch=torch.__version__,
        triton=triton.__version__, commit=os.environ.get("COMMIT", "unknown"),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), variants=[], rows=[],
        flush=args.flush, command=command_line(sys.argv[1:] if argv is None else argv),
    )  # fmt: skip
    variants: list[dict[str, object]] = doc["variants"]  # type: ignore[assignment]
    rows: list[dict[str, object]] = doc["rows"]  # type: ignore[assignment]

    def save() -> None:
        with open(os.path.join(args.out, "decode-variants.json"), "w") as f:
            json.dump(doc, f, indent=1)

    for dt, spec in plan:
        if time.time() - t0 > args.budget_s:
            print(f"budget spent: skipping {NAMES[dt]} {spec}", flush=True)
            variants.append(dict(kv_dtype=NAMES[dt], variant=spec, status="skipped (budget)"))
            continue
        info: dict[str, object] = dict(kv_dtype=NAMES[dt], variant=spec)
        variants.append(info)
        ts = time.time()
        try:
            err, res = check(dt, spec, checks[dt])
            info.update(res, rel_rms=err)
        except Exception as e:  # noqa: BLE001 - a variant that fails to compile/run is reported, not fatal
            info.update(status="failed", error=repr(e)[:400])
            print(f"{NAMES[dt]:9s} {spec:22s} FAILED {repr(e)[:300]}", flush=True)
            traceback.print_exc(limit=2)
            save()
            continue
        if not err <= 1e-2:
            info.update(status="wrong")
            print(f"{NAMES[dt]:9s} {spec:22s} WRONG rel_rms={err:.3g} {res}", flush=True)
            save()
            continue
        info["status"] = "ok"
        times = []
        for b, c in shapes:
            try:
                prof: dict[str, float] | None = {} if args.breakdown else None
                rg = ragged.get((b, c))
                us, nb = run_decode(pools, dt, b, max(rg[1]) if rg else c, q_heads, args.tail,
                                    decode_config_from_spec(spec, dt, args.head_dim),
                                    profile=prof, ctxs=rg[1] if rg else None)  # fmt: skip
            except Exception as e:  # noqa: BLE001
                print(f"{NAMES[dt]:9s} {spec:22s} B={b} ctx={c} FAILED {repr(e)[:200]}", flush=True)
                continue
            rows.append(dict(kernel="decode_tail64" if args.tail else "decode", kv_dtype=NAMES[dt], variant=spec, batch=b, context=c,
                             q_heads=q_heads, kv_heads=hkv, head_dim=args.head_dim, page_size=16, us=round(us, 2),
                             page_order=args.page_order, scales=args.scales,
                             bytes=nb, tbps=round(nb / us / 1e6, 4), **({"kernels_us": prof} if prof else {}),
                             **({"lens": rg[0]} if rg else {})))  # fmt: skip
            if prof:
                print(f"    B{b}x{c // 1024}K {us:.1f} us (graph): {prof}", flush=True)
            tb = nb / us / 1e6
            times.append(f"B{b}x{c // 1024}K:{tb:.2f}TB/s({tb / probe_ceiling:.2f})")
        print(f"{NAMES[dt]:9s} {spec:22s} ok rel_rms={err:.2e} regs={res.get('n_regs_notail')} "
              f"spills={res.get('n_spills_notail')}/{res.get('n_spills')}(tail) {' '.join(times)} [{time.time() - ts:.0f}s]",
              flush=True)  # fmt: skip
        save()
    finish(doc, ceil)
    save()
    print(f"done {time.time() - t0:.0f}s", flush=True)
    return 0


def finish(doc: dict[str, object], ceil: dict[str, float]) -> None:
    rows: list[dict[str, object]] = doc["rows"]  # type: ignore[assignment]
    best_bf16 = max((float(r["tbps"]) for r in rows if r["kv_dtype"] == "bf16"), default=0.0)  # type: ignore[arg-type]
    ceiling = max(ceil["torch_sum_tbps"], ceil["triton_stream_tbps"], best_bf16)
    doc["ceiling_tbps"] = round(ceiling, 4)
    for r in rows:
        r["frac_of_ceiling"] = round(float(r["tbps"]) / ceiling, 4)  # type: ignore[arg-type]
    print(
        f"\nceiling {ceiling:.3f} TB/s (probes {ceil}); frac of ceiling per variant and shape; targets nvfp4 .65 fp8 .75 bf16 .85"
    )
    shapes = sorted({(int(r["batch"]), int(r["context"])) for r in rows}, key=lambda s: (-s[0] * s[1], s[0]))  # type: ignore[call-overload]
    print(f"{'dtype':9s} {'variant':22s} " + " ".join(f"{f'B{b}x{c // 1024}K':>9s}" for b, c in shapes))
    best: dict[tuple[str, int, int], dict[str, object]] = {}
    for v in doc["variants"]:  # type: ignore[union-attr]
        cells = []
        for b, c in shapes:
            r = next((r for r in rows if r["kv_dtype"] == v["kv_dtype"] and r["variant"] == v["variant"]
                      and r["batch"] == b and r["context"] == c), None)  # fmt: skip
            cells.append(f"{r['frac_of_ceiling']:9.3f}" if r else f"{'-':>9s}")
            if r:
                key = (str(r["kv_dtype"]), b, c)
                if key not in best or float(r["us"]) < float(best[key]["us"]):  # type: ignore[arg-type]
                    best[key] = r
        extra = (
            ""
            if v.get("status") == "ok"
            else f"  {v.get('status')} {str(v.get('error', v.get('rel_rms', '')))[:80]}"
        )
        print(f"{v['kv_dtype']:9s} {v['variant']:22s} " + " ".join(cells) + extra)
    print("\nbest per shape: variant (frac); nvfp4/fp8 and nvfp4/bf16 time ratios of the best rows")
    summary = []
    for b, c in shapes:
        parts, s = [], dict(batch=b, context=c)
        for dt in ("bf16", "fp8_e4m3", "nvfp4"):
            r = best.get((dt, b, c))
            if r:
                parts.append(f"{dt}={r['variant']}({r['frac_of_ceiling']:.3f})")
                s[dt] = dict(variant=r["variant"], us=r["us"], frac=r["frac_of_ceiling"])
        n, f8, bf = best.get(("nvfp4", b, c)), best.get(("fp8_e4m3", b, c)), best.get(("bf16", b, c))
        if n and f8:
            s["nvfp4_over_fp8"] = round(float(n["us"]) / float(f8["us"]), 3)  # type: ignore[arg-type]
        if n and bf:
            s["nvfp4_over_bf16"] = round(float(n["us"]) / float(bf["us"]), 3)  # type: ignore[arg-type]
        summary.append(s)
        print(
            f"B{b}x{c // 1024}K: "
            + "  ".join(parts)
            + f"  nvfp4/fp8={s.get('nvfp4_over_fp8')} nvfp4/bf16={s.get('nvfp4_over_bf16')}"
        )
    doc["best"] = summary
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
