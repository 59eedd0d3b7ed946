"""KV dtypes, their bytes per token, and the paged layout the kernels read.

One layer's K and V caches are sets of pages. Within a page the KV-head dimension comes first, so one
page of one KV head is one contiguous run of bytes::

    data  [num_pages, kv_heads, page_size, D]      bf16 / fp16 / fp32 / float8_e4m3fn (K and V apart)
    data  [num_pages, kv_heads, page_size, D/2]    nvfp4: uint8, 8 elements a 32-bit word in sm bit order
    scale [num_pages, kv_heads, page_size, D/16]   nvfp4 only: float8_e4m3fn block scales

An NVFP4 layer is one uint8 tensor ``pages [num_pages, page bytes]`` and the four tensors above are views
into it (strides ``(kv_heads * 2 * R, 2 * R, row, 1)``, ``R = page_size * (D/2 + D/16)``): a (page, KV head)
holds its K rows, their scales, its V rows and their scales side by side, so a decode step's reads of one
(page, head) are one run of bytes (NOTE: 1-4% faster decode than four tensors of their own on an H100,
docs/results.md; the kernels take every tensor's page and head strides, so they read either)::

    page p, head h:   | K: tok0 .. tok P-1, D/2 B each | K scales: D/16 B each | V: ... | V scales: ... |

Global scales are per layer: FP32 ``[num_layers, 2]`` (K, V). A token's *slot* is
``page * page_size + offset``; the slot mapping of a write says where each new row goes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from nibblekv.formats import fp8, nvfp4
from nibblekv.formats.sm_words import from_sm, to_sm


class KVDtype(str, enum.Enum):
    """How one K or V element is stored."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"
    FP8 = "fp8_e4m3"
    NVFP4 = "nvfp4"

    @property
    def quantized(self) -> bool:
        return self in (KVDtype.FP8, KVDtype.NVFP4)


_ALIASES: dict[str, KVDtype] = {
    "bf16": KVDtype.BF16,
    "bfloat16": KVDtype.BF16,
    "fp16": KVDtype.FP16,
    "float16": KVDtype.FP16,
    "half": KVDtype.FP16,
    "fp32": KVDtype.FP32,
    "float32": KVDtype.FP32,
    "fp8": KVDtype.FP8,
    "fp8_e4m3": KVDtype.FP8,
    "nvfp4": KVDtype.NVFP4,
}
_TORCH_TO_KV: dict[torch.dtype, KVDtype] = {
    torch.bfloat16: KVDtype.BF16,
    torch.float16: KVDtype.FP16,
    torch.float32: KVDtype.FP32,
}
_KV_TO_TORCH: dict[KVDtype, torch.dtype] = {
    KVDtype.BF16: torch.bfloat16,
    KVDtype.FP16: torch.float16,
    KVDtype.FP32: torch.float32,
    KVDtype.FP8: torch.float8_e4m3fn,
    KVDtype.NVFP4: torch.uint8,
}
KV_DTYPE_CHOICES: tuple[str, ...] = ("auto", "bf16", "fp8_e4m3", "nvfp4")


def parse_kv_dtype(name: str, model_dtype: torch.dtype = torch.bfloat16) -> KVDtype:
    """``--kv-cache-dtype`` value -> KVDtype; ``auto`` is the model's dtype."""
    key = name.strip().lower()
    if key == "auto":
        return _TORCH_TO_KV[model_dtype]
    if key not in _ALIASES:
        raise ValueError(f"unknown KV cache dtype {name!r}; choose from {', '.join(KV_DTYPE_CHOICES)}")
    return _ALIASES[key]


def bytes_per_value(dtype: KVDtype) -> float:
    """Storage per K or V element, scales included (NVFP4: 4 bits + 8 bits / 16 = 0.5625 B)."""
    if dtype is KVDtype.NVFP4:
        return 0.5 + 1.0 / nvfp4.BLOCK
    return float(torch.empty((), dtype=_KV_TO_TORCH[dtype]).element_size())


