"""Gated DeltaNet: the linear-attention layers of hybrid models (Qwen3-Next, Qwen3.5).

Per value head the layer keeps a state ``S [key_head_dim, value_head_dim]`` (float32) and, per token,
decays and corrects it (the gated delta rule), with ``q, k`` L2-normalised and ``q`` scaled by
``key_head_dim ** -0.5``::

    S = exp(g_t) * S
    S = S + k_t (beta_t * (v_t - S^T k_t))^T
    o_t = S^T q_t

Prefill and extend run the chunked form behind :class:`GatedDeltaRule`: :class:`TorchGatedDeltaRule`, the
readable twin (equal to the recurrent form, ``kernels.linear.reference``), and :class:`FlaGatedDeltaRule`,
fla-core's chunked Triton kernel on CUDA (``fla`` is imported lazily, on CUDA only, so CPU installs never
need it). Decode (one token a request) runs ``kernels.linear``'s conv and rule kernels, which update the
engine's state pool in place.
"""

from __future__ import annotations

import functools
import itertools
import logging
from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F

from nibblekv.kernels.linear.reference import normalized_qk

logger = logging.getLogger("nibblekv")

CHUNK_SIZE: int = 64  # fla's chunk length; the twin uses the same


def chunked_gated_delta_rule(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor,
    chunk: int = CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``kernels.linear.reference.recurrent_gated_delta_rule`` a chunk at a time (same arguments and result,
    up to rounding).

    Within a chunk the delta-rule corrections form a unit lower-triangular system (the WY form): solving
    it gives each token's corrected value ``u`` and the state's contribution ``w``; the chunk's outputs
    are then the decayed state read plus causal intra-chunk attention, and the state advances once.
    """
    h, length = k.shape[:2]
    pad = (-length) % chunk
    if pad:  # padded tokens have k = 0, beta = 0, g = 0: they leave the state unchanged
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    n = (length + pad) // chunk
    q, k, v = (x.reshape(h, n, chunk, x.shape[-1]) for x in (q, k, v))
    g, beta = g.reshape(h, n, chunk), beta.reshape(h, n, chunk)
    cum = g.cumsum(dim=-1)  # log decay from the chunk start, inclusive
    upper = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(upper, float("-inf")).exp()  # [h, n, C, C]
    k_beta = k * beta[..., None]
    system = (k_beta @ k.transpose(-1, -2)) * decay  # strictly lower part: the in-chunk corrections
    u = torch.linalg.solve_triangular(system, v * beta[..., None], upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, k_beta * cum.exp()[..., None], upper=False, unitriangular=True)
    attn = (q @ k.transpose(-1, -2)) * decay  # causal, diagonal included
    q_decayed = q * cum.exp()[..., None]
    k_to_end = k * (cum[..., -1:] - cum).exp()[..., None]
    out = torch.empty_like(v)
    for i in range(n):
        v_new = u[:, i] - w[:, i] @ state
        out[:, i] = q_decayed[:, i] @ state + attn[:, i] @ v_new
        state = state * cum[:, i, -1].exp()[:, None, None] + k_to_end[:, i].transpose(-1, -2) @ v_new
    return out.reshape(h, n * chunk, -1)[:, :length], state


class GatedDeltaRule(ABC):
    """The rule over a flattened batch of sequences (prefill / extend chunks). Inputs as the layer produces
    them: ``q, k [T, H, K]`` (before L2 norm), ``v [T, HV, V]`` (``HV`` a multiple of ``H``: value head ``j``
    reads key head ``j // (HV/H)``), ``g [T, HV]`` float32 log decay, ``beta [T, HV]``; states
    ``[N, HV, K, V]`` float32. Outputs in ``v``'s dtype."""

    @abstractmethod
    def extend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
        cu_seqlens: list[int], initial_state: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """Sequence ``i`` is tokens ``[cu_seqlens[i], cu_seqlens[i+1])``: ``(o [T, HV, V], final [N, HV, K, V])``."""


def _heads_first(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """The layer's ``[L, heads, dim]`` inputs as float32 ``[HV, L, dim]`` (q, k as ``normalized_qk``)."""
    q, k = normalized_qk(q, k, v.shape[1])
    return (q.transpose(0, 1), k.transpose(0, 1), v.float().transpose(0, 1), g.float().T, beta.float().T)


class TorchGatedDeltaRule(GatedDeltaRule):
    """Pure torch: the chunked form, one sequence at a time."""

    def extend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
        cu_seqlens: list[int], initial_state: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        out = torch.empty_like(v)
        final = torch.empty_like(initial_state)
        for i, (s, e) in enumerate(itertools.pairwise(cu_seqlens)):
            o, final[i] = chunked_gated_delta_rule(*_heads_first(q[s:e], k[s:e], v[s:e], g[s:e], beta[s:e]),
                                                   initial_state[i].float())  # fmt: skip
            out[s:e] = o.transpose(0, 1).to(v.dtype)
        return out, final


@functools.lru_cache(maxsize=16)
def cu_seqlens_tensors(
    cu_seqlens: tuple[int, ...], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cu_seqlens`` as int64 tensors on ``device`` and on the CPU, made once per batch shape.

    NOTE: every linear layer of a forward reuses them: a list -> CUDA copy waits for the stream, and one per
    layer stalled the host once per linear layer of every prefill step."""
    cpu = torch.tensor(cu_seqlens, dtype=torch.long)
    return cpu.to(device), cpu


class FlaGatedDeltaRule(GatedDeltaRule):
    """fla-core's chunked Triton kernel ``chunk_gated_delta_rule`` (varlen)."""

    def __init__(self) -> None:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        self._chunk = chunk_gated_delta_rule

    def extend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
        cu_seqlens: list[int], initial_state: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        cu, cu_cpu = cu_seqlens_tensors(tuple(cu_seqlens), q.device)
        q, k, v = (x.contiguous() for x in (q, k, v))  # the kernels index dense [B, T, H, D] tensors
        o, final = self._chunk(
            q[None], k[None], v[None], g=g[None].float().contiguous(), beta=beta[None].to(v.dtype).contiguous(),
            initial_state=initial_state.float(), output_final_state=True, use_qk_l2norm_in_kernel=True,
            cu_seqlens=cu, cu_seqlens_cpu=cu_cpu,
        )  # fmt: skip
        return o[0], final


_TORCH_RULE = TorchGatedDeltaRule()
_FLA_RULE: list[GatedDeltaRule] = []


def gated_delta_rule_for(x: torch.Tensor) -> GatedDeltaRule:
    """fla-core's kernels for CUDA tensors (when installed), else the torch twin (warned once on CUDA)."""
    if not x.is_cuda:
        return _TORCH_RULE
    if not _FLA_RULE:
        try:
            _FLA_RULE.append(FlaGatedDeltaRule())
        except ImportError:
            logger.warning("fla-core is not installed: Gated DeltaNet layers run the slow torch twin on the GPU "
                           "(pip install 'nibblekv[hybrid]')")  # fmt: skip
            _FLA_RULE.append(_TORCH_RULE)
    return _FLA_RULE[0]


@functools.lru_cache(maxsize=16)
def _conv_rows(
    cu_seqlens: tuple[int, ...], width: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of the stacked conv input ``[state_0 | x_0 | state_1 | x_1 | ...]`` (each state ``width - 1``
    rows): (each token's row ``[T]``, each state's rows ``[N * (width - 1)]``, each new state's rows
    ``[N, width - 1]``: the last ``width - 1`` of its sequence's)."""
    p = width - 1
    cu = torch.tensor(cu_seqlens, dtype=torch.long)
    lens, n = cu.diff(), len(cu_seqlens) - 1
    before = (torch.arange(n) + 1) * p  # state rows up to and including sequence i's
    tok = torch.arange(cu_seqlens[-1]) + torch.repeat_interleave(before, lens)
    taps = torch.arange(p)
    state = (cu[:-1] + before - p)[:, None] + taps
    new = (cu[1:] + before - p)[:, None] + taps
    return tok.to(device), state.reshape(-1).to(device), new.to(device)


def causal_conv_extend(
    x: torch.Tensor, weight: torch.Tensor, cu_seqlens: list[int], state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv + SiLU per sequence. ``x [T, C]``, ``weight [C, W]``, ``state [N, C, W-1]``
    (the inputs before each sequence; zeros for a fresh one) -> ``(y [T, C], new state [N, C, W-1])``, as
    ``kernels.linear.reference.conv_extend_ref``.

    NOTE: one conv over every sequence stacked behind its state, whatever the batch's sequence count (a loop
    per sequence cost ~7 launches each in every linear layer: a prefill admitting 100 requests ran 33K)."""
    width, (t, c) = weight.shape[-1], x.shape
    tok, state_rows, new_rows = _conv_rows(tuple(cu_seqlens), width, x.device)
    full = x.new_empty(t + state.shape[0] * (width - 1), c)
    full[tok] = x
    full[state_rows] = state.to(x.dtype).transpose(1, 2).reshape(-1, c)
    # out[:, j] is the window of rows j .. j + W - 1: a token at row r reads out[:, r - (W - 1)]
    out = F.conv1d(full.T[None].to(weight.dtype), weight[:, None, :], groups=c)[0]
    y = F.silu(out[:, tok - (width - 1)]).T.to(x.dtype)
    return y, full[new_rows].transpose(1, 2).to(state.dtype).contiguous()
