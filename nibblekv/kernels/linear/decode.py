"""Gated DeltaNet decode kernels: one token per request, each request's states updated in place in the state
pool (the twins in :mod:`nibblekv.kernels.linear.reference` are the definition).

NOTE: in place is the point. Gathering a request's recurrent state out of the pool, running a kernel that
writes a new state, and scattering it back moves the state six times a step (Qwen3.5-27B: 3 MiB per layer
and request, as much as 32K tokens of its fp8 KV over all layers); these kernels read and write it once.
Each program owns one (request, value head, V block) tile, so reads and writes never race -- except the
CUDA-graph padding rows, which all use the pool's scratch slot and write garbage there.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nibblekv.kernels.linear.reference import L2NORM_EPS

# NOTE: the state tile of one program is [K, BV] float32 (K = 128: 32 values a thread at 4 warps); the
# grid is requests x value heads x V / BV (Qwen3.5-27B: 48 x 4 = 192 programs a request). Untimed.
BLOCK_V: int = 32
NUM_WARPS: int = 4
SOFTPLUS_LINEAR: float = 20.0  # torch's softplus threshold: x past it is returned as is
STATE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # the recurrent state's (--mamba-ssm-dtype)


@triton.jit
def _gdr_decode_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, state_ptr, slot_ptr, o_ptr,
    stride_q, stride_k, stride_v, stride_a, stride_b, stride_state,
    scale, eps, sp_linear,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):  # fmt: skip
    """Program (request n * HV + value head, V block): one step of the rule on the state tile [K, BV]."""
    pid = tl.program_id(0)
    n, hv = pid // HV, pid % HV
    h = hv // (HV // H)
    offs_k = tl.arange(0, BK)
    offs_v = tl.program_id(1) * BV + tl.arange(0, BV)
    mk, mv = offs_k < K, offs_v < V
    q = tl.load(q_ptr + n * stride_q + h * K + offs_k, mask=mk, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + n * stride_k + h * K + offs_k, mask=mk, other=0.0).to(tl.float32)
    q = q / tl.sqrt(tl.sum(q * q) + eps) * scale
    k = k / tl.sqrt(tl.sum(k * k) + eps)
    v = tl.load(v_ptr + n * stride_v + hv * V + offs_v, mask=mv, other=0.0).to(tl.float32)
    x = tl.load(a_ptr + n * stride_a + hv).to(tl.float32) + tl.load(dtb_ptr + hv).to(tl.float32)
    softplus = tl.where(x > sp_linear, x, tl.log(1.0 + tl.exp(tl.minimum(x, sp_linear))))
    g = -tl.exp(tl.load(alog_ptr + hv).to(tl.float32)) * softplus
    beta = tl.sigmoid(tl.load(b_ptr + n * stride_b + hv).to(tl.float32))
    slot = tl.load(slot_ptr + n).to(tl.int64)
    p_s = state_ptr + slot * stride_state + hv * (K * V) + offs_k[:, None] * V + offs_v[None, :]
    ms = mk[:, None] & mv[None, :]
    s = tl.load(p_s, mask=ms, other=0.0).to(tl.float32) * tl.exp(g)
    delta = (v - tl.sum(s * k[:, None], axis=0)) * beta  # [BV]
    s = s + k[:, None] * delta[None, :]
    o = tl.sum(s * q[:, None], axis=0)
    tl.store(p_s, s.to(state_ptr.dtype.element_ty), mask=ms)
    tl.store(o_ptr + (n * HV + hv) * V + offs_v, o.to(o_ptr.dtype.element_ty), mask=mv)


def gated_delta_rule_decode_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
    A_log: torch.Tensor, dt_bias: torch.Tensor, state: torch.Tensor, slots: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """:func:`~nibblekv.kernels.linear.reference.gated_delta_rule_decode_ref` on the GPU (same arguments)."""
    n, hv, dv = v.shape
    h, dk = q.shape[1:]
    if k.shape != q.shape or hv % h or a.shape != (n, hv) or b.shape != (n, hv) or q.shape[0] != n:
        raise ValueError(
            f"q/k {tuple(q.shape)}/{tuple(k.shape)}, v {tuple(v.shape)}, a/b {tuple(a.shape)}/"
            f"{tuple(b.shape)}: want q, k [N, H, K], v [N, HV, V] (HV a multiple of H), a, b [N, HV]"
        )
    if state.dtype not in STATE_DTYPES or state.shape[1:] != (hv, dk, dv) or not state[0].is_contiguous():
        raise ValueError(
            f"state {tuple(state.shape)} {state.dtype}: want [S, {hv}, {dk}, {dv}] in float32, bfloat16 or "
            "float16, rows dense"
        )
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(2) != 1 or t.stride(1) != t.shape[2]:
            raise ValueError(f"{name}: each request's heads must be dense (strides {t.stride()})")
    if a.stride(1) != 1 or b.stride(1) != 1 or slots.shape != (n,):
        raise ValueError("a, b need dense rows and slots one entry per request")
    o = torch.full((n, hv, dv), float("nan"), dtype=v.dtype, device=v.device)
    if n == 0:
        return o
    grid = (n * hv, triton.cdiv(dv, BLOCK_V))
    _gdr_decode_kernel[grid](
        q, k, v, a, b, A_log, dt_bias, state, slots, o,
        q.stride(0), k.stride(0), v.stride(0), a.stride(0), b.stride(0), state.stride(0),
        dk**-0.5, L2NORM_EPS, SOFTPLUS_LINEAR,
        H=h, HV=hv, K=dk, V=dv, BK=triton.next_power_of_2(dk), BV=BLOCK_V, num_warps=NUM_WARPS,
    )  # fmt: skip
    return o


@triton.jit
def _conv_decode_kernel(
    x_ptr, w_ptr, conv_ptr, slot_ptr, y_ptr, stride_x, stride_w, stride_conv, C,  # y: dense [N, C]
    W: tl.constexpr, WP: tl.constexpr, BC: tl.constexpr,
):  # fmt: skip
    """Program (request, channel block): ``y = silu(sum_w [state | x] * weight)``; the state takes ``x``."""
    n = tl.program_id(0)
    offs_c = tl.program_id(1) * BC + tl.arange(0, BC)
    offs_w = tl.arange(0, WP)
    mc = offs_c < C
    slot = tl.load(slot_ptr + n).to(tl.int64)
    p_conv = conv_ptr + slot * stride_conv + offs_c[:, None] * (W - 1) + offs_w[None, :]
    past = tl.load(p_conv, mask=mc[:, None] & (offs_w[None, :] < W - 1), other=0.0).to(tl.float32)
    x = tl.load(x_ptr + n * stride_x + offs_c, mask=mc, other=0.0)
    full = tl.where(offs_w[None, :] == W - 1, x.to(tl.float32)[:, None], past)  # [BC, WP], oldest first
    mw = mc[:, None] & (offs_w[None, :] < W)
    w = tl.load(w_ptr + offs_c[:, None] * stride_w + offs_w[None, :], mask=mw, other=0.0).to(tl.float32)
    acc = tl.sum(full * w, axis=1)
    y = acc / (1.0 + tl.exp(-acc))
    tl.store(y_ptr + n * C + offs_c, y.to(y_ptr.dtype.element_ty), mask=mc)
    # the last W-1 inputs: full[:, 1:] lands at state positions 0..W-2
    keep = mc[:, None] & (offs_w[None, :] >= 1) & (offs_w[None, :] < W)
    tl.store(p_conv - 1, full.to(conv_ptr.dtype.element_ty), mask=keep)


CONV_BLOCK: int = 256


def conv_decode_triton(
    x: torch.Tensor, weight: torch.Tensor, conv: torch.Tensor, slots: torch.Tensor
) -> torch.Tensor:
    """:func:`~nibblekv.kernels.linear.reference.conv_decode_ref` on the GPU (same arguments)."""
    n, c = x.shape
    width = weight.shape[1]
    if weight.shape != (c, width) or weight.stride(1) != 1 or x.stride(1) != 1:
        raise ValueError(
            f"x {tuple(x.shape)}, weight {tuple(weight.shape)}: want x [N, C], weight [C, W], dense rows"
        )
    if conv.shape[1:] != (c, width - 1) or not conv[0].is_contiguous() or slots.shape != (n,):
        raise ValueError(f"conv {tuple(conv.shape)}: want [S, {c}, {width - 1}] with dense rows, slots [N]")
    y = torch.full((n, c), float("nan"), dtype=x.dtype, device=x.device)
    if n == 0:
        return y
    grid = (n, triton.cdiv(c, CONV_BLOCK))
    _conv_decode_kernel[grid](
        x, weight, conv, slots, y, x.stride(0), weight.stride(0), conv.stride(0), c,
        W=width, WP=triton.next_power_of_2(width), BC=CONV_BLOCK, num_warps=4,
    )  # fmt: skip
    return y
