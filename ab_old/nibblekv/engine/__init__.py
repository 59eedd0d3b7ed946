"""The serving engine: scheduler, model runner, sampler, and the offline / async front ends."""

from nibblekv.engine.engine import Engine
from nibblekv.engine.request import RequestOutput, TokenLogprob
from nibblekv.engine.sampling_params import SamplingParams

__all__ = ["AsyncEngine", "Engine", "RequestOutput", "SamplingParams", "TokenLogprob"]


def __getattr__(name: str) -> object:
    # AsyncEngine pulls in asyncio + threading; import it on first use.
    if name == "AsyncEngine":
        from nibblekv.engine.async_engine import AsyncEngine

        return AsyncEngine
    raise AttributeError(name)
