"""RoPE on q and k in one kernel, optionally followed by the KV cache's Hadamard rotation of q, k and v.

Same rounding contract as :mod:`nibblekv.kernels.fused.elementwise` (twin: ``reference.rope_qk_ref``):
RoPE is bit-exact in every dtype (``enable_fp_fusion=False``: float32 ``x * cos + r * sin`` never becomes
an FMA); the rotation multiplies the rounded RoPE output, as the eager ``q @ rotation`` does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nibblekv.kernels._common import interpreting
from nibblekv.kernels.fused.elementwise import _bf16_bits, _check_rows, _round


@triton.jit
def _rope_pair(a, b, c, s, like_ptr, BF16_BITS: tl.constexpr):
    """``round(round(a * c) + round(b * s))``: one half of ``x * cos + rotate_half(x) * sin``."""
    ac = _round(a * c, like_ptr, BF16_BITS).to(tl.float32)
    bs = _round(b * s, like_ptr, BF16_BITS).to(tl.float32)
    return _round(ac + bs, like_ptr, BF16_BITS)


@triton.jit
def _rope_qkv_kernel(
    qkv_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr,
    stride_qkv, stride_cos, stride_sin,
    HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
    HALF_BLOCK: tl.constexpr, BH: tl.constexpr, BF16_BITS: tl.constexpr,
):  # fmt: skip
    """``BH`` heads of one token: q and k heads rotated into ``q_ptr`` / ``k_ptr``, v heads copied to
    ``v_ptr``.

    Head ``h`` of the ``[q | k | v]`` row is a q head for ``h < HQ``, a k head below ``HQ + HKV``, else v.
    """
    HALF: tl.constexpr = D // 2
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BH + tl.arange(0, BH)
    cols = tl.arange(0, HALF_BLOCK)
    cmask = cols < HALF
    is_q = heads < HQ
    is_k = (heads >= HQ) & (heads < HQ + HKV)
    is_v = (heads >= HQ + HKV) & (heads < HQ + 2 * HKV)
    m = (is_q | is_k | is_v)[:, None] & cmask[None, :]
    src = qkv_ptr + t * stride_qkv + heads[:, None] * D + cols[None, :]
    x1 = tl.load(src, mask=m, other=0.0)
    x2 = tl.load(src + HALF, mask=m, other=0.0)
    c1 = tl.load(cos_ptr + t * stride_cos + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    c2 = tl.load(cos_ptr + t * stride_cos + HALF + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    s1 = tl.load(sin_ptr + t * stride_sin + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    s2 = tl.load(sin_ptr + t * stride_sin + HALF + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    a, b = x1.to(tl.float32), x2.to(tl.float32)
    # x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2 | x1]
    o1 = _rope_pair(a, -b, c1, s1, qkv_ptr, BF16_BITS)
    o2 = _rope_pair(b, a, c2, s2, qkv_ptr, BF16_BITS)
    rows = tl.where(is_q, t * HQ + heads, tl.where(is_k, t * HKV + heads - HQ, t * HKV + heads - HQ - HKV))
    dst = tl.where(m, rows[:, None] * D + cols[None, :], 0)
    qm, km, vm = (
        is_q[:, None] & cmask[None, :],
        is_k[:, None] & cmask[None, :],
        is_v[:, None] & cmask[None, :],
    )
    tl.store(q_ptr + dst, o1, mask=qm)
    tl.store(q_ptr + dst + HALF, o2, mask=qm)
    tl.store(k_ptr + dst, o1, mask=km)
    tl.store(k_ptr + dst + HALF, o2, mask=km)
    tl.store(v_ptr + dst, x1, mask=vm)
    tl.store(v_ptr + dst + HALF, x2, mask=vm)


@triton.jit
def _rope_qkv_rot_kernel(
    qkv_ptr, cos_ptr, sin_ptr, rot_ptr, q_ptr, k_ptr, v_ptr,
    stride_qkv, stride_cos, stride_sin,
    HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BH: tl.constexpr, BF16_BITS: tl.constexpr,
    IEEE: tl.constexpr, BC: tl.constexpr,
):  # fmt: skip
    """:func:`_rope_qkv_kernel`, then every row (q and k after RoPE, v as is) times ``rot [D, D]``.

    ``rows @ rot`` = ``first_half @ rot[:D/2] + second_half @ rot[D/2:]``: two ``tl.dot`` over ``BH >= 16``
    head rows of the rounded RoPE output (as the eager ``q @ rot`` sees it), float32 accumulation. Output
    columns ``[BC * pid2, BC * (pid2 + 1))`` (each program loads only that slice of ``rot``).
    """
    HALF: tl.constexpr = D // 2
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BH + tl.arange(0, BH)
    ocols = tl.program_id(2) * BC + tl.arange(0, BC)
    cols = tl.arange(0, HALF)
    is_q = heads < HQ
    is_k = (heads >= HQ) & (heads < HQ + HKV)
    is_v = (heads >= HQ + HKV) & (heads < HQ + 2 * HKV)
    m = (is_q | is_k | is_v)[:, None]
    src = qkv_ptr + t * stride_qkv + heads[:, None] * D + cols[None, :]
    x1 = tl.load(src, mask=m, other=0.0)
    x2 = tl.load(src + HALF, mask=m, other=0.0)
    c1 = tl.load(cos_ptr + t * stride_cos + cols).to(tl.float32)[None, :]
    c2 = tl.load(cos_ptr + t * stride_cos + HALF + cols).to(tl.float32)[None, :]
    s1 = tl.load(sin_ptr + t * stride_sin + cols).to(tl.float32)[None, :]
    s2 = tl.load(sin_ptr + t * stride_sin + HALF + cols).to(tl.float32)[None, :]
    a, b = x1.to(tl.float32), x2.to(tl.float32)
    qk = (is_q | is_k)[:, None]
    y1 = tl.where(qk, _rope_pair(a, -b, c1, s1, qkv_ptr, BF16_BITS).to(tl.float32), a)
    y2 = tl.where(qk, _rope_pair(b, a, c2, s2, qkv_ptr, BF16_BITS).to(tl.float32), b)
    rr = tl.arange(0, HALF)[:, None] * D + ocols[None, :]
    r1 = tl.load(rot_ptr + rr)
    r2 = tl.load(rot_ptr + HALF * D + rr)
    if IEEE:  # float32 activations (and the interpreter, whose bf16 dot is unreliable): exact fp32 products
        acc = tl.dot(y1, r1.to(tl.float32), input_precision="ieee")
        acc = tl.dot(y2, r2.to(tl.float32), acc, input_precision="ieee")
    else:  # y1, y2 hold bf16/fp16 values exactly: the dot sees what the eager matmul sees
        acc = tl.dot(y1.to(r1.dtype), r1)
        acc = tl.dot(y2.to(r2.dtype), r2, acc)
    out = _round(acc, qkv_ptr, BF16_BITS)
    rows = tl.where(is_q, t * HQ + heads, tl.where(is_k, t * HKV + heads - HQ, t * HKV + heads - HQ - HKV))
    dst = tl.where(m, rows[:, None] * D + ocols[None, :], 0)
    tl.store(q_ptr + dst, out, mask=is_q[:, None])
    tl.store(k_ptr + dst, out, mask=is_k[:, None])
    tl.store(v_ptr + dst, out, mask=is_v[:, None])


def rope_qk(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    rotation: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split the fused qkv projection and apply NeoX (rotate-half) RoPE to q and k, in one kernel.

    ``rotation [D, D]`` (optional, ``qkv``'s dtype, contiguous; ``D`` a power of two >= 32): q, k (after
    RoPE) and v come back multiplied by it on the right (the KV cache's Hadamard rotation), as the eager
    ``q @ rotation`` computes them up to float32 summation order -- in the same kernel below
    ``_ROT_FUSED_MAX_TOKENS`` tokens (``_ROT_FUSED_MAX_TOKENS_GRAPH`` while a CUDA graph is captured), else
    by one GEMM after it (q, k, v are then views of one buffer).

    ``qkv [T, (Hq + 2 Hkv) * D]``: rows ``[q | k | v]``, unit last stride (any row stride);
    ``cos, sin [T, 1, D]`` as ``RotaryEmbedding.cos_sin`` returns them, in ``qkv``'s dtype.
    Returns new contiguous ``q [T, Hq, D]``, ``k [T, Hkv, D]`` (rotated, bit-exact with
    ``apply_rope``) and ``v [T, Hkv, D]`` (a copy, as ``v.contiguous()``), all in ``qkv``'s dtype.
    """
    _check_rows(qkv, "qkv")
    t = qkv.shape[0]
    if head_dim <= 0 or head_dim % 2 or num_heads <= 0 or num_kv_heads <= 0:
        raise ValueError(
            f"need positive heads and an even head_dim, got {num_heads}/{num_kv_heads}, {head_dim}"
        )
    nh = num_heads + 2 * num_kv_heads
    if qkv.shape[1] != nh * head_dim:
        raise ValueError(
            f"qkv has {qkv.shape[1]} columns, ({num_heads} + 2 * {num_kv_heads}) * {head_dim} expected"
        )
    for c, name in ((cos, "cos"), (sin, "sin")):
        if c.shape != (t, 1, head_dim) or c.stride(-1) != 1:
            raise ValueError(
                f"{name} must be [{t}, 1, {head_dim}] with unit last stride, got {tuple(c.shape)}"
            )
        if c.dtype != qkv.dtype or c.device != qkv.device:
            raise ValueError(
                f"{name} must be {qkv.dtype} on {qkv.device} like qkv, got {c.dtype} on {c.device}"
            )
    if rotation is not None and _rotation_by_gemm(t, qkv):  # the plain kernel, then one GEMM
        _check_rotation(rotation, qkv, head_dim)
        # NOTE: q | k | v back to back in one buffer: one GEMM rotates all three (a launch per output cost
        # more host time than the GPU saved)
        buf = torch.empty(t * nh * head_dim, dtype=qkv.dtype, device=qkv.device)
        _launch_plain(qkv, cos, sin, *_split_qkv(buf, t, num_heads, num_kv_heads, head_dim), num_heads,
                      num_kv_heads, head_dim)  # fmt: skip
        out = torch.mm(buf.view(-1, head_dim), rotation)
        return _split_qkv(out.view(-1), t, num_heads, num_kv_heads, head_dim)
    q = torch.empty((t, num_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    k = torch.empty((t, num_kv_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    v = torch.empty((t, num_kv_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    if t == 0:
        return q, k, v
    if rotation is not None:
        _launch_rotated(qkv, cos, sin, rotation, q, k, v, num_heads, num_kv_heads, head_dim)
        return q, k, v
    _launch_plain(qkv, cos, sin, q, k, v, num_heads, num_kv_heads, head_dim)
    return q, k, v


def _split_qkv(
    buf: torch.Tensor, t: int, num_heads: int, num_kv_heads: int, head_dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A flat buffer of ``t * (Hq + 2 Hkv) * D`` values -> contiguous q, k, v views of it, back to back."""
    nq, nk = t * num_heads * head_dim, t * num_kv_heads * head_dim
    return (
        buf[:nq].view(t, num_heads, head_dim),
        buf[nq : nq + nk].view(t, num_kv_heads, head_dim),
        buf[nq + nk : nq + 2 * nk].view(t, num_kv_heads, head_dim),
    )


def _launch_plain(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
) -> None:  # fmt: skip
    t, nh = qkv.shape[0], num_heads + 2 * num_kv_heads
    half_block = triton.next_power_of_2(head_dim // 2)
    bh = max(1, min(triton.next_power_of_2(nh), 512 // half_block))
    # NOTE: enable_fp_fusion=False: float32 x * cos + r * sin must not contract to an FMA (eager rounds
    # both products); the interpreter ignores the option.
    _rope_qkv_kernel[(t, triton.cdiv(nh, bh))](
        qkv, cos, sin, q, k, v,
        qkv.stride(0), cos.stride(0), sin.stride(0),
        HQ=num_heads, HKV=num_kv_heads, D=head_dim, HALF_BLOCK=half_block, BH=bh,
        BF16_BITS=_bf16_bits(qkv.dtype), num_warps=4, enable_fp_fusion=False,
    )  # fmt: skip


_ROT_SPLIT_TOKENS = 64  # below this many tokens the fused rotated kernel splits output columns (see NOTE)
# NOTE: from this many tokens on (prefill chunks; decode batches in CUDA graphs stay below it) the rotation is
# a GEMM after the plain RoPE kernel: the fused kernel (one token's 16 head rows a program, each loading all
# of rot) took 76 us a layer at a 1.4K-token prefill vs 22 for the plain kernel (8B, H200: ~4% of
# nvfp4's TTFT); 64-row blocks spanning tokens were slower still (140 us). Eager, below 512 tokens the
# GEMM path's second launch costs more host time than the GPU saves: back-to-back wall 137-150 us vs
# 59-74 fused at 128-512 tokens.
_ROT_FUSED_MAX_TOKENS = 512
# NOTE: inside a CUDA graph (decode batches) only GPU time counts: GEMM path vs fused, graph-replay us at
# 8 / 32 / 64 / 128 / 256 / 512 tokens: 3.97 / 4.36 / 4.93 / 6.09 / 8.45 / 13.54 vs 2.50 / 3.90 / 6.53 / 9.71
# / 17.83 / 30.70 (8B shapes, H200): the GEMM wins from 64 tokens.
_ROT_FUSED_MAX_TOKENS_GRAPH = 64


def _capturing(x: torch.Tensor) -> bool:
    """Whether ``x``'s device is capturing a CUDA graph now (decode steps: one capture per batch size)."""
    return x.is_cuda and torch.cuda.is_current_stream_capturing()


def _rotation_by_gemm(t: int, qkv: torch.Tensor) -> bool:
    """Whether ``t`` tokens take the rotation as a GEMM after the plain kernel (else the fused kernel)."""
    return t >= (_ROT_FUSED_MAX_TOKENS_GRAPH if _capturing(qkv) else _ROT_FUSED_MAX_TOKENS)


def _check_rotation(rotation: torch.Tensor, qkv: torch.Tensor, d: int) -> None:
    if d < 32 or d & (d - 1):
        raise ValueError(f"rope_qk: a rotation needs a power-of-two head_dim >= 32, got {d}")
    if rotation.shape != (d, d) or not rotation.is_contiguous():
        raise ValueError(f"rotation must be a contiguous [{d}, {d}] matrix, got {tuple(rotation.shape)}")
    if rotation.dtype != qkv.dtype or rotation.device != qkv.device:
        raise ValueError(f"rotation must be {qkv.dtype} on {qkv.device} like qkv, got {rotation.dtype}")


def _launch_rotated(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rotation: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
) -> None:
    d = head_dim
    _check_rotation(rotation, qkv, d)
    nh = num_heads + 2 * num_kv_heads
    bh = 16  # tl.dot's smallest M
    # NOTE: few tokens (decode) -> split the output columns over programs: at batch 1 the kernel was ~3
    # programs each loading all of rot (32 KB at D=128) and running the full dot, 4.0 us a layer vs 1.6
    # for the plain RoPE kernel (H200); more tokens -> whole rows, rot loaded once a program
    bc = d if qkv.shape[0] >= _ROT_SPLIT_TOKENS else 32
    _rope_qkv_rot_kernel[(qkv.shape[0], triton.cdiv(nh, bh), d // bc)](
        qkv, cos, sin, rotation, q, k, v,
        qkv.stride(0), cos.stride(0), sin.stride(0),
        HQ=num_heads, HKV=num_kv_heads, D=d, BH=bh, BF16_BITS=_bf16_bits(qkv.dtype),
        IEEE=qkv.dtype == torch.float32 or interpreting(), BC=bc, num_warps=4, enable_fp_fusion=False,
    )  # fmt: skip


__all__ = ["rope_qk"]
