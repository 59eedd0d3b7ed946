"""Extend attention (a chunk of new tokens per request over its cached prefix).

``paged.extend_triton``: the paged Triton kernel for any chunk; ``via_decode.extend_decode``: short chunks
whose prefix runs through the decode kernels. Twin: ``nibblekv.kernels.reference.extend_ref``.
"""
