"""Question: where do the decode kernels' cycles go (stall reasons)? One decode call per shape, for ncu.

Usage on the device (only the calls between cudaProfilerStart/Stop are profiled)::

    PYTHONPATH=. ncu --profile-from-start off --clock-control none --set full --import-source no \
        -o $OUT/decode -f python3 benchmarks/tools/ncu_decode.py --shapes nvfp4:26x32768 fp8_e4m3:26x32768

then ``ncu -i REPORT --page details`` (or ``--page source --csv --print-source sass`` for per-line stalls).

Each shape: ``dtype:BxC[:q_heads][:variant]`` (q_heads 32 by default, KV heads 8, head_dim 128, the 64-token
bf16 tail on, pages at random places, as ``bench_kernels.py``). Two warm-up calls compile and settle;
the profiled call is the third.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for `benchmarks.*`
from benchmarks.bench_kernels import PAGE, Pools, decode_call  # noqa: E402
from benchmarks.timing import profile_once  # noqa: E402
from nibblekv.formats.layout import KVDtype  # noqa: E402
from nibblekv.kernels.testing import decode_config_from_spec  # noqa: E402


def parse(spec: str) -> tuple[KVDtype, int, int, int, str]:
    parts = spec.split(":")
    dt = KVDtype(parts[0])
    b, c = (int(x) for x in parts[1].split("x"))
    hq = int(parts[2]) if len(parts) > 2 and parts[2] else 32
    variant = ":".join(parts[3:])  # e.g. mma:bal=0
    return dt, b, c, hq, variant


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", required=True)
    args = ap.parse_args()
    specs = [parse(s) for s in args.shapes]
    need: dict[KVDtype, int] = {}
    for dt, b, c, _, _ in specs:
        need[dt] = max(need.get(dt, 0), b * (c + PAGE) + 4096)
    pools = Pools(need, 8, 128)
    for dt, b, c, hq, variant in specs:
        cfg = decode_config_from_spec(variant, dt, 128) if variant else None
        fn, _ = decode_call(pools, dt, b, c, hq, True, cfg)
        profile_once(fn, f"{dt.value} {b}x{c} q_heads={hq} variant={variant or 'default'}")


if __name__ == "__main__":
    main()
