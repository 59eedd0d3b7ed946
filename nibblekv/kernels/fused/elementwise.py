"""Fused elementwise kernels for the model forward: add + RMSNorm, SiLU * mul (RoPE: :mod:`.rope`).

A decode step runs a handful of tiny torch kernels per op (RMSNorm alone is about 8, RoPE on q and k
about 12 per layer); each of these Triton kernels does one op in one launch, with the same roundings
as the eager code (the twins in :mod:`nibblekv.kernels.fused.reference` are the definition):

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

from nibblekv.formats.fp8_weights import ACT_EPS, QuantizedRows
from nibblekv.formats.nvfp4 import E4M3_MAX
from nibblekv.kernels._common import interpreting, num_sms
from nibblekv.kernels.fp8.quant import act_codes, act_scale
from nibblekv.kernels.pdl import pdl_enter, pdl_launch

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


@triton.jit
def _store_e4m3_groups(
    y, q_ptr, s_ptr, c0, cols, mask, n_groups, QGROUP: tl.constexpr, BLOCK: tl.constexpr,
    EPS: tl.constexpr, FP8_MAX: tl.constexpr,
):  # fmt: skip
    """Quantize a tile ``y [BLOCK]`` (fp32, 0 where masked) of columns ``c0 + [0, BLOCK)`` per group of
    ``QGROUP`` columns (a power of two dividing ``BLOCK``; ``c0`` on a group boundary) as
    ``quant_fp8_groups`` does: e4m3 codes to ``q_ptr + cols``, group ``g``'s scale to ``s_ptr + g``."""
    NG: tl.constexpr = BLOCK // QGROUP
    scale = act_scale(tl.max(tl.reshape(tl.abs(y), [NG, QGROUP]), axis=1), EPS, FP8_MAX)
    gid = c0 // QGROUP + tl.arange(0, NG)
    tl.store(s_ptr + gid, scale, mask=gid < n_groups)
    per_col = tl.reshape(tl.broadcast_to(scale[:, None], [NG, QGROUP]), [BLOCK])
    tl.store(q_ptr + cols, act_codes(y, per_col, FP8_MAX), mask=mask)


@triton.jit
def _store_tile(
    y, out_ptr, stride_out, q_ptr, s_ptr, row, width, c0, cols, mask, n_groups, QGROUP: tl.constexpr,
    BLOCK: tl.constexpr, EPS: tl.constexpr, FP8_MAX: tl.constexpr,
):  # fmt: skip
    """A row's tile ``y`` (columns ``cols``): to ``out`` (``QGROUP == 0``), or quantized for an FP8 layer
    (:func:`_store_e4m3_groups`; codes in rows of ``width``, ``n_groups`` scales a row)."""
    if QGROUP == 0:
        tl.store(out_ptr + row * stride_out + cols, y, mask=mask)
    else:
        q_row, s_row = q_ptr + row * width, s_ptr + row * n_groups
        y32 = y.to(tl.float32)
        _store_e4m3_groups(y32, q_row, s_row, c0, cols, mask, n_groups, QGROUP, BLOCK, EPS, FP8_MAX)


def _quant_plan(width: int, group: int | None, block: int) -> tuple[int, int, int]:
    """(tile width, QGROUP, number of scale groups) for quantizing rows of ``width`` columns per ``group``
    (``None``: per row) in tiles of up to ``block``: a group at least the row is one scale per row, which
    needs the whole row in one tile."""
    if group is None or group >= width:
        whole = triton.next_power_of_2(width)
        return whole, whole, 1
    tile = max(block, group)
    return tile, group, triton.cdiv(width, group)


def _quant_out(t: int, width: int, n_groups: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.empty((t, width), dtype=torch.float8_e4m3fn, device=device),
        torch.empty((t, n_groups), dtype=torch.float32, device=device),
    )


# ----------------------------------------------------------------------------- add + RMSNorm


