"""KV storage formats, defined once in pure torch: the reference for every kernel."""

from nibblekv.formats import e2m1, fp8, nvfp4, sm_words
from nibblekv.formats.kv_view import PagedKV, TailDemotion
from nibblekv.formats.layer_kv import LayerKV
from nibblekv.formats.layout import (
    KV_DTYPE_CHOICES,
    KVDtype,
    PageLayout,
    bytes_per_value,
    dequantize_rows,
    parse_kv_dtype,
    quantize_rows,
)

__all__ = [
    "e2m1",
    "fp8",
    "nvfp4",
    "sm_words",
    "KV_DTYPE_CHOICES",
    "KVDtype",
    "LayerKV",
    "PageLayout",
    "PagedKV",
    "TailDemotion",
    "bytes_per_value",
    "dequantize_rows",
    "parse_kv_dtype",
    "quantize_rows",
]
