"""Keep the garbage collector's full passes short while an engine serves.

Why: once an engine is up, the process holds ~350K long-lived objects that the cyclic collector tracks
(torch, transformers, triton, sympy, the model's modules). A full (oldest-generation) pass walks every one
of them -- 180 ms on the 2-core CI machine -- and lands inside whatever decode step is
running. vLLM and SGLang freeze their start-up heap for the same reason: frozen objects are never
scanned again, so full passes only walk what serving allocates.

NOTE: a frozen object is never collected, so the heap is frozen only while one engine runs and unfrozen
after (a dropped engine is a reference cycle that only the collector frees: left frozen, a benchmark's
next engine would find the old pool still allocated).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Collect, then freeze every object alive now (the engine's start-up heap) until the block ends."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
