"""Model shapes for the capacity planner: parsed from an HF ``config.json`` or a built-in preset.

Full-attention GQA/MHA models are sized, and the hybrid Gated-DeltaNet families (Qwen3-Next, Qwen3.5:
KV only in their full-attention layers, plus a fixed linear-attention state per request). Sliding-window,
chunked, other hybrid and MLA configs are rejected with a :class:`PlanError` naming the field, never
sized wrongly.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from nibblekv.model.hub import HubFetchError, fetch, is_hub_id
from nibblekv.model.hybrid_config import SSM_DTYPE_BYTES, ssm_dtype_from
from nibblekv.model.presets import PRESETS

# model_type of the hybrid Gated-DeltaNet families (the MoE ones too: their KV and states size the same)
HYBRID_MODEL_TYPES: frozenset[str] = frozenset(
    {"qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"}
)
STATE_CONV_BYTES: int = 2  # the conv window is kept in the model dtype (bf16); the recurrent state: ssm_bytes

# config fields that mean "not every layer keeps a full-context GQA cache"
_NON_FULL_ATTENTION_FIELDS: tuple[str, ...] = (
    "attention_chunk_size",
    "sliding_window_pattern",
    "layers_block_type",
    "hybrid_override_pattern",
)


class PlanError(ValueError):
    """Bad planner input; the message is one line naming the problem."""


def exact(x: float | Fraction) -> Fraction:
    """The decimal value as written (``0.9`` -> 9/10), not its binary float approximation."""
    return x if isinstance(x, Fraction) else Fraction(repr(x))


# --------------------------------------------------------------------------- model shape


@dataclass(frozen=True)
class HybridShape:
    """A hybrid model's layer split and Gated DeltaNet dims (HF's ``linear_*`` fields)."""

    kv_layers: int  # full-attention layers: the only ones with KV
    linear_layers: int
    key_heads: int
    value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    ssm_bytes: int = 4  # the recurrent state's element (config mamba_ssm_dtype; float32 where absent)

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_heads * self.key_head_dim + self.value_heads * self.value_head_dim

    @property
    def state_bytes_per_request(self) -> int:
        """Recurrent state ``[HV, K, V]`` + bf16 conv window ``[C, W-1]``, over the linear layers."""
        rec = self.value_heads * self.key_head_dim * self.value_head_dim * self.ssm_bytes
        return self.linear_layers * (rec + self.conv_dim * (self.conv_kernel - 1) * STATE_CONV_BYTES)


@dataclass(frozen=True)
class ModelShape:
    """What the planner needs from a ``config.json``: attention geometry plus size fields."""

    name: str
    model_type: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int | None
    intermediate_size: int | None
    vocab_size: int | None
    tie_word_embeddings: bool
    max_position_embeddings: int | None
    hybrid: HybridShape | None = None

    @property
    def num_kv_layers(self) -> int:
        """Layers with KV: all, or a hybrid model's full-attention layers."""
        return self.num_layers if self.hybrid is None else self.hybrid.kv_layers

    @property
    def state_bytes_per_request(self) -> int:
        """Linear-attention state bytes of one request (0 for non-hybrid models)."""
        return 0 if self.hybrid is None else self.hybrid.state_bytes_per_request

    @property
    def values_per_token(self) -> int:
        """K and V elements one token stores across all (KV-holding) layers."""
        return 2 * self.num_kv_layers * self.num_kv_heads * self.head_dim


def _missing(cfg: Mapping[str, Any], key: str) -> PlanError:
    """The error for a config lacking ``key`` (mentioning a nested text_config if there is one)."""
    hint = (
        " (its text model is under 'text_config', which the planner does not read)"
        if "text_config" in cfg
        else ""
    )
    return PlanError(f"config has no {key!r}{hint}")


