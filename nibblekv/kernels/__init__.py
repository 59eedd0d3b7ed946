"""Cache kernels: write K/V into pages, attend over them (decode, extend), demote tail pages.

Public ops take the same arguments as their pure-torch twins in ``reference``.
"""

from nibblekv.kernels.reference import decode_ref, demote_pages_ref, extend_ref, write_kv_ref
from nibblekv.kernels.types import LayerKV

# Until the Triton kernels land these are the reference twins (correct everywhere, slow on GPU).
write_kv = write_kv_ref
decode_attention = decode_ref
extend_attention = extend_ref
demote_pages = demote_pages_ref

__all__ = ["LayerKV", "decode_attention", "demote_pages", "extend_attention", "write_kv"]
