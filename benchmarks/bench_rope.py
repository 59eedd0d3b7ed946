"""RoPE + the KV cache's Hadamard rotation on the GPU: the fused kernel vs the plain kernel + a GEMM, per
token count (``rope._ROT_FUSED_MAX_TOKENS`` picks between them), beside the plain RoPE kernel: GPU time
(``do_bench``), GPU time inside a CUDA graph (decode), and back-to-back calls' wall time (eager prefill).

    PYTHONPATH=. python benchmarks/bench_rope.py --out DIR

Llama-3.1-8B heads (32 q, 8 kv, head_dim 128), bf16; median of ``triton.testing.do_bench``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import triton

import nibblekv.kernels.rope as rope
from nibblekv.attention.paged import hadamard_matrix


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")))
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 32, 64, 128, 256, 512, 1400, 8192])
    args = ap.parse_args()
    hq, hkv, d = 32, 8, 128
    rot = hadamard_matrix(d, "cuda", torch.bfloat16)
    rows = []
    default = (rope._ROT_FUSED_MAX_TOKENS, rope._ROT_FUSED_MAX_TOKENS_GRAPH)

    def us(fn: object) -> float:
        return round(1e3 * triton.testing.do_bench(fn, return_mode="median"), 2)  # type: ignore[arg-type]

    def graph_us(fn: object) -> float:
        """GPU time inside a CUDA graph, as decode steps run (no host launch costs)."""
        ms = triton.testing.do_bench_cudagraph(fn, return_mode="median")  # type: ignore[arg-type]
        return round(1e3 * ms, 2)

    def wall_us(fn: object, n: int = 200) -> float:
        """Back-to-back calls, one sync at the end: what an eager prefill pays (host launch costs too)."""
        fn()  # type: ignore[operator]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()  # type: ignore[operator]
        torch.cuda.synchronize()
        return round(1e6 * (time.perf_counter() - t0) / n, 2)

    for t in args.tokens:
        qkv = torch.randn(t, (hq + 2 * hkv) * d, device="cuda").to(torch.bfloat16)
        cos = torch.randn(t, 1, d, device="cuda").to(torch.bfloat16)
        sin = torch.randn(t, 1, d, device="cuda").to(torch.bfloat16)
        plain = lambda: rope.rope_qk(qkv, cos, sin, hq, hkv, d)  # noqa: E731
        row = {"tokens": t, "plain_us": us(plain), "plain_wall_us": wall_us(plain)}
        row["plain_graph_us"] = graph_us(plain)
        for name, limit in (("fused", 1 << 30), ("gemm", 0)):
            rope._ROT_FUSED_MAX_TOKENS = rope._ROT_FUSED_MAX_TOKENS_GRAPH = limit  # eager and in graphs
            rotated = lambda: rope.rope_qk(qkv, cos, sin, hq, hkv, d, rot)  # noqa: E731
            row[f"{name}_us"], row[f"{name}_wall_us"] = us(rotated), wall_us(rotated)
            row[f"{name}_graph_us"] = graph_us(rotated)
        rope._ROT_FUSED_MAX_TOKENS, rope._ROT_FUSED_MAX_TOKENS_GRAPH = default
        rows.append(row)
        print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"commit": os.environ.get("COMMIT", "unknown"), "gpu": torch.cuda.get_device_name(),
            "fused_max_tokens": default[0], "fused_max_tokens_graph": default[1]}  # fmt: skip
    (args.out / "rope-h200.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