def _positive_int(cfg: Mapping[str, Any], key: str) -> int:
    """``cfg[key]`` as a positive int, or a PlanError naming the field."""
    value = cfg.get(key)
    if value is None:
        raise _missing(cfg, key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(f"config field {key!r} must be a positive integer, got {value!r}")
    return value


def _optional_int(cfg: Mapping[str, Any], key: str) -> int | None:
    """``cfg[key]`` as a positive int, None when absent or null."""
    return None if cfg.get(key) is None else _positive_int(cfg, key)


def check_full_attention(cfg: Mapping[str, Any]) -> None:
    """Raise PlanError unless every layer keeps a full-context GQA/MHA K and V cache."""
    if cfg.get("kv_lora_rank") is not None:
        rank = cfg["kv_lora_rank"]
        raise PlanError(
            f"config uses MLA (kv_lora_rank={rank!r}): its latent KV cache is not sized by this planner"
        )
    layer_types = cfg.get("layer_types")
    if layer_types is not None:
        others = sorted({str(t) for t in layer_types} - {"full_attention"})
        if others:
            raise PlanError(
                f"config field 'layer_types' has non-full-attention layers {others}: not supported"
            )
    window = cfg.get("sliding_window")
    if window is not None and cfg.get("use_sliding_window", True):
        raise PlanError(f"config uses sliding-window attention (sliding_window={window!r}): not supported")
    for key in _NON_FULL_ATTENTION_FIELDS:
        if cfg.get(key) is not None:
            raise PlanError(
                f"config field {key!r}={cfg[key]!r} means not all layers use full attention: not supported"
            )


def _head_dim(cfg: Mapping[str, Any], num_heads: int) -> int:
    """``head_dim`` if the config has it, else ``hidden_size / num_attention_heads`` (exact)."""
    if cfg.get("head_dim") is not None:
        return _positive_int(cfg, "head_dim")
    if cfg.get("hidden_size") is None:
        raise _missing(cfg, "head_dim")
    hidden = _positive_int(cfg, "hidden_size")
    if hidden % num_heads:
        raise PlanError(
            f"config has no 'head_dim' and hidden_size {hidden} is not divisible by {num_heads} heads"
        )
    return hidden // num_heads


def _hybrid_shape(cfg: Mapping[str, Any], num_layers: int) -> HybridShape:
    """Layer split (``layer_types``, else every ``full_attention_interval``-th layer) and linear dims (HF's
    defaults where absent)."""
    types = cfg.get("layer_types")
    if not types:
        interval = int(cfg.get("full_attention_interval", 4))
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers)]
    others = sorted({str(t) for t in types} - {"full_attention", "linear_attention"})
    if others or len(types) != num_layers:
        raise PlanError(f"config field 'layer_types' must name {num_layers} full/linear_attention layers, got {others or len(types)}")
    kv = sum(t == "full_attention" for t in types)
    return HybridShape(
        kv_layers=kv,
        linear_layers=num_layers - kv,
        key_heads=int(cfg.get("linear_num_key_heads", 16)),
        value_heads=int(cfg.get("linear_num_value_heads", 32)),
        key_head_dim=int(cfg.get("linear_key_head_dim", 128)),
        value_head_dim=int(cfg.get("linear_value_head_dim", 128)),
        conv_kernel=int(cfg.get("linear_conv_kernel_dim", 4)),
        ssm_bytes=SSM_DTYPE_BYTES[_ssm_dtype(cfg)],
    )


def _ssm_dtype(cfg: Mapping[str, Any]) -> str:
    try:
        return ssm_dtype_from(cfg)
    except ValueError as exc:
        raise PlanError(str(exc)) from None


