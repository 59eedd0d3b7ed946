"""One layer's K and V pages in one storage dtype: the cache's tensors that the kernels read and write."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nibblekv.formats.layout import KVDtype, PageLayout


@dataclass
class LayerKV:
    """One layer's K and V pages in one storage dtype (see ``nibblekv.formats.layout``).

    ``k_data``/``v_data`` are ``[num_pages, kv_heads, page_size, D or D/2]``; ``k_scale``/``v_scale``
    the NVFP4 block scales ``[num_pages, kv_heads, page_size, D/16]`` (None otherwise);
    ``global_scale`` is FP32 ``[2]`` = (K, V) on the cache's device (1.0 for unquantized dtypes);
    ``pages`` (NVFP4 from :meth:`allocate`) the uint8 ``[num_pages, page bytes]`` tensor the four share, a
    page's every byte in one row (None where they are tensors of their own).
    NOTE: these are views into the pool's tensors; kernels write into them in place.
    """

    layout: PageLayout
    k_data: torch.Tensor
    v_data: torch.Tensor
    k_scale: torch.Tensor | None
    v_scale: torch.Tensor | None
    global_scale: torch.Tensor
    pages: torch.Tensor | None = None

    @property
    def dtype(self) -> KVDtype:
        return self.layout.dtype

    @property
    def page_size(self) -> int:
        return self.layout.page_size

    @property
    def num_pages(self) -> int:
        return self.k_data.shape[0]

    @staticmethod
    def allocate(
        layout: PageLayout,
        num_pages: int,
        device: torch.device | str,
        global_scale: torch.Tensor | None = None,
    ) -> "LayerKV":
        if global_scale is None:
            global_scale = torch.ones(2, dtype=torch.float32, device=device)
        if layout.dtype is KVDtype.NVFP4:
            pages, (k_data, k_scale, v_data, v_scale) = layout.allocate_pages(num_pages, device)
            return LayerKV(layout, k_data, v_data, k_scale, v_scale, global_scale, pages)
        k_data, k_scale = layout.allocate(num_pages, device)
        v_data, v_scale = layout.allocate(num_pages, device)
        return LayerKV(layout, k_data, v_data, k_scale, v_scale, global_scale)
