"""Model shapes for the capacity planner: parsed from an HF ``config.json`` or a built-in preset.

Only full-attention GQA/MHA models are sized: sliding-window, chunked, hybrid and MLA configs are
rejected with a :class:`PlanError` naming the field, never sized wrongly.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from nibblekv.model.presets import PRESETS

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

    @property
    def values_per_token(self) -> int:
        """K and V elements one token stores across all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim


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


def shape_from_config(cfg: Mapping[str, Any], name: str) -> ModelShape:
    """Validate a ``config.json`` dict and extract its :class:`ModelShape`.

    ``num_key_value_heads`` defaults to ``num_attention_heads`` when absent (plain multi-head
    attention), as in Hugging Face's Llama/Mistral/Qwen configs.
    """
    check_full_attention(cfg)
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
    raise PlanError(
        f"unknown model {spec!r}: not a built-in ({', '.join(sorted(PRESETS))}) nor a config.json path"
    )