def hybrid_param_counts(shape: ModelShape, cfg: Mapping[str, Any]) -> tuple[int, int]:
    """(linear-layer weights FP8 can hold, the rest: norms, decays, conv, beta / gate projections) of a dense
    hybrid model; PlanError for MoE."""
    h, hy = shape.hidden_size, shape.hybrid
    assert hy is not None
    experts = cfg.get("num_experts", 512 if shape.model_type == "qwen3_next" else 0)
    if "moe" in shape.model_type or experts:
        raise PlanError(f"config is mixture-of-experts (num_experts={experts}): cannot estimate weights; pass --weights-gib")
    if h is None or shape.intermediate_size is None or shape.vocab_size is None:
        raise PlanError("config lacks hidden_size, intermediate_size or vocab_size; pass --weights-gib")
    q, kv, vdim = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim, hy.value_heads * hy.value_head_dim
    attn = h * 2 * q + 2 * h * kv + q * h  # q_proj carries the output gate: twice the query width
    linear = h * (hy.conv_dim + vdim) + vdim * h  # in_proj_qkv(z) + out_proj
    mlp = 3 * h * shape.intermediate_size
    big = hy.kv_layers * attn + hy.linear_layers * linear + shape.num_layers * mlp
    # NOTE: in_proj_b(a) (one output per value head) stays in the model dtype under FP8 weights (model.fp8)
    small = (shape.num_layers * 2 * h + hy.kv_layers * 2 * shape.head_dim
             + hy.linear_layers * (hy.conv_dim * hy.conv_kernel + 2 * hy.value_heads + hy.value_head_dim
                                   + 2 * hy.value_heads * h))  # fmt: skip
    embeddings = shape.vocab_size * h * (1 if shape.tie_word_embeddings else 2)
    return big, small + embeddings + h


def text_config(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """A hybrid vision-language config's decoder fields (Qwen3.5 nests them in ``text_config``); else ``cfg``."""
    inner = cfg.get("text_config")
    if str(cfg.get("model_type", "")) in HYBRID_MODEL_TYPES and isinstance(inner, Mapping):
        return {**inner, **{k: v for k, v in cfg.items() if k != "text_config"}}  # top-level keys win, as the engine's
    return cfg


def shape_from_config(cfg: Mapping[str, Any], name: str) -> ModelShape:
    """Validate a ``config.json`` dict and extract its :class:`ModelShape`.

    ``num_key_value_heads`` defaults to ``num_attention_heads`` when absent (plain multi-head
    attention), as in Hugging Face's Llama/Mistral/Qwen configs.
    """
    cfg = text_config(cfg)
    hybrid = str(cfg.get("model_type", "")) in HYBRID_MODEL_TYPES
    check_full_attention({k: v for k, v in cfg.items() if k != "layer_types"} if hybrid else cfg)
    num_layers = _positive_int(cfg, "num_hidden_layers")
    num_heads = _positive_int(cfg, "num_attention_heads")
    num_kv_heads = (
        num_heads if cfg.get("num_key_value_heads") is None else _positive_int(cfg, "num_key_value_heads")
    )
    return ModelShape(
        name=name,
        model_type=str(cfg.get("model_type", "")),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=_head_dim(cfg, num_heads),
        hidden_size=_optional_int(cfg, "hidden_size"),
        intermediate_size=_optional_int(cfg, "intermediate_size"),
        vocab_size=_optional_int(cfg, "vocab_size"),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_position_embeddings=_optional_int(cfg, "max_position_embeddings"),
        hybrid=_hybrid_shape(cfg, num_layers) if hybrid else None,
    )


def read_config(path: Path) -> dict[str, Any]:
    """Parse a ``config.json`` (or a directory holding one) into a dict."""
    file = path / "config.json" if path.is_dir() else path
    try:
        cfg = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanError(f"cannot read model config {str(file)!r}: {exc}".replace("\n", " ")) from exc
    if not isinstance(cfg, dict):
        raise PlanError(f"model config {str(file)!r} is not a JSON object")
    return cfg


def resolve_model(spec: str) -> tuple[str, dict[str, Any]]:
    """``--model`` value -> (name, config dict): a built-in preset name or a config.json path."""
    key = spec.strip().lower()
    if key in PRESETS:
        return key, dict(PRESETS[key])
    path = Path(spec)
    if path.exists():
        return spec, read_config(path)
    if is_hub_id(spec):  # NOTE: its config.json alone, fetched from the Hugging Face Hub (model.hub)
        try:
            return spec, read_config(fetch(spec, weights=False))
        except HubFetchError as exc:
            raise PlanError(str(exc)) from exc
    raise PlanError(
        f"unknown model {spec!r}: not a built-in ({', '.join(sorted(PRESETS))}), a config.json path nor a "
        "Hub id"
    )
