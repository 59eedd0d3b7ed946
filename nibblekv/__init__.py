"""nibblekv: an LLM serving engine with a 4-bit (NVFP4) paged KV cache, fast on Hopper."""

__version__ = "0.1.0"
