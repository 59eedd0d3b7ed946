"""Cache kernels: write K/V into pages, attend over them (decode, extend), demote tail pages.

Public ops take the same arguments as their pure-torch twins in ``reference`` and dispatch on the
device: Triton kernels for CUDA tensors, the reference twin for CPU tensors -- unless the environment
sets ``NIBBLEKV_KERNELS=triton`` (Triton everywhere: the interpreter on CPU, given
``TRITON_INTERPRET=1``) or ``NIBBLEKV_KERNELS=reference`` (the twins everywhere).
The attention ops take one layer's paged KV as a ``formats.PagedKV`` view (pools, page tables, lengths,
tail, CUDA-graph padding rows, an extend's chunks) and pass it down unchanged to their twin or launcher;
``demote_pages`` takes a ``formats.TailDemotion`` (the tail pages and the main pages they go to) the same way.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from nibblekv.formats.kv_view import PagedKV, TailDemotion
from nibblekv.formats.layer_kv import LayerKV
from nibblekv.kernels.reference import decode_ref, demote_pages_ref, extend_ref, write_kv_ref

# NOTE: head dims the Triton attention kernels build for: ``tl.dot`` needs K >= 16 on half a head and the
# tiles are powers of two (64, 128 and 256 are the ones the GPU tests run).
GPU_HEAD_DIMS: tuple[int, ...] = (32, 64, 128, 256)


def check_gpu_head_dim(head_dim: int) -> None:
    """Raise a clear error for a model whose heads the GPU kernels cannot take (instead of a Triton
    compile error in the first forward)."""
    if head_dim not in GPU_HEAD_DIMS:
        raise ValueError(
            f"head_dim {head_dim} is not supported by the GPU attention kernels (one of {GPU_HEAD_DIMS}); "
            "run this model with --device cpu"
        )


def use_triton(t: torch.Tensor) -> bool:
    """Whether ops on ``t`` run the Triton kernels (CUDA tensors, or ``NIBBLEKV_KERNELS=triton``)."""
    mode = os.environ.get("NIBBLEKV_KERNELS", "auto").lower()
    if mode == "triton":
        return True
    if mode == "reference":
        return False
    return t.is_cuda


def write_kv(
    k: torch.Tensor, v: torch.Tensor, cache: LayerKV, slots: torch.Tensor, four_over_six: bool = False
) -> None:
    """Store ``k, v [T, kv_heads, D]`` at ``slots [T]`` (-1 = skip), quantized as the cache's dtype.

    ``four_over_six``: NVFP4 block scales by 4over6 (see ``nibblekv.formats.nvfp4.quantize``).
    """
    if use_triton(k):
        from nibblekv.kernels.write import write_kv_triton

        write_kv_triton(k, v, cache, slots, four_over_six)
    else:
        write_kv_ref(k, v, cache, slots, four_over_six)


def decode_attention(q: torch.Tensor, kv: PagedKV, sm_scale: float) -> torch.Tensor:
    """One query token per request: ``q [B, Hq, D]`` -> ``[B, Hq, D]`` over the view ``kv`` (``decode_ref``).

    ``kv.active`` / ``kv.min_active`` (CUDA graphs): only the first ``active`` (int32 ``[1]`` device tensor,
    ``>= min_active``) rows are requests; padding rows' outputs are unspecified (see ``decode_triton``, whose
    split count follows from them: no ``num_splits`` here).
    """
    if use_triton(q):
        from nibblekv.kernels.decode.launch import decode_triton

        return decode_triton(q, kv, sm_scale)
    return decode_ref(q, kv, sm_scale)


def extend_attention(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    kv: PagedKV,
    sm_scale: float,
    short_chunks_by_decode: bool = True,
) -> torch.Tensor:
    """A chunk of new tokens per request (``kv.cu_seqlens`` splits them) over its cached prefix (the view
    ``kv``: ``lens`` / ``tail_lens`` are the prefix's tokens) plus itself, causally (see ``extend_ref``).

    ``kv.max_chunk`` (host int >= the longest chunk, optional) spares the Triton launcher a device sync and
    lets short chunks take ``extend_decode`` (the prefix through the decode kernels):
    ``short_chunks_by_decode`` (default on) sends NVFP4 and FP8 pools there where it applies. Timed on the
    H200: 1-, 2-, 4-token chunks read NVFP4 0.71 / 0.59 / 0.34 of the ceiling vs ``extend_triton``'s 0.25 /
    0.24 / 0.24, FP8 0.89 / 0.76 / 0.71 vs 0.40 / 0.39 / 0.40; FP8 8-token chunks (two decode_tok groups)
    0.53 vs 0.39."""
    if not use_triton(q):
        return extend_ref(q, k_new, v_new, kv, sm_scale)
    from nibblekv.kernels.extend import via_decode as ed
    from nibblekv.kernels.extend.paged import extend_triton

    if (
        short_chunks_by_decode
        and kv.max_chunk is not None
        and ed.extend_decode_unsupported(q, kv.cache, kv.max_chunk) is None
    ):
        return ed.extend_decode(q, k_new, v_new, kv, sm_scale)
    return extend_triton(q, k_new, v_new, kv, sm_scale)


def gather_pages(segs: Sequence[torch.Tensor], idx: torch.Tensor, out: torch.Tensor) -> None:
    """``out [N, sum widths]`` (uint8) = the pages ``idx [N]`` of every segment ``[pages, width]``, side by side."""
    from nibblekv.kernels import page_copy

    (page_copy.gather_pages_triton if use_triton(idx) else page_copy.gather_pages_ref)(segs, idx, out)


def scatter_pages(src: torch.Tensor, segs: Sequence[torch.Tensor], idx: torch.Tensor) -> None:
    """The inverse of :func:`gather_pages`: rows of ``src`` into the pages ``idx`` of every segment."""
    from nibblekv.kernels import page_copy

    (page_copy.scatter_pages_triton if use_triton(idx) else page_copy.scatter_pages_ref)(src, segs, idx)


def demote_pages(moves: TailDemotion, four_over_six: bool = False) -> None:
    """Quantize whole tail pages ``moves.src_pages [N]`` into main-pool pages ``moves.dst_pages [N]``
    (``four_over_six`` as in :func:`write_kv`)."""
    if use_triton(moves.src_pages if moves.src_pages.is_cuda else moves.tail.k_data):
        from nibblekv.kernels.write import demote_pages_triton

        demote_pages_triton(moves, four_over_six)
    else:
        demote_pages_ref(moves, four_over_six)


__all__ = [
    "PagedKV",
    "TailDemotion",
    "decode_attention",
    "demote_pages",
    "extend_attention",
    "gather_pages",
    "scatter_pages",
    "use_triton",
    "check_gpu_head_dim",
    "GPU_HEAD_DIMS",
    "write_kv",
]
