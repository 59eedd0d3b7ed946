"""Pure-torch twins of the linear-attention decode kernels (:mod:`nibblekv.kernels.linear.decode`), and the
gated delta rule itself: the definitions the kernels and the model's chunked form are tested against.

A Gated DeltaNet value head keeps a float32 state ``S [K, V]``; per token, with ``q, k`` L2-normalised and
``q`` scaled by ``K ** -0.5``::

    S = exp(g_t) * S
    S = S + k_t (beta_t * (v_t - S^T k_t))^T
    o_t = S^T q_t

where ``g = -exp(A_log) * softplus(a + dt_bias)`` and ``beta = sigmoid(b)`` come from the layer's
projections ``a, b``. Decode ops update a state pool's rows in place: row ``slots[i]`` is request ``i``'s.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

L2NORM_EPS: float = 1e-6  # fla's and HF's l2norm


def l2norm(x: torch.Tensor, eps: float = L2NORM_EPS) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dim."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def normalized_qk(q: torch.Tensor, k: torch.Tensor, value_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``q, k [T, H, K]`` -> float32 ``[T, HV, K]``: L2-normalised, ``q`` scaled by ``K ** -0.5``, key head
    ``j // (HV / H)`` repeated for value head ``j`` (HF's reference does the same)."""
    ratio = value_heads // q.shape[1]
    qf, kf = (l2norm(x.float()).repeat_interleave(ratio, dim=1) for x in (q, k))
    return qf * q.shape[-1] ** -0.5, kf


def decay_and_beta(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Projections ``a, b [T, HV]`` -> float32 ``(g, beta)``: the log decay
    ``-exp(A_log) * softplus(a + dt_bias)`` (softplus linear past 20, as torch's) and ``sigmoid(b)``."""
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    return g, torch.sigmoid(b.float())


def recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule token by token. ``q, k [H, L, K]`` (normalised, q scaled), ``v [H, L, V]``,
    ``g, beta [H, L]``, ``state [H, K, V]``, all float32 -> ``(o [H, L, V], final state [H, K, V])``."""
    out = torch.empty_like(v)
    for t in range(q.shape[1]):
        state = state * g[:, t].exp()[:, None, None]
        kv_mem = (state * k[:, t, :, None]).sum(dim=-2)  # S^T k  [H, V]
        delta = (v[:, t] - kv_mem) * beta[:, t, None]
        state = state + k[:, t, :, None] * delta[:, None, :]
        out[:, t] = (state * q[:, t, :, None]).sum(dim=-2)
    return out, state


def conv_extend_ref(
    x: torch.Tensor, weight: torch.Tensor, cu_seqlens: list[int], state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv + SiLU, one sequence at a time: sequence ``i`` is ``x[cu_seqlens[i]:
    cu_seqlens[i+1]]`` (``x [T, C]``) after its last ``W - 1`` inputs ``state[i]`` (``[N, C, W-1]``; zeros
    for a fresh one); ``weight [C, W]`` -> ``(y [T, C], new state [N, C, W-1])``."""
    width = weight.shape[-1]
    y = torch.empty_like(x)
    new = torch.empty_like(state)
    for i, (s, e) in enumerate(zip(cu_seqlens[:-1], cu_seqlens[1:])):
        full = torch.cat([state[i].to(x.dtype), x[s:e].T], dim=-1)  # [C, W-1+L]
        out = F.conv1d(full[None].to(weight.dtype), weight[:, None, :], groups=weight.shape[0])[0]
        y[s:e] = F.silu(out).T.to(x.dtype)
        new[i] = full[:, full.shape[-1] - (width - 1) :]
    return y, new


def conv_decode_ref(
    x: torch.Tensor, weight: torch.Tensor, conv: torch.Tensor, slots: torch.Tensor
) -> torch.Tensor:
    """One token per request through the depthwise causal conv + SiLU. ``x [N, C]``, ``weight [C, W]``,
    ``conv [S, C, W-1]`` (each slot's last ``W-1`` inputs, updated in place at rows ``slots [N]``) ->
    ``y [N, C]`` in ``x``'s dtype (float32 sums)."""
    full = torch.cat([conv.index_select(0, slots).float(), x.float()[:, :, None]], dim=-1)  # [N, C, W]
    y = F.silu((full * weight.float()).sum(-1)).to(x.dtype)
    conv.index_copy_(0, slots, full[..., 1:].to(conv.dtype))
    return y


def gated_delta_rule_decode_ref(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
    A_log: torch.Tensor, dt_bias: torch.Tensor, state: torch.Tensor, slots: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """One token per request. ``q, k [N, H, K]`` (before the L2 norm), ``v [N, HV, V]`` (value head ``j``
    reads key head ``j // (HV / H)``), ``a, b [N, HV]``, ``A_log, dt_bias [HV]``; ``state [S, HV, K, V]``
    (float32, bfloat16 or float16; the step runs in float32), updated in place at rows ``slots [N]`` ->
    ``o [N, HV, V]`` in ``v``'s dtype."""
    n, hv, dv = v.shape
    dk = q.shape[-1]
    qf, kf = normalized_qk(q, k, hv)
    g, beta = decay_and_beta(a, b, A_log, dt_bias)
    o, new = recurrent_gated_delta_rule(
        qf.reshape(n * hv, 1, dk), kf.reshape(n * hv, 1, dk), v.float().reshape(n * hv, 1, dv),
        g.reshape(n * hv, 1), beta.reshape(n * hv, 1),
        state.index_select(0, slots).float().reshape(n * hv, dk, dv),
    )  # fmt: skip
    state.index_copy_(0, slots, new.reshape(n, hv, dk, dv).to(state.dtype))
    return o.reshape(n, hv, dv).to(v.dtype)
