"""nibblekv: an LLM serving engine with a 4-bit (NVFP4) paged KV cache, fast on Hopper."""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"
__all__ = ["Engine", "SamplingParams", "__version__"]

if TYPE_CHECKING:
    from nibblekv.engine import Engine, SamplingParams


def __getattr__(name: str) -> object:
    # NOTE: lazy, so `import nibblekv.formats` (and the CLI's start-up) does not load the engine.
    if name == "Engine":
        from nibblekv.engine.engine import Engine

        return Engine
    if name == "SamplingParams":
        from nibblekv.engine.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'nibblekv' has no attribute {name!r}")
