"""Fused elementwise kernels for the model forward: add + RMSNorm, SiLU * mul, RoPE on q and k.

A decode step runs a handful of tiny torch kernels per op (RMSNorm alone is about 8, RoPE on q and k
about 12 per layer); each of these Triton kernels does one op in one launch, with the same roundings
as the eager code (the twins in :mod:`nibblekv.kernels.fused_ref` are the definition):

* every elementwise step is computed in float32 and rounded to the activation dtype where torch
  rounds (``a * b`` and ``a + b`` on bf16/fp16 tensors compute in float32 and round once);
* RoPE is bit-exact in every dtype (launched with ``enable_fp_fusion=False`` so that float32
  ``x * cos + r * sin`` never becomes an FMA); SiLU uses libdevice ``expf`` and an IEEE division on the
  GPU, like torch's CUDA kernel; RMSNorm sums in a different order than torch, so its float32
  statistics may differ in the last bits (then a bf16 output may differ by an ulp).

NOTE: the Triton interpreter rounds float32 -> bfloat16 by truncation; when interpreting, bf16
results are rounded to nearest-even with integer ops instead (``BF16_BITS``), so CPU tests see the
GPU's roundings.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from nibblekv.kernels._common import interpreting

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_MAX_BLOCK = 65536  # add_rms_norm: a whole row of H values is one tile


# ----------------------------------------------------------------------------- shared helpers


@triton.jit
def _bf16_rtne(x):
    """float32 -> bfloat16, round to nearest even with integer ops (NaN -> 0x7FC0, as torch)."""
    b = x.to(tl.uint32, bitcast=True)
    r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    r = tl.where((b & 0x7FFFFFFF) > 0x7F800000, 0x7FC0, r)  # NaN
    return r.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _round(x, like_ptr, BF16_BITS: tl.constexpr):
    """float32 ``x`` rounded to the element type of ``like_ptr`` (nearest even)."""
    if BF16_BITS:
        y = _bf16_rtne(x)
    else:
        y = x.to(like_ptr.dtype.element_ty)
    return y


def _bf16_bits(dtype: torch.dtype) -> bool:
    """Whether kernels must round to bf16 with integer ops (the interpreter truncates)."""
    return dtype == torch.bfloat16 and interpreting()


def _check_rows(t: torch.Tensor, name: str) -> None:
    if t.dim() != 2 or t.stride(-1) != 1:
        raise ValueError(f"{name} must be 2-D [T, width] with unit last stride, got shape {tuple(t.shape)}")
    if t.dtype not in _FLOATS:
        raise ValueError(f"{name} must be float32, bfloat16 or float16, got {t.dtype}")


def _warps(block: int) -> int:
    return 4 if block < 2048 else 8 if block < 8192 else 16


# ----------------------------------------------------------------------------- add + RMSNorm


@triton.jit
def _add_rms_norm_kernel(
    x_ptr, r_ptr, w_ptr, out_ptr, res_ptr,
    stride_x, stride_r, stride_out, stride_res,
    H, eps,
    HAS_RES: tl.constexpr, BLOCK: tl.constexpr, X_BITS: tl.constexpr, OUT_BITS: tl.constexpr,
):  # fmt: skip
    """One row: ``s = x + r`` (rounded to x's dtype, stored), ``out = round(round(s * rstd) * w)``."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    s = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        r = tl.load(r_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        s_rounded = _round(s + r, x_ptr, X_BITS)
        tl.store(res_ptr + row * stride_res + cols, s_rounded, mask=mask)
        s = s_rounded.to(tl.float32)
    var = tl.sum(s * s, axis=0) / H
    rstd = tl.math.rsqrt(var + eps)
    normed = _round(s * rstd, x_ptr, X_BITS).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, _round(normed * w, out_ptr, OUT_BITS), mask=mask)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused residual add and RMSNorm: ``(rms_norm(s) * weight, s)`` with ``s = x + residual``.

    ``x, residual [T, H]``: same dtype (float32 / bfloat16 / float16), unit last stride (any row
    stride); ``residual=None`` means ``s = x`` (returned as is, no copy). ``weight [H]`` contiguous.
    Returns new contiguous tensors: normed ``[T, H]`` in ``promote_types(weight.dtype, x.dtype)``
    and ``s [T, H]`` in ``x``'s dtype. Same roundings as :func:`~nibblekv.kernels.fused_ref.add_rms_norm_ref`.
    """
    _check_rows(x, "x")
    t, h = x.shape
    if residual is not None:
        _check_rows(residual, "residual")
        if residual.shape != x.shape or residual.dtype != x.dtype or residual.device != x.device:
            raise ValueError(
                f"residual must match x: got {tuple(residual.shape)} {residual.dtype} on {residual.device}, "
                f"x is {tuple(x.shape)} {x.dtype} on {x.device}"
            )
    if weight.shape != (h,) or not weight.is_contiguous() or weight.dtype not in _FLOATS:
        raise ValueError(
            f"weight must be a contiguous float [{h}] tensor, got {tuple(weight.shape)} {weight.dtype}"
        )
    if weight.device != x.device:
        raise ValueError(f"weight is on {weight.device}, x on {x.device}")
    block = triton.next_power_of_2(h)
    if block > _MAX_BLOCK:
        raise ValueError(f"hidden size {h} is too large for one program per row (max {_MAX_BLOCK})")
    out = torch.empty((t, h), dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    new_res = x if residual is None else torch.empty((t, h), dtype=x.dtype, device=x.device)
    if t == 0:
        return out, new_res
    r = x if residual is None else residual
    _add_rms_norm_kernel[(t,)](
        x, r, weight, out, new_res,
        x.stride(0), r.stride(0), out.stride(0), new_res.stride(0),
        h, float(eps),
        HAS_RES=residual is not None, BLOCK=block, X_BITS=_bf16_bits(x.dtype), OUT_BITS=_bf16_bits(out.dtype),
        num_warps=_warps(block),
    )  # fmt: skip
    return out, new_res


# ----------------------------------------------------------------------------- SiLU * mul


@triton.jit
def _exp(x, INTERP: tl.constexpr):
    """expf: libdevice's on the GPU (torch's CUDA SiLU calls the same ``expf``), numpy's when interpreting."""
    if INTERP:
        y = tl.exp(x)
    else:
        y = libdevice.exp(x)
    return y


