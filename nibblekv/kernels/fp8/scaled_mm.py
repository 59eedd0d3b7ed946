"""cuBLASLt's DeepSeek-style block-scaled FP8 GEMM (1x128 activation x 128x128 weight scales) through
``torch._scaled_mm``: the block-scaled layer's prefill GEMM where torch and cuBLAS (>= 12.9, sm_90) have it,
which :func:`block_scaled_mm_unavailable` checks once per device against the twin (``fp8.reference``)."""

from __future__ import annotations

import logging

import torch

from nibblekv.formats.fp8_weights import quantize_act_groups
from nibblekv.formats.nvfp4 import E4M3_MAX
from nibblekv.kernels.fp8.reference import fp8_gemm_ref

logger = logging.getLogger(__name__)

# NOTE: fewer rows than this are zero-padded to it: the smallest product the kernel was checked right at
# (an 8-row probe was wrong, but with 3 k-blocks, the fault KBLOCK_MULTIPLE names). Padded, 128 decode rows
# of Llama-3.1-8B's qkv / gate_up / down took 20.6 / 64.0 / 45.8 us against the Triton block GEMM's
# 22.9 / 86.0 / 47.9 (H100): its cost is flat below 256 rows
MIN_ROWS = 256
# NOTE: k-blocks must come in fours. cuBLASLt reads the weight scales [N/128, K/128] with K/128 as their
# leading dimension, which it needs 16-byte aligned: with 3 or 5 k-blocks the product was 0.3-1.1 (rel. L2)
# off the twin (H100 / H200, torch 2.11), with 4, 8 and 32 right. Real models' K (4,096, 5,120, 14,336 ...)
# are whole multiples of 512.
KBLOCK_MULTIPLE = 4
BLOCK = 128


def block_scaled_mm_fits(n: int, k: int) -> bool:
    """Whether :func:`fp8_block_scaled_mm` takes a product with an ``n x k`` weight: N whole 128-blocks, K
    whole :data:`KBLOCK_MULTIPLE`s of them."""
    return n % BLOCK == 0 and k % (BLOCK * KBLOCK_MULTIPLE) == 0


def fp8_block_scaled_mm(
    xq: torch.Tensor, x_scale: torch.Tensor, wq: torch.Tensor, w_scale: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    """:func:`fp8_block_gemm`'s product for 128 blocks on cuBLASLt's block-scaled kernel (``torch._scaled_mm``
    with 1x128 activation and 128x128 weight scales; CUDA sm_90, no bias). cuBLASLt wants the activation
    scales outer-dim-major and M a multiple of 4, and runs at least :data:`MIN_ROWS` rows here: all arranged
    (padding rows are zeros with scale 1, dropped after). K/128 a multiple of :data:`KBLOCK_MULTIPLE`."""
    m, k = xq.shape
    if not block_scaled_mm_fits(wq.shape[0], k):
        raise ValueError(f"fp8_block_scaled_mm needs N in whole 128-blocks and K in whole {KBLOCK_MULTIPLE}s "
                         f"of 128-blocks, got K={k}, N={wq.shape[0]}")  # fmt: skip
    rows = max(MIN_ROWS, m + -m % 4)
    if rows > m:  # NOTE: a copy into a padded buffer (torch.cat of float8 is not in every CUDA build)
        xp = xq.new_zeros((rows, k))
        xp[:m] = xq
        xq = xp
    # NOTE: [M, K/128] scales stored K-block-major (stride (1, M))
    xs = torch.ones((x_scale.shape[1], rows), dtype=torch.float32, device=xq.device).t()
    xs[:m] = x_scale
    y = torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=w_scale.t(), out_dtype=out_dtype)
    return y[:m] if rows > m else y


# device -> why fp8_block_scaled_mm cannot serve there ("" where it can), once checked
_BLOCK_SCALED_MM: dict[torch.device, str] = {}


def block_scaled_mm_unavailable(device: torch.device) -> str:
    """Why :func:`fp8_block_scaled_mm` cannot serve on ``device`` ("" where it can): it needs sm_90 and a
    torch whose ``_scaled_mm`` takes block scales (cuBLAS >= 12.9); one product (301 rows, padded to a
    multiple of 4; 8 k-blocks) is checked against the twin and the answer kept per device. Not
    checked while a CUDA graph is being captured (the check synchronizes): the Triton GEMM serves until it
    is known."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device) != (9, 0):
        return "needs CUDA sm_90"
    if device not in _BLOCK_SCALED_MM:
        if torch.cuda.is_current_stream_capturing():
            return "not checked during CUDA-graph capture"
        gen = torch.Generator(device).manual_seed(0)
        x = torch.randn(301, 1024, device=device, generator=gen)
        w = torch.randn(384, 1024, device=device, generator=gen)
        xq, xs = quantize_act_groups(x, 128)
        wq = (w * 16).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        ws = torch.rand(3, 8, device=device, generator=gen) + 0.5
        try:
            got = fp8_block_scaled_mm(xq, xs, wq, ws, torch.bfloat16).float()
        except (RuntimeError, ValueError, TypeError) as e:  # a torch or cuBLAS without block scaling
            why = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}" if str(e) else type(e).__name__
        else:
            want = fp8_gemm_ref(xq, xs, wq, ws, 128, torch.float32)
            err = ((got - want).norm() / want.norm()).item()
            why = "" if err < 1e-2 else f"{err:.3g} (rel. L2) off the reference"
        if why:
            logger.info("torch._scaled_mm has no block-scaled FP8 GEMM here (%s): prefill chunks of "
                        "block-scaled layers run the Triton block GEMM", why)  # fmt: skip
        _BLOCK_SCALED_MM[device] = why
    return _BLOCK_SCALED_MM[device]


def block_scaled_mm_available(device: torch.device) -> bool:
    """Whether :func:`fp8_block_scaled_mm` serves on ``device`` (:func:`block_scaled_mm_unavailable`)."""
    return not block_scaled_mm_unavailable(device)
