"""RoPE (+ the KV cache's Hadamard rotation) kernel times on the GPU, per token count and row-block size.

    PYTHONPATH=. python benchmarks/bench_rope.py --out DIR

Llama-3.1-8B heads (32 q, 8 kv, head_dim 128), bf16; median of ``triton.testing.do_bench``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import triton

import nibblekv.kernels.fused as fused
from nibblekv.attention.paged import hadamard_matrix


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")))
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64, 1400, 8192])
    ap.add_argument("--rows", type=int, nargs="+", default=[32, 64], help="_ROT_ROWS values to time")
    args = ap.parse_args()
    hq, hkv, d = 32, 8, 128
    rot = hadamard_matrix(d, "cuda", torch.bfloat16)
    rows = []
    default = fused._ROT_ROWS
    for t in args.tokens:
        qkv = torch.randn(t, (hq + 2 * hkv) * d, device="cuda").to(torch.bfloat16)
        cos = torch.randn(t, 1, d, device="cuda").to(torch.bfloat16)
        sin = torch.randn(t, 1, d, device="cuda").to(torch.bfloat16)
        plain = triton.testing.do_bench(lambda: fused.rope_qk(qkv, cos, sin, hq, hkv, d), return_mode="median")
        for bm in args.rows if t >= fused._ROT_SPLIT_TOKENS else [default]:
            fused._ROT_ROWS = bm
            us = 1e3 * triton.testing.do_bench(lambda: fused.rope_qk(qkv, cos, sin, hq, hkv, d, rot),
                                               return_mode="median")  # fmt: skip
            rows.append({"tokens": t, "rot_rows": bm, "rotated_us": round(us, 2), "plain_us": round(1e3 * plain, 2)})
            print(json.dumps(rows[-1]), flush=True)
    fused._ROT_ROWS = default
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"commit": os.environ.get("COMMIT", "unknown"), "gpu": torch.cuda.get_device_name()}
    (args.out / "rope-h200.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
