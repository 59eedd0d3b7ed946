"""Decode attention (one query token per request) over the paged KV cache.

``launch.decode_triton`` is the entry; ``config.select_decode`` picks the kernel for a batch as a typed
``decode.launch_config.DecodeConfig``. Kernels: ``mma`` (NVFP4, tensor cores; ``mma16`` its 16-column form,
``mma_tail`` the bf16 tail segment, ``_mma_step`` / ``_mma_tile`` their shared steps), ``balanced``
(token-balanced NVFP4 grid), ``tok`` (FP8 / bf16 pools), ``paged`` (the portable kernel), ``combine``
(merges the split partials). Twins: ``nibblekv.kernels.reference.decode_ref``.
"""
