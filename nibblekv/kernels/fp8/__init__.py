"""FP8 linear layers: activation quantization (``quant``), the block-scaled and row-wise GEMMs (``gemm``,
cuBLASLt's block-scaled kernel in ``scaled_mm``); twins in ``reference``."""