@triton.jit
def _silu_and_mul_kernel(
    gu_ptr, out_ptr, stride_gu, stride_out, I,
    BLOCK: tl.constexpr, BF16_BITS: tl.constexpr, INTERP: tl.constexpr,
):  # fmt: skip
    """``BLOCK`` columns of one row: ``round(round(g / (1 + exp(-g))) * u)``."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < I
    src = gu_ptr + row * stride_gu + cols
    g = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(src + I, mask=mask, other=0.0).to(tl.float32)
    silu = _round(tl.math.div_rn(g, 1.0 + _exp(-g, INTERP)), out_ptr, BF16_BITS).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, _round(silu * u, out_ptr, BF16_BITS), mask=mask)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``gate_up [T, 2I]`` (columns ``[gate | up]``, unit last stride) -> ``silu(gate) * up`` ``[T, I]``.

    Float32 / bfloat16 / float16; the output is a new contiguous tensor in the input dtype, rounded as
    ``F.silu(gate) * up`` (see :func:`~nibblekv.kernels.fused_ref.silu_and_mul_ref`).
    """
    _check_rows(gate_up, "gate_up")
    t, two_i = gate_up.shape
    if two_i % 2:
        raise ValueError(f"gate_up must have an even number of columns [gate | up], got {two_i}")
    inter = two_i // 2
    out = torch.empty((t, inter), dtype=gate_up.dtype, device=gate_up.device)
    if t == 0 or inter == 0:
        return out
    block = min(triton.next_power_of_2(inter), 1024)
    _silu_and_mul_kernel[(t, triton.cdiv(inter, block))](
        gate_up, out, gate_up.stride(0), out.stride(0), inter,
        BLOCK=block, BF16_BITS=_bf16_bits(gate_up.dtype), INTERP=interpreting(), num_warps=4,
    )  # fmt: skip
    return out


# ----------------------------------------------------------------------------- RoPE on q and k


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
    """``BH`` heads of one token: q and k heads rotated into ``q_ptr`` / ``k_ptr``, v heads copied to ``v_ptr``.

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
    ``q @ rotation`` computes them up to float32 summation order.

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
    if rotation is not None and t >= _ROT_FUSED_MAX_TOKENS:  # prefill: the plain kernel, then one GEMM
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
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    num_heads: int, num_kv_heads: int, head_dim: int,
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


_ROT_SPLIT_TOKENS = 64  # below this many tokens the fused rotated RoPE kernel splits output columns (see NOTE)
# NOTE: from this many tokens on (prefill chunks; decode batches in CUDA graphs stay below it) the rotation is
# a GEMM after the plain RoPE kernel: the fused kernel (one token's 16 head rows a program, each loading all
# of rot) took 76 us a layer at a 1.4K-token prefill vs 22 for the plain kernel (8B, H200, 2026-12-01,
# profile_prefill.py: ~4% of nvfp4's TTFT); 64-row blocks spanning tokens were slower still (140 us,
# bench_rope.py). Between 64 and 512 tokens neither way is measured against the other yet.
_ROT_FUSED_MAX_TOKENS = 512


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
    # for the plain RoPE kernel (H200, 2026-11-30); more tokens -> whole rows, rot loaded once a program
    bc = d if qkv.shape[0] >= _ROT_SPLIT_TOKENS else 32
    _rope_qkv_rot_kernel[(qkv.shape[0], triton.cdiv(nh, bh), d // bc)](
        qkv, cos, sin, rotation, q, k, v,
        qkv.stride(0), cos.stride(0), sin.stride(0),
        HQ=num_heads, HKV=num_kv_heads, D=d, BH=bh, BF16_BITS=_bf16_bits(qkv.dtype),
        IEEE=qkv.dtype == torch.float32 or interpreting(), BC=bc, num_warps=4, enable_fp_fusion=False,
    )  # fmt: skip


__all__ = ["add_rms_norm", "rope_qk", "silu_and_mul"]
