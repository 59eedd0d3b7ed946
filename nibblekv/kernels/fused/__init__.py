"""Fused elementwise kernels of the model forward: add + RMSNorm and SiLU * mul (``elementwise``), RoPE
(``rope``); their pure-torch twins are ``reference``."""
