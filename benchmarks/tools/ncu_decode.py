"""Question: where do the decode kernels' cycles go (stall reasons, issue slots, pipes)? One decode call per
shape, for ncu.

Usage on the device (only the calls between cudaProfilerStart/Stop are profiled; ``-k`` keeps the combine
step out)::

    PYTHONPATH=. ncu --profile-from-start off --clock-control none --set full --import-source no \
        -k regex:decode_ -o $OUT/decode -f python3 benchmarks/tools/ncu_decode.py \
        --shapes nvfp4:19x163840 fp8_e4m3:19x163840

then ``ncu -i REPORT --page details``, or a JSON of each kernel's time, DRAM rate, issue-slot use, busiest
pipes and stall shares (and with ``--sass`` each report's hottest SASS lines), labelled by the run's log::

    ncu -i REPORT --page raw --csv > RAW.csv
    ncu -i REPORT --page source --csv --print-source sass > SRC.csv   # one kernel a report
    python3 benchmarks/tools/ncu_decode.py --summarize RAW.csv LOG [RAW2.csv LOG2 ...] [--sass SRC.csv ...] \
        --gpu NAME --out FILE

``benchmarks/device/ncu.sh`` runs these steps for several reports. Each shape:
``dtype:BxC[:q_heads][:variant]`` (q_heads 32 by default; ``--kv-heads`` 8 and ``--head-dim`` 128 by
default), the 64-token bf16 tail on, pages at random places, as ``bench_kernels.py``. Two warm-up calls
compile and settle; the profiled call is the third.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for `benchmarks.*`
from benchmarks.bench_kernels import PAGE, Pools, decode_call  # noqa: E402
from benchmarks.timing import profile_once  # noqa: E402
from benchmarks.tools.ncu_summary import kernel_rows, sass_hotspots, write_summary  # noqa: E402
from nibblekv.formats.layout import KVDtype  # noqa: E402
from nibblekv.kernels.testing import decode_config_from_spec  # noqa: E402


def parse(spec: str) -> tuple[KVDtype, int, int, int, str]:
    parts = spec.split(":")
    dt = KVDtype(parts[0])
    b, c = (int(x) for x in parts[1].split("x"))
    hq = int(parts[2]) if len(parts) > 2 and parts[2] else 32
    variant = ":".join(parts[3:])  # e.g. mma:bal=0
    return dt, b, c, hq, variant


def _hotspots(src_csv: str) -> list[dict] | str:
    """``sass_hotspots`` of one source page, or why it could not be read (the kernel rows are kept)."""
    try:
        return sass_hotspots(src_csv)
    except (ValueError, StopIteration, IndexError) as e:
        return f"unreadable source page: {type(e).__name__}: {e}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--shapes", nargs="+", help="dtype:BxC[:q_heads][:variant], e.g. nvfp4:19x163840::mma:l2=1"
    )
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument(
        "--summarize", nargs="+", metavar="RAW_CSV LOG", help="JSON of ncu reports (pairs) instead"
    )
    ap.add_argument(
        "--sass", nargs="*", default=[], help="--summarize: source-page CSVs, one a report, in order"
    )
    ap.add_argument("--out", default=None, help="--summarize: the JSON file (default: stdout)")
    ap.add_argument("--gpu", default="unknown", help="--summarize: the GPU the report was taken on")
    args = ap.parse_args()
    if args.summarize:
        kernels = [k for p in zip(args.summarize[::2], args.summarize[1::2]) for k in kernel_rows(*p)]
        # NOTE: one kernel a report (ncu.sh), so source page i is kernel i's
        sass = {k["label"] or Path(f).stem: _hotspots(f) for k, f in zip(kernels, args.sass)}
        write_summary(args.out, args.gpu, kernels=kernels, sass=sass)
        return
    if not args.shapes:
        ap.error("--shapes is required unless --summarize")
    specs = [parse(s) for s in args.shapes]
    need: dict[KVDtype, int] = {}
    for dt, b, c, _, _ in specs:
        need[dt] = max(need.get(dt, 0), b * (c + PAGE) + 4096)
    pools = Pools(need, args.kv_heads, args.head_dim)
    for dt, b, c, hq, variant in specs:
        cfg = decode_config_from_spec(variant, dt, args.head_dim) if variant else None
        fn, _ = decode_call(pools, dt, b, c, hq, True, cfg)
        label = f"{dt.value} {b}x{c} head_dim={args.head_dim} q_heads={hq} kv_heads={args.kv_heads}"
        profile_once(fn, f"{label} variant={variant or 'default'}")


if __name__ == "__main__":
    main()
