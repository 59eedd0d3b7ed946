"""Pure-torch twins of :mod:`nibblekv.kernels.fp8.gemm`: the FP8 linear layer's numerical reference.

Every product is of the exact fp8 values times their FP32 scales, summed in float32, so the GPU kernels
(which do the same sums in another order on FP8 tensor cores) agree to float32 rounding.
"""

from __future__ import annotations

import torch

from nibblekv.formats.fp8_weights import dequantize_act_groups, dequantize_weight, quantize_act_groups


def fp8_gemm_ref(
    xq: torch.Tensor,
    x_scale: torch.Tensor,
    wq: torch.Tensor,
    w_scale: torch.Tensor,
    block: int | None,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``(xq * x_scale) @ (wq * w_scale)^T (+ bias)`` in float32, cast to ``out_dtype``.

    ``xq [M, K]`` with ``x_scale [M, 1]`` (per token, ``block=None``) or ``[M, ceil(K/B)]`` (per group of
    ``B = block`` columns); ``wq [N, K]`` with ``w_scale [N]`` or ``[ceil(N/B), ceil(K/B)]``.
    """
    group = xq.shape[1] if block is None else block
    x = dequantize_act_groups(xq, x_scale, group)
    y = x @ dequantize_weight(wq, w_scale, block).t()
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype)


def fp8_linear_ref(
    x: torch.Tensor, wq: torch.Tensor, w_scale: torch.Tensor, block: int | None, bias: torch.Tensor | None
) -> torch.Tensor:
    """The FP8 linear layer on ``x [..., K]``: quantize the activations dynamically (per token, or per
    token-group of ``block``), then :func:`fp8_gemm_ref`; output in ``x``'s dtype."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    xq, xs = quantize_act_groups(x2, x2.shape[1] if block is None else block)
    y = fp8_gemm_ref(xq, xs, wq, w_scale, block, x.dtype, bias)
    return y.reshape(*lead, wq.shape[0])
