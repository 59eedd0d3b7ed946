"""The typed launch config of one decode launch: which kernel family runs and its knobs.

``decode.config.select_decode`` builds it (the table of which kernel serves which case is its docstring);
``decode.decode_triton`` reads it. A benchmark or test that wants a non-default kernel passes one
(``decode.knobs.base_config(kernel, ...)`` with ``dataclasses.replace`` for the knobs).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum

import torch


class DecodeKernel(str, Enum):
    """The decode kernel families. ``MMA16`` and ``BALANCED`` are what ``select_decode`` makes of ``MMA``
    for 9-16 query columns a KV head and for many (request, KV head) pairs."""

    PAGED = "paged"  # decode_paged: whole-page tiles [pages, P*D] -> [BN, D] where pages allow
    ROWS = "rows"  # decode_paged with per-token addressing, K as two half-D dots (PAGED=False)
    TOK = "tok"  # decode_tok: per-token gather of [BN, D] tiles, S = Q K^T, one full-D tl.dot
    MMA = "mma"  # decode_mma: NVFP4 straight into mma.sync fragments, S^T = K Q^T, <= 8 columns
    MMA16 = "mma16"  # decode_mma16: the same registers as S = Q K^T, 9-16 columns
    BALANCED = "balanced"  # decode_balanced: decode_mma over token-balanced chunks of the whole batch


MMA_KERNELS = (DecodeKernel.MMA, DecodeKernel.MMA16, DecodeKernel.BALANCED)


@dataclass(frozen=True)
class DecodeConfig:
    """One decode launch. The defaults and their H200 measurements are in ``decode_config``'s builders.

    Every kernel: ``block_n`` / ``tail_block_n`` (keys per tile of the pool / the bf16 tail), ``num_warps``,
    ``num_stages`` (``tail_stages``: with a bf16 tail, None = the same), ``split_cap`` (most splits a
    request), ``wave_ctas`` (programs per SM of ``default_num_splits``' one-wave rule; 0 off),
    ``combine_db`` (dims per combine program; 0 = ``combine_dim_block``). ``decode_tok``: ``conv`` (FP8: bit 0
    V, bit 1 K through the uint16-pair asm), ``split`` (V as even / odd column halves; 2: NVFP4 K too).

    ``decode_mma`` family: ``ppsm`` programs per SM to aim for (``wppsm`` for ``decode_mma16``, ``bal_ppsm``
    for the balanced kernel), ``tpi`` 16-token tiles per softmax step, ``pf`` prefetch of the next step,
    ``minc`` the fewest tokens a split, ``vst`` / ``vq`` 16-byte vector partial stores / Q loads, ``tin``
    the bf16 tail as programs of the grid (0: its own launch), ``tail_splits`` such programs per (request,
    KV head), ``tail_page_prefetch`` their next page id loaded a tile early, ``balanced`` (0 off, 1 on, 2 from
    ``bal_pairs`` pairs), ``l2_ahead`` the L2 prefetch distance in steps (None: ``decode_mma16``'s
    default, else off), ``mma_slots`` the most partial slots (one a warp) a (request, KV head) pair writes,
    ``part_bf16`` those partial outputs in bf16 (half the bytes the kernel writes and the combine step reads;
    their lse stays fp32), ``lazy_rescale`` > 0: a warp keeps its softmax max (and skips rescaling its
    accumulators) until some score exceeds it by more than that many log2 units (``decode_mma`` and
    ``decode_balanced`` at head_dim 128 and 256; 0 = every step). ``bal_heads`` 1: the balanced chunks cut
    the requests' tiles (not the pairs') and every KV head of a request takes the same chunk, so the warps
    reading one page's heads run side by side, as per-pair splits do. ``l2_bulk`` 1: each L2 prefetch of
    ``decode_mma`` / ``decode_balanced`` (head_dim 128 / 256, GQA <= 8, ``l2_ahead`` > 0) is one bulk copy of
    a tile's whole (page, KV head) run by the TMA unit instead of a 128-byte line a lane (NVFP4 pools in
    their own page layout, ``formats.layout``). ``smem_stages`` 2-4: ``decode_mma`` / ``decode_balanced``
    (head_dim 128 / 256, GQA <= 8, such pools) read their tiles through a shared-memory ring of that many
    stages filled by bulk copies (``ptx.ring``), instead of loading the next step into registers (``pf``
    and ``l2_ahead`` then do nothing); 0 = off.
    ``tail_in_grid`` is resolved by ``select_decode`` (not an input).
    """

    kernel: DecodeKernel
    block_n: int
    tail_block_n: int
    num_warps: int
    num_stages: int
    tail_stages: int | None = None
    split_cap: int = 64
    wave_ctas: int = 0
    combine_db: int = 0
    conv: int = 0
    split: int = 0
    ppsm: int = 12
    wppsm: int = 8
    bal_ppsm: int = 12
    tpi: int = 2
    pf: int = 1
    minc: int = 64
    vst: int = 1
    vq: int = 1
    tin: int = 1
    tail_splits: int = 2
    tail_page_prefetch: int = 1
    balanced: int = 2
    bal_pairs: int = 208
    l2_ahead: int | None = None
    mma_slots: int = 256
    part_bf16: int = 0
    lazy_rescale: int = 0
    bal_heads: int = 0
    l2_bulk: int = 0
    smem_stages: int = 0
    tail_in_grid: bool = False

    def __post_init__(self) -> None:
        # NOTE: a kept max lets probabilities reach 2**lazy_rescale, and the mma kernels hold them in fp16
        if not 0 <= self.lazy_rescale <= 15:
            raise ValueError(f"lazy_rescale must be 0 (off) to 15 (fp16 holds 2**15): {self.lazy_rescale}")
        if self.bal_heads not in (0, 1):
            raise ValueError(f"bal_heads must be 0 or 1: {self.bal_heads}")
        if self.l2_bulk not in (0, 1):
            raise ValueError(f"l2_bulk must be 0 or 1: {self.l2_bulk}")
        if self.smem_stages not in (0, 2, 3, 4):
            raise ValueError(f"smem_stages must be 0 (off) or 2-4: {self.smem_stages}")

    @property
    def mma(self) -> bool:
        """Whether a ``decode_mma`` family kernel runs (16-token tiles, one partial slot a warp)."""
        return self.kernel in MMA_KERNELS

    @property
    def partial_dtype(self) -> torch.dtype:
        """The dtype asked for the partial outputs a launch writes for its combine step (``decode_triton``
        keeps per-pair partials fp32 where its combine merges whole rows)."""
        return torch.bfloat16 if self.mma and self.part_bf16 else torch.float32

    def replace(self, **changes: object) -> DecodeConfig:
        """A copy with ``changes`` (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


__all__ = ["MMA_KERNELS", "DecodeConfig", "DecodeKernel"]
