"""How fast does the GPU read random chunks of the sizes our KV pages make? (H200 probe, no engine code.)

Why: NVFP4 decode reaches ~0.70 of the read ceiling while its SMs issue only ~60% of the time (ncu,
2026-12-01), and an L2 prefetch one step ahead did not help. A 16-token page of one KV head is 1 KiB of K
nibbles + 1 KiB of V + two 128-byte scale runs in other tensors: four DRAM bursts at random places per
2.3 KiB, where FP8 reads two 2 KiB runs. This reads the same byte totals as random chunks of each
layout with a plain Triton kernel (one program per 4 page-heads, every chunk at its own random offset)::

    PYTHONPATH=. python benchmarks/probe_chunks.py --out DIR

Rows: layout, chunk sizes, GB read, TB/s, fraction of the kernel benchmark's streaming read (4 GiB).
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton
import triton.language as tl

from benchmarks.bench_kernels import GiB, bench, read_ceiling

@triton.jit
def _chunks_kernel(buf, offs, out, S0: tl.constexpr, S1: tl.constexpr, S2: tl.constexpr, S3: tl.constexpr,
                   BLK: tl.constexpr, U: tl.constexpr):  # fmt: skip
    """Program p sums units ``[p U, p U + U)``; unit i reads chunk j (``Sj`` int32 words, 0 = none) at word
    offset ``offs[i, j]`` (a multiple of 32)."""
    pid = tl.program_id(0)
    r = tl.arange(0, BLK)
    acc = tl.zeros([BLK], tl.int32)
    for u in tl.static_range(U):
        i = (pid * U + u).to(tl.int64)
        for j in tl.static_range(4):
            S = S0 if j == 0 else (S1 if j == 1 else (S2 if j == 2 else S3))
            if S > 0:
                o = tl.multiple_of(tl.load(offs + i * 4 + j), 32)
                acc += tl.load(buf + o + r, mask=r < S, other=0)
    tl.store(out + pid * BLK + r, acc)


LAYOUTS = {
    # name: chunk sizes in bytes (per page of one KV head; K then V, then their scale runs)
    "bf16 16-token": (4096, 4096, 0, 0),
    "fp8 16-token": (2048, 2048, 0, 0),
    "nvfp4 16-token, scales apart (now)": (1024, 1024, 128, 128),
    "nvfp4 16-token, no scales": (1024, 1024, 0, 0),
    "nvfp4 16-token, scales inline": (1152, 1152, 0, 0),
    "nvfp4 32-token, scales apart": (2048, 2048, 256, 256),
    "nvfp4 32-token, scales inline": (2304, 2304, 0, 0),
    "nvfp4 16-token, K+V+scales one run": (2304, 0, 0, 0),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--gib", type=float, default=16.0, help="buffer size (the chunks land anywhere in it)")
    ap.add_argument("--read-gib", type=float, default=2.0, help="bytes each layout reads")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    stream = read_ceiling()["triton_stream_tbps"]  # the kernel benchmark's streaming read of 4 GiB
    words = int(args.gib * GiB) // 4
    buf = torch.randint(-100, 100, (words,), dtype=torch.int32, device="cuda")
    rows = [{"layout": "stream", "tbps": round(stream, 3)}]
    print(f"stream read {stream:.3f} TB/s", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name, sizes in LAYOUTS.items():
        per = sum(sizes)
        U = 4
        n = int(args.read_gib * GiB) // per // U * U
        blk = triton.next_power_of_2(max(sizes) // 4)
        # every chunk at its own random, 128-byte aligned place (pages land anywhere in the pool)
        top = (words - blk) // 32
        offs = (torch.randint(0, top, (n, 4), generator=gen, device="cuda") * 32).to(torch.int64)
        out = torch.empty((n // U) * blk, dtype=torch.int32, device="cuda")
        s = [x // 4 for x in sizes]
        fn = lambda: _chunks_kernel[(n // U,)](buf, offs, out, S0=s[0], S1=s[1], S2=s[2], S3=s[3], BLK=blk, U=U,  # noqa: E731
                                                num_warps=4 if blk >= 512 else 2)  # fmt: skip
        tb = n * per / bench(fn) / 1e6
        rows.append({"layout": name, "chunk_bytes": list(sizes), "gb": round(n * per / 1e9, 3),
                     "tbps": round(tb, 3), "frac_of_stream": round(tb / stream, 3)})  # fmt: skip
        print(f"{name:40s} {sizes} {n * per / 1e9:.2f} GB {tb:.3f} TB/s ({tb / stream:.3f})", flush=True)
        del offs, out
    doc = {"gpu": torch.cuda.get_device_name(), "commit": os.environ.get("COMMIT", "unknown"), "rows": rows}
    with open(os.path.join(args.out, "probe-chunks.json"), "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
