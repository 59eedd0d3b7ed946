"""Questions: (1) is the grid FP8 GEMM slower at 1 token than at 2 because Triton specializes ``M == 1``?
(2) what does Nsight Compute say of the FP8 weight stream at 128 tokens (grid GEMM, TMA GEMM, bf16 mm)?

Usage on the device::

    PYTHONPATH=. python benchmarks/tools/fp8_gemm_probe.py specialize DIR/fp8-m1-specialize-h100.json
    ncu -k "regex:gemm" --launch-skip 3 --launch-count 3 --section SpeedOfLight \
        python benchmarks/tools/fp8_gemm_probe.py ncu

``specialize``: per 8B projection at 1 and 2 tokens (per channel), the grid GEMM with ``gemm_tile``'s launch
as built (M specialized where it is 1) and with ``do_not_specialize=["M"]``, each twice in alternation
(CUDA-graph replays, L2 emptied per call: ``timing.bench_graph``). ``ncu``: two rounds of one launch each of
the grid GEMM, the TMA GEMM (64x128 tiles, 6 stages) and bf16 ``torch.mm`` at qkv x 128 tokens.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for `benchmarks.*`
from benchmarks.timing import bench_graph  # noqa: E402
from nibblekv.formats.fp8_weights import quantize_weight_channel  # noqa: E402
from nibblekv.kernels.fp8 import gemm  # noqa: E402
from nibblekv.kernels.fp8.gemm_tma import fp8_tma_gemm  # noqa: E402
from nibblekv.kernels.fp8.quant import quant_fp8_groups  # noqa: E402
from nibblekv.kernels.fp8.tiles import TmaTile, gemm_tile  # noqa: E402

SHAPES_8B = (("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336))


def _operands(m: int, n: int, k: int) -> tuple[torch.Tensor, ...]:
    w = torch.randn(n, k, device="cuda") * 0.02
    wq, ws = quantize_weight_channel(w)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    xq, xs = quant_fp8_groups(x, None)
    return x, w.to(torch.bfloat16), xq, xs, wq, ws


def specialize(path: Path) -> None:
    built = gemm._block_gemm_kernel
    unspecialized = triton.jit(do_not_specialize=["M"])(built.fn)
    rows = []
    for name, n, k in SHAPES_8B:
        for m in (1, 2):
            _, _, xq, xs, wq, ws = _operands(m, n, k)
            tile = gemm_tile(m, n, triton.cdiv(k, gemm.ROWWISE_K_STEP))
            row: dict[str, object] = dict(name=name, m=m, n=n, k=k)
            for label, kernel in (("built", built), ("m_unspecialized", unspecialized)) * 2:
                gemm._block_gemm_kernel = kernel
                try:
                    us = bench_graph(lambda: gemm.fp8_rowwise_gemm(xq, xs, wq, ws, torch.bfloat16, tile=tile))
                finally:
                    gemm._block_gemm_kernel = built
                row.setdefault(f"{label}_us", []).append(round(us, 2))  # type: ignore[union-attr]
            rows.append(row)
            print(json.dumps(row), flush=True)
    path.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": rows}, indent=1))


def ncu_launches() -> None:
    n, k = 6144, 4096
    x, wb, xq, xs, wq, ws = _operands(128, n, k)
    for _ in range(2):
        gemm.fp8_rowwise_gemm(xq, xs, wq, ws, torch.bfloat16, tile=gemm_tile(128, n, k // 128))
        fp8_tma_gemm(xq, xs, wq, ws, None, torch.bfloat16, TmaTile(64, 128, 1, 4, 6, 1))
        torch.mm(x, wb.t())
    torch.cuda.synchronize()


if __name__ == "__main__":
    if sys.argv[1] == "specialize":
        specialize(Path(sys.argv[2]))
    else:
        ncu_launches()
