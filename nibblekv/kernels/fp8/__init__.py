"""FP8 linear layers: activation quantization and the block-scaled GEMM (``gemm``); twins in ``reference``."""