@dataclass(frozen=True)
class PageLayout:
    """Shapes and dtypes of one layer's K (or V) page tensors."""

    dtype: KVDtype
    num_kv_heads: int
    head_dim: int
    page_size: int

    def __post_init__(self) -> None:
        if self.dtype is KVDtype.NVFP4 and self.head_dim % nvfp4.BLOCK:
            raise ValueError(f"nvfp4 KV needs head_dim % 16 == 0, got {self.head_dim}")
        if self.page_size < 1 or self.num_kv_heads < 1:
            raise ValueError("page_size and num_kv_heads must be >= 1")

    @property
    def torch_dtype(self) -> torch.dtype:
        return _KV_TO_TORCH[self.dtype]

    @property
    def data_width(self) -> int:
        """Last dimension of the data tensor (elements of ``torch_dtype``)."""
        return self.head_dim // 2 if self.dtype is KVDtype.NVFP4 else self.head_dim

    def bytes_per_token(self) -> int:
        """K + V bytes of one token in one layer (scales included)."""
        per_head = self.data_width * torch.empty((), dtype=self.torch_dtype).element_size()
        if self.dtype is KVDtype.NVFP4:
            per_head += self.head_dim // nvfp4.BLOCK
        return 2 * self.num_kv_heads * per_head

    def data_shape(self, num_pages: int) -> tuple[int, int, int, int]:
        return (num_pages, self.num_kv_heads, self.page_size, self.data_width)

    def scale_shape(self, num_pages: int) -> tuple[int, int, int, int] | None:
        if self.dtype is not KVDtype.NVFP4:
            return None
        return (num_pages, self.num_kv_heads, self.page_size, self.head_dim // nvfp4.BLOCK)

    def allocate(self, num_pages: int, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Zeroed (data, scale) tensors of their own for ``num_pages`` pages of K or V (an NVFP4 pool puts
        K and V in one tensor: :meth:`allocate_pages`)."""
        data = torch.zeros(self.data_shape(num_pages), dtype=self.torch_dtype, device=device)
        sshape = self.scale_shape(num_pages)
        scale = None if sshape is None else torch.zeros(sshape, dtype=torch.float8_e4m3fn, device=device)
        return data, scale

    def head_run_bytes(self) -> int:
        """NVFP4: bytes of one (page, KV head)'s K (or V) rows and their scales."""
        return self.page_size * (self.head_dim // 2 + self.head_dim // nvfp4.BLOCK)

    def allocate_pages(
        self, num_pages: int, device: torch.device | str
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """NVFP4: the zeroed ``pages [num_pages, page bytes]`` uint8 tensor and its (k_data, k_scale, v_data,
        v_scale) views (the module docstring's layout)."""
        if self.dtype is not KVDtype.NVFP4:
            raise ValueError(f"allocate_pages is for nvfp4 pools, not {self.dtype.value}")
        run = self.head_run_bytes()
        pages = torch.zeros(num_pages, self.num_kv_heads * 2 * run, dtype=torch.uint8, device=device)
        st = (self.num_kv_heads * 2 * run, 2 * run)
        (k_data, k_scale), (v_data, v_scale) = (
            self.run_views(pages, num_pages, *st, i * run) for i in (0, 1)
        )
        return pages, (k_data, k_scale, v_data, v_scale)

    def run_views(
        self, buf: torch.Tensor, num_pages: int, page_stride: int, head_stride: int, offset: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """NVFP4: the (data, scale) views of K or V whose (page, KV head) runs (:meth:`head_run_bytes`: the
        rows, then their scales) start at byte ``offset + page * page_stride + head * head_stride`` of the
        uint8 tensor ``buf``."""
        p, half, sb = self.page_size, self.head_dim // 2, self.head_dim // nvfp4.BLOCK
        st = (page_stride, head_stride)
        data = buf.as_strided((num_pages, self.num_kv_heads, p, half), (*st, half, 1), offset)
        scale = buf.view(torch.float8_e4m3fn).as_strided(
            (num_pages, self.num_kv_heads, p, sb), (*st, sb, 1), offset + p * half
        )
        return data, scale


def quantize_rows(
    x: torch.Tensor, dtype: KVDtype, global_scale: float | torch.Tensor = 1.0
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rows ``x [..., D]`` -> stored (data, scale) in ``dtype`` (scale None unless nvfp4; nvfp4 data in the
    pool's sm bit order, :mod:`nibblekv.formats.sm_words`)."""
    if dtype is KVDtype.NVFP4:
        data, scale = nvfp4.quantize(x, global_scale)
        return to_sm(data), scale
    if dtype is KVDtype.FP8:
        return fp8.quantize(x, global_scale), None
    return x.to(_KV_TO_TORCH[dtype]), None


def dequantize_rows(
    data: torch.Tensor, scale: torch.Tensor | None, dtype: KVDtype, global_scale: float | torch.Tensor = 1.0
) -> torch.Tensor:
    """Inverse of :func:`quantize_rows`, as float32 ``[..., D]``."""
    if dtype is KVDtype.NVFP4:
        assert scale is not None
        return nvfp4.dequantize(from_sm(data), scale, global_scale)
    if dtype is KVDtype.FP8:
        return fp8.dequantize(data, global_scale)
    return data.float()