@triton.jit
def _add_rms_norm_kernel(
    x_ptr, r_ptr, w_ptr, out_ptr, res_ptr, q_ptr, s_ptr,
    stride_x, stride_r, stride_out, stride_res, n_groups,
    H, eps,
    HAS_RES: tl.constexpr, BLOCK: tl.constexpr, X_BITS: tl.constexpr, OUT_BITS: tl.constexpr,
    QGROUP: tl.constexpr, EPS: tl.constexpr, FP8_MAX: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """One row: ``s = x + r`` (rounded to x's dtype, stored), ``out = round(round(s * rstd) * w)``;
    ``QGROUP > 0``: ``out`` quantized to e4m3 per group of ``QGROUP`` columns instead (rows of ``H``)."""
    pdl_enter(PDL)
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
    y = _round(normed * w, out_ptr, OUT_BITS)
    _store_tile(
        y, out_ptr, stride_out, q_ptr, s_ptr, row, H, 0, cols, mask, n_groups, QGROUP, BLOCK, EPS, FP8_MAX
    )  # fmt: skip


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused residual add and RMSNorm: ``(rms_norm(s) * weight, s)`` with ``s = x + residual``.

    ``x, residual [T, H]``: same dtype (float32 / bfloat16 / float16), unit last stride (any row
    stride); ``residual=None`` means ``s = x`` (returned as is, no copy). ``weight [H]`` contiguous.
    Returns new contiguous tensors: normed ``[T, H]`` in ``promote_types(weight.dtype, x.dtype)``
    and ``s [T, H]`` in ``x``'s dtype. Same roundings as :func:`~nibblekv.kernels.fused.reference.add_rms_norm_ref`.
    """
    out, new_res, _ = _add_rms_norm(x, residual, weight, eps, None, quantize=False)
    return out, new_res


def add_rms_norm_fp8(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float, group: int | None
) -> tuple[QuantizedRows, torch.Tensor]:
    """:func:`add_rms_norm` whose normed rows leave as an FP8 layer's input: e4m3 per ``group`` columns
    (``None``: per row), bit for bit ``quant_fp8_groups(add_rms_norm(...)[0], group)``; the residual as
    there."""
    out, new_res, quant = _add_rms_norm(x, residual, weight, eps, group, quantize=True)
    assert quant is not None
    return QuantizedRows(*quant, group, out.dtype), new_res


def _add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float, group: int | None,
    quantize: bool,
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:  # fmt: skip
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
    _, qgroup, n_groups = _quant_plan(h, group, block) if quantize else (block, 0, 1)
    # NOTE: when quantizing, ``out`` only carries the dtype the kernel rounds to (nothing is stored in it)
    out_dtype = torch.promote_types(weight.dtype, x.dtype)
    out = torch.empty((1,) if quantize else (t, h), dtype=out_dtype, device=x.device)
    quant = _quant_out(t, h, n_groups, x.device) if quantize else None
    new_res = x if residual is None else torch.empty((t, h), dtype=x.dtype, device=x.device)
    if t == 0:
        return out, new_res, quant
    r = x if residual is None else residual
    q, sc = quant if quant is not None else (out, out)
    _add_rms_norm_kernel[(t,)](
        x, r, weight, out, new_res, q, sc,
        x.stride(0), r.stride(0), h, new_res.stride(0), n_groups,
        h, float(eps),
        HAS_RES=residual is not None, BLOCK=block, X_BITS=_bf16_bits(x.dtype), OUT_BITS=_bf16_bits(out.dtype),
        QGROUP=qgroup, EPS=ACT_EPS, FP8_MAX=E4M3_MAX, num_warps=_warps(block), **pdl_launch(x.device),
    )  # fmt: skip
    return out, new_res, quant


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
    gu_ptr, out_ptr, q_ptr, s_ptr, amax_ptr, stride_gu, stride_out, n_groups, I,
    BLOCK: tl.constexpr, BF16_BITS: tl.constexpr, INTERP: tl.constexpr, QGROUP: tl.constexpr,
    EPS: tl.constexpr, FP8_MAX: tl.constexpr, TILE_AMAX: tl.constexpr = False, PDL: tl.constexpr = False,
):  # fmt: skip
    """``BLOCK`` columns of one row: ``round(round(g / (1 + exp(-g))) * u)``; ``QGROUP > 0``: quantized to
    e4m3 per group of ``QGROUP`` columns instead (rows of ``I``). ``TILE_AMAX``: also the tile's amax to
    ``amax_ptr[row, tile]`` (rows of as many tiles as the grid's second axis), for ``_quant_tiles_kernel``."""
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    c0 = tl.program_id(1) * BLOCK
    cols = c0 + tl.arange(0, BLOCK)
    mask = cols < I
    src = gu_ptr + row * stride_gu + cols
    g = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(src + I, mask=mask, other=0.0).to(tl.float32)
    silu = _round(tl.math.div_rn(g, 1.0 + _exp(-g, INTERP)), out_ptr, BF16_BITS).to(tl.float32)
    y = _round(silu * u, out_ptr, BF16_BITS)
    _store_tile(
        y, out_ptr, stride_out, q_ptr, s_ptr, row, I, c0, cols, mask, n_groups, QGROUP, BLOCK, EPS, FP8_MAX
    )  # fmt: skip
    if TILE_AMAX:  # masked columns are silu(0) * 0 = 0
        amax = tl.max(tl.abs(y.to(tl.float32)), axis=0)
        tl.store(amax_ptr + row * tl.num_programs(1) + tl.program_id(1), amax)


@triton.jit
def _quant_tiles_kernel(
    y_ptr, amax_ptr, q_ptr, s_ptr, I, n_tiles,
    BLOCK: tl.constexpr, TILES: tl.constexpr, EPS: tl.constexpr, FP8_MAX: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """Tile ``BLOCK`` columns of row ``y[row]`` (rows of ``I``) to e4m3 under the row's scale, the max of its
    ``n_tiles`` tile maxima (``TILES`` a power of two >= it); tile 0 stores the scale: per-row quantization
    (``_store_e4m3_groups``' math) of a row split over programs."""
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1)
    t = tl.arange(0, TILES)
    amax = tl.max(tl.load(amax_ptr + row * n_tiles + t, mask=t < n_tiles, other=0.0), axis=0)
    scale = act_scale(amax, EPS, FP8_MAX)
    tl.store(s_ptr + row, scale, mask=tile == 0)
    cols = tile * BLOCK + tl.arange(0, BLOCK)
    mask = cols < I
    y = tl.load(y_ptr + row * I + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(q_ptr + row * I + cols, act_codes(y, scale, FP8_MAX), mask=mask)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``gate_up [T, 2I]`` (columns ``[gate | up]``, unit last stride) -> ``silu(gate) * up`` ``[T, I]``.

    Float32 / bfloat16 / float16; the output is a new contiguous tensor in the input dtype, rounded as
    ``F.silu(gate) * up`` (see :func:`~nibblekv.kernels.fused.reference.silu_and_mul_ref`).
    """
    out, _ = _silu_and_mul(gate_up, None, quantize=False)
    return out


def silu_and_mul_fp8(gate_up: torch.Tensor, group: int | None) -> QuantizedRows:
    """:func:`silu_and_mul` leaving as an FP8 layer's input: e4m3 per ``group`` columns (``None``: per row),
    bit for bit ``quant_fp8_groups(silu_and_mul(gate_up), group)``."""
    out, quant = _silu_and_mul(gate_up, group, quantize=True)
    assert quant is not None
    return QuantizedRows(*quant, group, out.dtype)


def _silu_and_mul(
    gate_up: torch.Tensor, group: int | None, quantize: bool
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    _check_rows(gate_up, "gate_up")
    t, two_i = gate_up.shape
    if two_i % 2:
        raise ValueError(f"gate_up must have an even number of columns [gate | up], got {two_i}")
    inter = two_i // 2
    block = min(triton.next_power_of_2(max(inter, 1)), 1024)
    if quantize and group is None and 0 < t < num_sms() and inter > block:
        return _silu_and_mul_rows_split(gate_up, inter, block)
    block, qgroup, n_groups = _quant_plan(inter, group, block) if quantize else (block, 0, 1)
    if block > _MAX_BLOCK:
        raise ValueError(f"intermediate size {inter} is too large to quantize per row in one program")
    # NOTE: when quantizing, ``out`` only carries the dtype the kernel rounds to (nothing is stored in it)
    out = torch.empty((1,) if quantize else (t, inter), dtype=gate_up.dtype, device=gate_up.device)
    quant = _quant_out(t, inter, n_groups, gate_up.device) if quantize else None
    if t == 0 or inter == 0:
        return out, quant
    q, sc = quant if quant is not None else (out, out)
    _silu_and_mul_kernel[(t, triton.cdiv(inter, block))](
        gate_up, out, q, sc, out, gate_up.stride(0), inter, n_groups, inter,
        BLOCK=block, BF16_BITS=_bf16_bits(gate_up.dtype), INTERP=interpreting(), QGROUP=qgroup, EPS=ACT_EPS,
        FP8_MAX=E4M3_MAX, num_warps=_warps(block) if quantize else 4, **pdl_launch(gate_up.device),
    )  # fmt: skip
    return out, quant


def _silu_and_mul_rows_split(
    gate_up: torch.Tensor, inter: int, block: int
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Per-row quantized SiLU * mul for fewer rows than SMs, each row in ``block``-column tiles over two
    kernels (SiLU * mul with each tile's amax, then the codes), the same bits as the one-program row.
    NOTE: one program a row leaves most SMs idle at decode batches, and that one SM does the whole row's
    exp and division: Llama-3.1-8B's 14,336-wide down_proj input took 8.8 us a call at 1-16 tokens (H100)."""
    t = gate_up.shape[0]
    tiles = triton.cdiv(inter, block)
    y = torch.empty((t, inter), dtype=gate_up.dtype, device=gate_up.device)
    amax = torch.empty((t, tiles), dtype=torch.float32, device=gate_up.device)
    q, sc = _quant_out(t, inter, 1, gate_up.device)
    launch = pdl_launch(gate_up.device)
    _silu_and_mul_kernel[(t, tiles)](
        gate_up, y, y, y, amax, gate_up.stride(0), inter, 1, inter,
        BLOCK=block, BF16_BITS=_bf16_bits(gate_up.dtype), INTERP=interpreting(), QGROUP=0, EPS=ACT_EPS,
        FP8_MAX=E4M3_MAX, TILE_AMAX=True, num_warps=4, **launch,
    )  # fmt: skip
    _quant_tiles_kernel[(t, tiles)](
        y, amax, q, sc, inter, tiles, BLOCK=block, TILES=triton.next_power_of_2(tiles), EPS=ACT_EPS,
        FP8_MAX=E4M3_MAX, num_warps=4, **launch,
    )  # fmt: skip
    return y, (q, sc)


__all__ = ["add_rms_norm", "add_rms_norm_fp8", "silu_and_mul", "silu_and_mul_fp8"]
