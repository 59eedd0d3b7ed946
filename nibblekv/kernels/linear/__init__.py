"""Linear-attention (Gated DeltaNet) decode kernels over a state pool, updated in place: the causal conv
(``conv_decode``) and the gated delta rule (``gated_delta_rule_decode``). Triton for CUDA tensors, the
twins of ``reference`` for CPU tensors (``kernels.use_triton``)."""

from __future__ import annotations

import torch

from nibblekv.kernels import use_triton
from nibblekv.kernels.linear.reference import conv_decode_ref, gated_delta_rule_decode_ref


def conv_decode(
    x: torch.Tensor, weight: torch.Tensor, conv: torch.Tensor, slots: torch.Tensor
) -> torch.Tensor:
    """Depthwise causal conv + SiLU of one token a request: ``x [N, C]``, ``weight [C, W]``, the pool's
    ``conv [S, C, W-1]`` updated in place at rows ``slots [N]`` (int64) -> ``y [N, C]``
    (``conv_decode_ref``)."""
    if use_triton(x):
        from nibblekv.kernels.linear.decode import conv_decode_triton

        return conv_decode_triton(x, weight, conv, slots)
    return conv_decode_ref(x, weight, conv, slots)


def gated_delta_rule_decode(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
    A_log: torch.Tensor, dt_bias: torch.Tensor, state: torch.Tensor, slots: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """One step of the gated delta rule a request: ``q, k [N, H, K]``, ``v [N, HV, V]``, ``a, b [N, HV]``,
    ``A_log, dt_bias [HV]``, the pool's ``state [S, HV, K, V]`` (float32, bf16 or fp16; stepped in float32)
    updated in place at rows ``slots [N]`` (int64) -> ``o [N, HV, V]`` in ``v``'s dtype
    (``gated_delta_rule_decode_ref``)."""
    if use_triton(v):
        from nibblekv.kernels.linear.decode import gated_delta_rule_decode_triton

        return gated_delta_rule_decode_triton(q, k, v, a, b, A_log, dt_bias, state, slots)
    return gated_delta_rule_decode_ref(q, k, v, a, b, A_log, dt_bias, state, slots)


__all__ = ["conv_decode", "gated_delta_rule_decode"]
