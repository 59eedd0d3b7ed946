"""Capacity planning: how many tokens and full-context sessions of KV cache fit on one GPU.

Everything here is a pure function of its inputs. The KV size of a token comes from
:func:`nibblekv.formats.bytes_per_value`, the same definition the engine allocates with, so
the planner and the cache cannot disagree. Memory arithmetic is done in exact fractions (the
decimal inputs as written, e.g. ``0.9`` is 9/10), so a budget that lands exactly on a session
boundary is not lost to float rounding.

Full-attention GQA/MHA models and the hybrid Gated-DeltaNet families are sized (see
:mod:`nibblekv.planner.shape`); other configs are rejected with a :class:`PlanError` naming the field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from nibblekv.formats import KVDtype, PageLayout, bytes_per_value
from nibblekv.model.presets import PRESETS, published_weights_gib
from nibblekv.planner.engine_fit import EngineOptions, resident_requests
from nibblekv.planner.shape import (  # noqa: F401  (re-exported: the planner's public names)
    ModelShape,
    PlanError,
    exact,
    hybrid_param_counts,
    read_config,
    resolve_model,
    shape_from_config,
    text_config,
)

GIB: int = 2**30
MIB: int = 2**20

# KV dtypes the planner reports, in output order
PLAN_KV_DTYPES: tuple[KVDtype, ...] = (KVDtype.BF16, KVDtype.FP8, KVDtype.NVFP4)

# weight dtype -> bytes per parameter of the quantized linear layers (NVFP4: 4 bits + one FP8
# scale per 16). Embeddings, lm_head, norms and biases stay bf16 in published checkpoints.
WEIGHT_BYTES_PER_PARAM: dict[str, Fraction] = {
    "bf16": Fraction(2),
    "fp8": Fraction(1),
    "nvfp4": Fraction(1, 2) + Fraction(1, 16),
}
_UNQUANTIZED_BYTES_PER_PARAM = Fraction(2)

# config fields that mean mixture-of-experts (weights cannot be estimated as a dense model)
_MOE_FIELDS: tuple[str, ...] = (
    "num_local_experts",
    "num_experts",
    "n_routed_experts",
    "moe_intermediate_size",
)


# --------------------------------------------------------------------------- KV size


def kv_bytes_per_token(shape: ModelShape, dtype: KVDtype) -> int:
    """K + V bytes of one token across all layers, scales included (engine's definition).

    Raises PlanError when the engine cannot store this head_dim in ``dtype``.
    """
    try:
        PageLayout(dtype, shape.num_kv_heads, shape.head_dim, page_size=1)
    except ValueError as exc:
        raise PlanError(str(exc)) from exc
    total = Fraction(shape.values_per_token) * exact(bytes_per_value(dtype))
    if total.denominator != 1:
        raise PlanError(f"{dtype.value} KV of {shape.values_per_token} values is not a whole number of bytes")
    return int(total)


# --------------------------------------------------------------------------- weights


@dataclass(frozen=True)
class ParamCount:
    """Parameters split by how quantized checkpoints store them."""

    quantizable: int  # decoder linear weights (attention and MLP projections)
    unquantized: int  # embeddings, lm_head, norms, biases: bf16 in every published checkpoint

    @property
    def total(self) -> int:
        return self.quantizable + self.unquantized


def _require_size(shape: ModelShape, field: str) -> int:
    """A size field needed by the parameter estimate, or a PlanError suggesting --weights-gib."""
    value = getattr(shape, field)
    if value is None:
        raise PlanError(f"config has no {field!r}, needed to estimate the weights; pass --weights-gib")
    return int(value)


def estimate_params(shape: ModelShape, cfg: Mapping[str, Any]) -> ParamCount:
    """Parameter count of a dense Llama-style decoder (gated MLP, RMSNorm) from its config."""
    if shape.hybrid is not None:
        quantizable, unquantized = hybrid_param_counts(shape, text_config(cfg))
        return ParamCount(quantizable=quantizable, unquantized=unquantized)
    moe = [k for k in _MOE_FIELDS if cfg.get(k) is not None]
    if moe:
        raise PlanError(
            f"config is mixture-of-experts ({moe[0]}): cannot estimate weights; pass --weights-gib"
        )
    hidden = _require_size(shape, "hidden_size")
    inter = _require_size(shape, "intermediate_size")
    vocab = _require_size(shape, "vocab_size")
    q_width = shape.num_heads * shape.head_dim
    kv_width = shape.num_kv_heads * shape.head_dim
    attn = 2 * hidden * q_width + 2 * hidden * kv_width
    mlp = 3 * hidden * inter
    qkv_bias = bool(cfg.get("attention_bias", False)) or shape.model_type == "qwen2"
    biases = (q_width + 2 * kv_width if qkv_bias else 0) + (hidden if cfg.get("attention_bias") else 0)
    biases += 2 * inter + hidden if cfg.get("mlp_bias") else 0
    qk_norm = 2 * shape.head_dim if shape.model_type == "qwen3" else 0
    per_layer_small = 2 * hidden + biases + qk_norm
    embeddings = vocab * hidden * (1 if shape.tie_word_embeddings else 2)
    return ParamCount(
        quantizable=shape.num_layers * (attn + mlp),
        unquantized=embeddings + shape.num_layers * per_layer_small + hidden,
    )


def estimate_weights_gib(params: ParamCount, weights_dtype: str) -> float:
    """Checkpoint size in GiB with linear layers in ``weights_dtype`` and the rest in bf16."""
    per_param = WEIGHT_BYTES_PER_PARAM[weights_dtype]
    total = params.quantizable * per_param + params.unquantized * _UNQUANTIZED_BYTES_PER_PARAM
    return float(total / GIB)


@dataclass(frozen=True)
class Weights:
    """The weights' footprint and where the number came from."""

    dtype: str | None  # None when given only as --weights-gib
    gib: float
    source: str  # "explicit", "published" or "estimated"


def _is_fp8_config(qc: Mapping[str, Any]) -> bool:
    """An HF ``quantization_config`` of the FP8 checkpoints the engine loads (block ``fp8`` or
    compressed-tensors ``float-quantized``); the engine itself validates the details."""
    method = qc.get("quant_method")
    return method == "fp8" or (method == "compressed-tensors" and qc.get("format") == "float-quantized")


def resolve_weights(
    name: str, shape: ModelShape, cfg: Mapping[str, Any], weights_dtype: str | None, weights_gib: float | None
) -> Weights:
    """Explicit GiB if given, else the published size for (model, dtype), else an estimate."""
    if weights_gib is not None:
        if not math.isfinite(weights_gib) or weights_gib < 0:
            raise PlanError(f"--weights-gib must be a non-negative number, got {weights_gib}")
        return Weights(dtype=weights_dtype, gib=weights_gib, source="explicit")
    if weights_dtype is None:
        weights_dtype = "bf16"
        qc = cfg.get("quantization_config")
        if qc is not None:
            if not _is_fp8_config(qc):
                raise PlanError(
                    "config has a non-FP8 'quantization_config': pass --weights-dtype or --weights-gib"
                )
            weights_dtype = "fp8"  # an FP8 checkpoint (what `nibblekv serve` loads as FP8)
    if weights_dtype not in WEIGHT_BYTES_PER_PARAM:
        raise PlanError(
            f"unknown weights dtype {weights_dtype!r}; choose from {', '.join(WEIGHT_BYTES_PER_PARAM)}"
        )
    published = published_weights_gib(name, weights_dtype) if name in PRESETS else None
    if published is not None:
        return Weights(dtype=weights_dtype, gib=published, source="published")
    gib = estimate_weights_gib(estimate_params(shape, cfg), weights_dtype)
    return Weights(dtype=weights_dtype, gib=gib, source="estimated")


# --------------------------------------------------------------------------- GPU and memory rule


@dataclass(frozen=True)
class Gpu:
    """A card and the total memory its driver reports, in GiB."""

    name: str
    reported_gib: float


# name -> memory as the driver reports it (nvidia-smi's MiB, or the documented GiB)
GPUS: dict[str, Gpu] = {
    "H200": Gpu("H200", 143771 / 1024),
    "H100": Gpu("H100", 81559 / 1024),  # H100 80GB SXM
    "RTX-PRO-6000-SE": Gpu("RTX-PRO-6000-SE", 95.6),  # RTX PRO 6000 Blackwell Server Edition
}


def parse_gpu(spec: str) -> Gpu:
    """``--gpu`` value -> Gpu: a known name (any case) or a memory size in GiB."""
    key = spec.strip().upper()
    if key in GPUS:
        return GPUS[key]
    try:
        gib = float(spec)
    except ValueError:
        raise PlanError(
            f"unknown GPU {spec!r}: use one of {', '.join(GPUS)} or the reported memory in GiB"
        ) from None
    if not math.isfinite(gib) or gib <= 0:
        raise PlanError(f"GPU memory must be a positive number of GiB, got {spec!r}")
    return Gpu(f"{gib:g} GiB", gib)


@dataclass(frozen=True)
class MemoryRule:
    """KV budget = reported x mem_fraction - reserve_gib - weights."""

    mem_fraction: float = 0.9
    reserve_gib: float = 3.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.mem_fraction) and 0 < self.mem_fraction <= 1):
            raise PlanError(f"--mem-fraction must be in (0, 1], got {self.mem_fraction}")
        if not (math.isfinite(self.reserve_gib) and self.reserve_gib >= 0):
            raise PlanError(f"--reserve-gib must be a non-negative number, got {self.reserve_gib}")

    def kv_budget_bytes(self, gpu: Gpu, weights: Weights) -> Fraction:
        """Bytes left for KV (negative when the weights and reserve do not fit)."""
        gib = (
            exact(gpu.reported_gib) * exact(self.mem_fraction) - exact(self.reserve_gib) - exact(weights.gib)
        )
        return gib * GIB


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class KVPlan:
    """Capacity of one KV dtype."""

    dtype: KVDtype
    bytes_per_token: int
    gib_per_session: float
    tokens: int
    sessions: int

    def to_json(self) -> dict[str, int | float]:
        return {
            "bytes_per_token": self.bytes_per_token,
            "gib_per_session": self.gib_per_session,
            "tokens": self.tokens,
            "sessions": self.sessions,
        }


