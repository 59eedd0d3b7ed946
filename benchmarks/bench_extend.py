"""Extend-kernel rows for bench_kernels.py: a chunk of new tokens per request over a cached prefix."""

from __future__ import annotations

import math
from typing import Callable

import torch

from nibblekv.formats.layout import KVDtype, PageLayout
from nibblekv.kernels.extend import extend_triton
from nibblekv.kernels.testing import fill_pool
from nibblekv.kernels.types import LayerKV

PAGE = 16
NAMES = {KVDtype.BF16: "bf16", KVDtype.FP8: "fp8_e4m3", KVDtype.NVFP4: "nvfp4"}
# (batch, prefix, chunk): decode-like small chunks (speculative / short turns) up to prefill chunks
SHAPES = ((32, 8192, 16), (64, 8192, 4), (8, 8192, 128), (4, 32768, 64), (1, 32768, 512), (8, 2048, 512))
TINY = ((1, 80, 5),)


def extend_rows(bench: Callable[..., float], dev: str, tiny: bool = False, hq: int = 32, hkv: int = 8, d: int = 128) -> list[dict[str, object]]:
    """Time extend_triton per (dtype, shape); rows carry the keys bench_kernels' ``add`` takes."""
    rows: list[dict[str, object]] = []
    for b, prefix, chunk in TINY if tiny else SHAPES:
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
            fn = lambda: extend_triton(q, k, v, cu, pool, pt, plens, 1 / math.sqrt(d), max_chunk=chunk, out=out, use_asm=None if dev == "cuda" else False)  # noqa: E731
            try:
                us = bench(fn)
            except Exception as e:  # noqa: BLE001 - e.g. out of shared memory: retry with fewer stages
                print("extend default config failed:", repr(e)[:160], flush=True)
                fn = lambda: extend_triton(q, k, v, cu, pool, pt, plens, 1 / math.sqrt(d), max_chunk=chunk, out=out, num_stages=2)  # noqa: E731
                us = bench(fn)
            nbytes = b * prefix * lay.bytes_per_token() + (q.numel() + 2 * k.numel()) * 2
            rows.append(dict(kernel="extend", dt=NAMES[dt], b=b, c=prefix, hq=hq, hkv=hkv, d=d, us=us, nbytes=nbytes, chunk=chunk))
            del pool
    return rows
