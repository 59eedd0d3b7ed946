"""``--context-length`` past the model's ``max_position_embeddings``: refused unless ``--allow-long-context``.

SGLang refuses such a context length unless ``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1``; here the opt-in
is a config field (:attr:`~nibblekv.config.EngineConfig.allow_long_context`). When it is used, one warning
line names both lengths and the RoPE scaling in effect (from the model config or
``--json-model-override-args``), since positions past the trained range are only as good as that scaling.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from nibblekv.config import EngineConfig
from nibblekv.model.config import RopeScaling
from nibblekv.model.presets import PRESETS

logger = logging.getLogger("nibblekv")


def describe_rope_scaling(scaling: RopeScaling) -> str:
    """One phrase for the log line, e.g. ``llama3 (factor 8.0, original_max_position_embeddings 8192)``."""
    if scaling.rope_type == "default":
        return "none"
    if scaling.rope_type == "linear":
        return f"linear (factor {scaling.factor})"
    if scaling.rope_type == "yarn":
        return (
            f"yarn (factor {scaling.factor}, original_max_position_embeddings "
            f"{scaling.original_max_position_embeddings}, beta_fast {scaling.beta_fast}, "
            f"beta_slow {scaling.beta_slow}, "
            f"attention_factor {scaling.attention_factor:.4f})"
        )
    if scaling.rope_type == "freq_factors":
        return f"freq_factors ({len(scaling.freq_factors)} values from the GGUF)"
    return (
        f"{scaling.rope_type} (factor {scaling.factor}, low_freq_factor {scaling.low_freq_factor}, "
        f"high_freq_factor {scaling.high_freq_factor}, original_max_position_embeddings "
        f"{scaling.original_max_position_embeddings})"
    )


def long_context_error(context_length: int, max_position_embeddings: int) -> str:
    return (
        f"--context-length {context_length} exceeds the model's max_position_embeddings "
        f"{max_position_embeddings}; pass --allow-long-context to serve it anyway (with RoPE scaling for "
        "those "
        "positions in the model config or --json-model-override-args, e.g. "
        '\'{"rope_scaling": {"rope_type": "llama3", "factor": 64.0, ...}}\')'
    )


def check_context_length(
    config: EngineConfig, max_position_embeddings: int, rope_scaling: RopeScaling
) -> int:
    """The context length the engine serves; ``ValueError`` naming the flag when it passes the model's
    positions without ``allow_long_context``; with it, a warning line naming both and the RoPE scaling."""
    context_len = config.context_length or max_position_embeddings
    if context_len <= max_position_embeddings:
        return context_len
    if not config.allow_long_context:
        raise ValueError(long_context_error(context_len, max_position_embeddings))
    logger.warning(
        "--allow-long-context: context length %d exceeds the model's max_position_embeddings %d; "
        "RoPE scaling: %s",
        context_len,
        max_position_embeddings,
        describe_rope_scaling(rope_scaling),
    )
    return context_len


def max_positions_before_load(config: EngineConfig) -> int | None:
    """``max_position_embeddings`` of a preset, an HF folder (with the JSON overrides) or a GGUF (its header),
    read without loading weights; None when it cannot be told cheaply (the engine checks once loaded)."""
    raw: dict[str, Any]
    gguf = _gguf_path(config)
    if gguf is not None:
        try:
            from nibblekv.model.gguf_loader import gguf_config, open_gguf

            return gguf_config(open_gguf(gguf)).max_position_embeddings
        except Exception:  # NOTE: the loader reports an unreadable GGUF with its own message
            return None
    if config.model in PRESETS and config.load_format == "dummy" and not Path(config.model).exists():
        raw = dict(PRESETS[config.model])
    elif config.model is not None and (Path(config.model) / "config.json").is_file():
        try:
            raw = json.loads((Path(config.model) / "config.json").read_text())
        except (OSError, json.JSONDecodeError):
            return None  # NOTE: the loader reports a broken config.json with its own message
    else:
        return None
    raw.update(config.model_overrides())
    value = raw.get("max_position_embeddings")
    return int(value) if isinstance(value, int) else None


def _gguf_path(config: EngineConfig) -> Path | None:
    """The GGUF file the engine would load (the bundled model without ``--model``), or None."""
    if config.load_format not in ("auto", "gguf"):
        return None
    if config.model is None:
        from nibblekv.model.loader import bundled_model_path

        try:
            return bundled_model_path()
        except Exception:  # NOTE: a missing bundled model is reported by the loader
            return None
    path = Path(config.model)
    return path if path.is_file() and path.suffix == ".gguf" else None


def context_length_cli_error(config: EngineConfig) -> str | None:
    """Why the CLI should refuse ``--context-length`` before the engine starts, or None."""
    if config.context_length is None or config.allow_long_context:
        return None
    limit = max_positions_before_load(config)
    if limit is None or config.context_length <= limit:
        return None
    return long_context_error(config.context_length, limit)
