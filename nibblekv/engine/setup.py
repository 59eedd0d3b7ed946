"""How an engine's pieces are sized and built: device, KV pool, page table, cache manager.

Shared by :class:`~nibblekv.engine.engine.Engine` (rank 0) and the tensor-parallel workers
(:mod:`nibblekv.engine.tp_worker`), which must size and build exactly the same pool and table.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import replace

import torch

from nibblekv.cache import (
    BaseCacheManager,
    KVPool,
    PageTable,
    PoolSpec,
    TieredCacheManager,
    load_kv_scales,
    most_that_fit,
    page_table_bytes,
    page_table_widths,
    size_pool,
)
from nibblekv.cache.host_tier import HostTier, host_pages_for
from nibblekv.cache.prefix import PrefixCacheManager
from nibblekv.cache.state_pool import StatePool, snapshot_slots
from nibblekv.cache.state_prefix import StatePrefixCacheManager
from nibblekv.config import CPU_DEFAULT_MAX_TOTAL_TOKENS, EngineConfig
from nibblekv.formats import KVDtype, parse_kv_dtype
from nibblekv.kernels import check_gpu_head_dim
from nibblekv.model import CausalLM

logger = logging.getLogger("nibblekv")

DEFAULT_MEM_FRACTION_STATIC: float = 0.88
DEFAULT_MAX_RUNNING: dict[str, int] = {"cuda": 128, "cpu": 32}
_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    return torch.device(name)


def kv_budget_bytes(config: EngineConfig, device: torch.device) -> int | None:
    """Bytes for the KV pool (both tiers), or None when only ``max_total_tokens`` sizes it.

    CUDA (SGLang's rule): weights + pool take ``mem_fraction_static`` of the GPU, so the pool gets
    what is free after loading the weights minus the ``1 - fraction`` kept for activations.
    """
    if device.type == "cuda":
        frac = config.mem_fraction_static or DEFAULT_MEM_FRACTION_STATIC
        free, total = torch.cuda.mem_get_info(device)
        return int(free - total * (1.0 - frac))
    if config.mem_budget_gib is not None:
        return int(config.mem_budget_gib * (1 << 30))
    return None


def pool_spec(config: EngineConfig, model: CausalLM, max_running: int, context_len: int | None = None) -> PoolSpec:
    """The pool :func:`build_pool` would allocate now (benchmarks size runs with it): the byte budget less
    the page table for ``max_running`` rows of ``context_len`` tokens (default: ``--context-length``, else
    the model's positions)."""
    mc = model.config
    if model.device.type == "cuda" and os.environ.get("NIBBLEKV_KERNELS", "auto") != "reference":
        check_gpu_head_dim(mc.head_dim)
    budget = kv_budget_bytes(config, model.device)
    max_tokens = config.max_total_tokens
    if budget is None and max_tokens is None:
        max_tokens = CPU_DEFAULT_MAX_TOTAL_TOKENS
    context = context_len or config.context_length or mc.max_position_embeddings
    if budget is not None:
        budget -= state_pool_bytes(config, model, max_running)  # hybrid models: the linear states first
        shape = _size_pool(config, model, max_running, None, config.page_size)  # the table's widths only
        budget -= page_table_bytes(shape, max_running, context)
    spec = _size_pool(config, model, max_running, budget, max_tokens)
    hadamard, four_over_six = resolve_kv_options(config, spec.kv_dtype, mc.head_dim)
    return replace(spec, hadamard=hadamard, four_over_six=four_over_six)


def _size_pool(
    config: EngineConfig, model: CausalLM, max_running: int, budget: int | None, max_tokens: int | None
) -> PoolSpec:
    mc = model.config
    return size_pool(
        num_layers=mc.num_kv_layers,  # a hybrid model's linear-attention layers hold no KV
        num_kv_heads=mc.num_kv_heads,
        head_dim=mc.head_dim,
        page_size=config.page_size,
        kv_dtype=parse_kv_dtype(config.kv_cache_dtype, model.dtype),
        model_kv_dtype=parse_kv_dtype("auto", model.dtype),
        recent_window=config.kv_recent_window,
        max_running_requests=max_running,
        budget_bytes=budget,
        max_total_tokens=max_tokens,
        sink_pages=resolve_sink_pages(config, parse_kv_dtype(config.kv_cache_dtype, model.dtype)),
        prefill_window=config.resolve_prefill_window(),
    )


def kv_rotation_planned(config: EngineConfig) -> bool:
    """Whether the pool will rotate K/V by the Hadamard matrix where head_dim allows, known before the model
    is (``load_model``'s ``kv_rotation``): ``--kv-hadamard``, else on for nvfp4 (``resolve_kv_options``)."""
    if config.kv_hadamard is not None:
        return config.kv_hadamard
    return parse_kv_dtype(config.kv_cache_dtype) is KVDtype.NVFP4  # NOTE: "auto" (the model's dtype) never is


def resolve_kv_options(config: EngineConfig, kv_dtype: KVDtype, head_dim: int) -> tuple[bool, bool]:
    """(Hadamard rotation, 4over6 block scales) for this pool: the flags when given, else the nvfp4
    default chosen from the accuracy run (docs/accuracy.md): both on for nvfp4, the rotation only for
    a power-of-two head_dim (the Sylvester construction); both off for the other dtypes."""
    nvfp4 = kv_dtype == KVDtype.NVFP4
    hadamard = config.kv_hadamard
    if hadamard is None:
        hadamard = nvfp4 and head_dim & (head_dim - 1) == 0
    four_over_six = nvfp4 if config.kv_quant_4over6 is None else config.kv_quant_4over6
    return hadamard, four_over_six


def resolve_sink_pages(config: EngineConfig, kv_dtype: KVDtype) -> int:
    """bf16 sink pages per request: the flag when given, else 1 for nvfp4 (the chunked-prefill accuracy
    run in docs/accuracy.md) and 0 for the other dtypes. ``size_pool`` drops them without a tail."""
    if config.kv_sink_pages is not None:
        return config.kv_sink_pages
    return int(kv_dtype == KVDtype.NVFP4)


def build_pool(
    config: EngineConfig,
    model: CausalLM,
    max_running: int,
    agree: Callable[[PoolSpec], PoolSpec] | None = None,
    context_len: int | None = None,
) -> KVPool:
    """Size and allocate the pool; ``agree`` (tensor parallel) makes every rank's page count equal."""
    spec = pool_spec(config, model, max_running, context_len)
    if agree is not None:
        spec = agree(spec)
    scales = load_kv_scales(config.kv_scales_path, model.config.num_kv_layers, model.device, spec.hadamard)
    return KVPool(spec, model.device, scales)


def ssm_dtype(config: EngineConfig, model: CausalLM) -> str | None:
    """A hybrid model's recurrent-state dtype: ``--mamba-ssm-dtype``, else its config's (None: not hybrid)."""
    la = model.config.linear_attention
    return None if la is None else config.mamba_ssm_dtype or la.ssm_dtype


def state_slots_error(config: EngineConfig) -> str | None:
    """``--max-mamba-cache-size`` below the default ``--max-running-requests`` (EngineConfig checks the pair
    when both are given), as a CLI error; None when it is fine."""
    n = config.max_mamba_cache_size
    if n is None or config.max_running_requests is not None:
        return None
    try:
        default = DEFAULT_MAX_RUNNING.get(resolve_device(config.device).type, 32)
    except ValueError:  # e.g. --device cuda without a GPU: the engine says so
        return None
    if n >= default:
        return None
    return f"--max-mamba-cache-size ({n}) must be >= --max-running-requests (default {default} here)"


def state_snapshot_slots(config: EngineConfig, max_running: int) -> int:
    """The prefix cache's state snapshot slots (``--max-mamba-cache-size`` less the running requests')."""
    return snapshot_slots(max_running, config.max_mamba_cache_size, not config.disable_radix_cache)


def state_pool_bytes(config: EngineConfig, model: CausalLM, max_running: int) -> int:
    """Bytes of a hybrid model's linear-attention state pool (one slot per running request, the prefix
    cache's snapshot slots and the scratch slot of CUDA graphs' padding rows); 0 otherwise."""
    per_slot = model.config.state_bytes_per_request(model.dtype, ssm_dtype(config, model))
    if not per_slot:
        return 0
    return (max_running + state_snapshot_slots(config, max_running) + 1) * per_slot


def build_state_pool(config: EngineConfig, model: CausalLM, max_running: int) -> StatePool | None:
    """The linear-attention state pool of a hybrid model (None for the others)."""
    la, ssm = model.config.linear_attention, ssm_dtype(config, model)
    if la is None or ssm is None:
        return None
    return StatePool(
        model.config.num_linear_layers, max_running, (la.conv_dim, la.conv_kernel - 1),
        (la.num_value_heads, la.key_head_dim, la.value_head_dim), model.dtype, model.device,
        recurrent_dtype=getattr(torch, ssm), num_snapshot_slots=state_snapshot_slots(config, max_running),
    )  # fmt: skip


def make_page_table(pool: KVPool, max_running: int, context_len: int, device: torch.device) -> PageTable:
    """One row per running request; each row holds up to ``context_len`` tokens of pages."""
    main, tail = page_table_widths(pool.spec, context_len)
    return PageTable(max_running, main, tail, device)


def resident_capacity(config: EngineConfig, model: CausalLM, tokens_per_request: int, context_len: int) -> int:
    """The most requests of ``tokens_per_request`` main-pool tokens (whole pages) the pool holds at once,
    ``max_running_requests`` set to that count (0 if not one fits).

    The tail pool and the page table grow with ``max_running_requests``, so the main pool shrinks as the
    count grows: binary-search the largest ``n`` whose pool still holds ``n`` requests.
    """

    def holds(n: int) -> bool:
        try:
            spec = pool_spec(replace(config, max_running_requests=n), model, n, context_len)
        except ValueError:  # the tail pool alone exceeds the budget
            return False
        return spec.max_total_num_tokens >= n * tokens_per_request

    return most_that_fit(holds)


def build_cache_manager(
    config: EngineConfig, pool: KVPool, page_table: PageTable, states: StatePool | None = None
) -> BaseCacheManager:
    """The tail rule alone, or with prefix reuse (a radix tree), optionally over a host-memory tier; for a
    hybrid model (``states``) the radix tree with state snapshots, never the host tier."""
    if config.disable_radix_cache:
        return TieredCacheManager(pool, page_table)
    if states is not None:
        return StatePrefixCacheManager(pool, page_table, states)
    host = None
    if config.enable_hierarchical_cache:
        gib = config.hicache_size or 2 * pool.spec.main_bytes() / (1 << 30)  # SGLang's default ratio: 2
        host = HostTier(pool, max(1, host_pages_for(pool.spec, gib)))
        logger.info(
            f"Host KV tier: {host.num_pages} pages, {host.nbytes / (1 << 30):.2f} GiB, {config.hicache_write_policy}"
        )
    return PrefixCacheManager(pool, page_table, host=host, write_policy=config.hicache_write_policy)