def plan_kv(shape: ModelShape, dtype: KVDtype, context: int, budget_bytes: Fraction) -> KVPlan:
    """Tokens and full-context sessions of ``dtype`` KV that fit in ``budget_bytes`` (a hybrid model's session
    also holds its linear-attention state)."""
    per_token = kv_bytes_per_token(shape, dtype)
    tokens = max(0, math.floor(budget_bytes / per_token))
    per_session = per_token * context + shape.state_bytes_per_request
    return KVPlan(
        dtype=dtype,
        bytes_per_token=per_token,
        gib_per_session=float(Fraction(per_session, GIB)),
        tokens=tokens,
        sessions=max(0, math.floor(budget_bytes / per_session)),
    )


@dataclass(frozen=True)
class Plan:
    """The full answer: inputs as resolved, the KV budget, and one KVPlan per KV dtype."""

    model: ModelShape
    gpu: Gpu
    weights: Weights
    rule: MemoryRule
    context: int
    kv_budget_gib: float
    kv: tuple[KVPlan, ...]
    unsupported: tuple[tuple[str, str], ...]  # (kv dtype, why) for dtypes this model cannot use
    engine: EngineOptions = field(default_factory=EngineOptions)
    # (kv dtype, sessions resident at once as the engine sizes its pool: tail, sink pages, page table paid)
    requests: tuple[tuple[str, int], ...] = ()

    def kv_plan(self, dtype: KVDtype) -> KVPlan | None:
        """The plan for ``dtype``, None when unsupported for this model."""
        return next((p for p in self.kv if p.dtype is dtype), None)

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` document."""
        return {
            "model": {
                "name": self.model.name,
                "num_layers": self.model.num_layers,
                "num_kv_layers": self.model.num_kv_layers,
                "state_bytes_per_request": self.model.state_bytes_per_request,
                "num_kv_heads": self.model.num_kv_heads,
                "head_dim": self.model.head_dim,
                "values_per_token": self.model.values_per_token,
                "max_position_embeddings": self.model.max_position_embeddings,
            },
            "gpu": {"name": self.gpu.name, "reported_gib": self.gpu.reported_gib},
            "weights": {"dtype": self.weights.dtype, "gib": self.weights.gib, "source": self.weights.source},
            "memory": {
                "mem_fraction": self.rule.mem_fraction,
                "reserve_gib": self.rule.reserve_gib,
                "kv_budget_gib": self.kv_budget_gib,
            },
            "context": self.context,
            "kv": {p.dtype.value: p.to_json() for p in self.kv},
            "unsupported_kv": dict(self.unsupported),
            "engine": {
                "page_size": self.engine.page_size,
                "kv_recent_window": self.engine.kv_recent_window,
                "chunked_prefill_size": self.engine.chunked_prefill_size,
                "requests": dict(self.requests),
            },
        }


def make_plan(
    shape: ModelShape, gpu: Gpu, weights: Weights, context: int, rule: MemoryRule, engine: EngineOptions | None = None
) -> Plan:
    """Size every KV dtype of :data:`PLAN_KV_DTYPES` for ``context``-token sessions: the raw token count,
    and the sessions the engine (``engine`` options) holds at once."""
    if context < 1:
        raise PlanError(f"--context must be a positive number of tokens, got {context}")
    engine = engine or EngineOptions()
    budget = rule.kv_budget_bytes(gpu, weights)
    plans: list[KVPlan] = []
    unsupported: list[tuple[str, str]] = []
    requests: list[tuple[str, int]] = []
    for dtype in PLAN_KV_DTYPES:
        try:
            plans.append(plan_kv(shape, dtype, context, budget))
        except PlanError as exc:
            unsupported.append((dtype.value, str(exc)))
            continue
        n = resident_requests(shape, dtype, max(budget, Fraction(0)), engine.request_tokens(context), context, engine)
        requests.append((dtype.value, n))
    return Plan(
        shape, gpu, weights, rule, context, float(budget / GIB), tuple(plans), tuple(unsupported), engine,
        tuple(requests),
    )  # fmt: skip


def plan_for(
    model: str,
    gpu: str,
    context: int,
    *,
    weights_dtype: str | None = None,
    weights_gib: float | None = None,
    rule: MemoryRule | None = None,
    engine: EngineOptions | None = None,
    mamba_ssm_dtype: str | None = None,
) -> Plan:
    """Resolve the string inputs of ``nibblekv plan`` and build the :class:`Plan` (``mamba_ssm_dtype``: a
    hybrid model's recurrent-state dtype instead of its config's, as the engine's flag)."""
    if context < 1:
        raise PlanError(f"--context must be a positive number of tokens, got {context}")
    name, cfg = resolve_model(model)
    if mamba_ssm_dtype is not None:
        cfg = {**cfg, "mamba_ssm_dtype": mamba_ssm_dtype}
    shape = shape_from_config(cfg, name)
    card = parse_gpu(gpu)
    weights = resolve_weights(name, shape, cfg, weights_dtype, weights_gib)
    return make_plan(shape, card, weights, context, rule or MemoryRule(), engine)
