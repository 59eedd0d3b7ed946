"""Model shape and numerics, read from an HF ``config.json`` dict or from GGUF metadata.

One frozen :class:`ModelConfig` describes every decoder we run (Llama / SmolLM2 / Llama 3.x, Mistral,
Qwen2 / Qwen2.5, Qwen3) and the dense hybrid Gated-DeltaNet models (Qwen3-Next, Qwen3.5: see
:mod:`nibblekv.model.hybrid_config`, run by :mod:`nibblekv.model.hybrid`). Anything the decoders cannot run exactly
(sliding-window attention in use, mixture of experts, multi-head latent attention, unknown RoPE
scaling) is rejected here with a ``ValueError``, so a model never silently runs with the wrong math.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from nibblekv.model.hybrid_config import (
    FULL_ATTENTION,
    HYBRID_MODEL_TYPES,
    LinearAttentionConfig,
    hybrid_fields,
    reject_hybrid_moe,
)

# HF ``model_type`` -> architecture we implement. Mistral is Llama math (no sliding window in use).
SUPPORTED_MODEL_TYPES: frozenset[str] = frozenset({"llama", "mistral", "qwen2", "qwen3", "qwen3_next", "qwen3_5"})
# RoPE scaling types implemented in :mod:`nibblekv.model.rope`.
SUPPORTED_ROPE_TYPES: frozenset[str] = frozenset({"default", "linear", "llama3", "yarn"})

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
# HF keys whose presence (with a truthy value) means a mixture-of-experts model.
_MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")
def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_from_hf(raw: Mapping[str, Any], max_position_embeddings: int) -> RopeScaling:
    """YaRN as HF's ``_compute_yarn_parameters`` reads it (Qwen3's long-context recipe)."""
    original = int(raw.get("original_max_position_embeddings") or max_position_embeddings)
    factor = raw.get("factor")
    factor = float(factor) if factor is not None else max_position_embeddings / original
    attention = raw.get("attention_factor")
    if attention is None:
        mscale, mscale_all_dim = raw.get("mscale"), raw.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention = _yarn_mscale(factor)
    return RopeScaling(
        rope_type="yarn", factor=factor, original_max_position_embeddings=original,
        beta_fast=float(raw.get("beta_fast") or 32.0), beta_slow=float(raw.get("beta_slow") or 1.0),
        truncate=bool(raw.get("truncate", True)), attention_factor=float(attention),
    )  # fmt: skip


# HF keys that mean multi-head latent attention (DeepSeek-style).
_MLA_KEYS = ("kv_lora_rank", "q_lora_rank")


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling; ``rope_type="default"`` means none.

    ``factor`` applies to ``linear``, ``llama3`` and ``yarn``; the ``*_freq_factor`` fields only to ``llama3``,
    ``original_max_position_embeddings`` to ``llama3`` and ``yarn``, ``beta_fast`` / ``beta_slow`` / ``truncate``
    (the ramp between extrapolated and interpolated frequencies) and ``attention_factor`` (cos/sin scale,
    resolved from ``mscale`` / ``mscale_all_dim`` / ``factor`` as HF does) only to ``yarn`` (same meaning as in HF).
    ``freq_factors`` (type ``freq_factors``) are llama.cpp's per-frequency divisors, stored in GGUF
    files as the ``rope_freqs`` tensor (how llama.cpp encodes Llama 3.1 scaling).
    """

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    freq_factors: tuple[float, ...] = ()
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float = 1.0

    @staticmethod
    def from_hf(raw: Mapping[str, Any] | None, max_position_embeddings: int) -> RopeScaling:
        """Parse HF ``rope_scaling`` / ``rope_parameters``; raise ``ValueError`` for unsupported types."""
        if not raw:
            return RopeScaling()
        rope_type = str(raw.get("rope_type", raw.get("type", "default")))
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(
                f"unsupported RoPE scaling type {rope_type!r}; supported: {sorted(SUPPORTED_ROPE_TYPES)}"
            )
        if rope_type == "default":
            return RopeScaling()
        if rope_type == "linear":
            return RopeScaling(rope_type="linear", factor=float(raw["factor"]))
        if rope_type == "yarn":
            return _yarn_from_hf(raw, max_position_embeddings)
        return RopeScaling(
            rope_type="llama3",
            factor=float(raw["factor"]),
            low_freq_factor=float(raw["low_freq_factor"]),
            high_freq_factor=float(raw["high_freq_factor"]),
            # NOTE: HF falls back to max_position_embeddings when this key is missing.
            original_max_position_embeddings=int(
                raw.get("original_max_position_embeddings", max_position_embeddings)
            ),
        )


@dataclass(frozen=True)
class ModelConfig:
    """Everything the decoder needs to know about a checkpoint.

    ``attention_bias`` is a bias on the q/k/v projections; ``o_proj_bias`` one on the output
    projection (Llama's ``attention_bias`` sets both; Qwen2 has only the former). ``qk_norm`` is
    Qwen3's per-head RMSNorm on q and k before RoPE. ``dtype`` is the checkpoint's stored dtype.
    """

    architecture: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling = RopeScaling()
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    o_proj_bias: bool = False
    qk_norm: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    dtype: torch.dtype = torch.float32
    # Hybrid models only: each layer's kind (``LINEAR_ATTENTION`` / ``FULL_ATTENTION``), the linear
    # layers' shape, RoPE on the first ``partial_rotary_factor`` of each head, and the sigmoid gate on
    # the attention output (q_proj yields query and gate). Empty / None / 1.0 / False otherwise.
    layer_types: tuple[str, ...] = ()
    linear_attention: LinearAttentionConfig | None = None
    partial_rotary_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported architecture {self.architecture!r}; supported: {sorted(SUPPORTED_MODEL_TYPES)}"
            )
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.rotary_dim % 2 != 0 or self.rotary_dim == 0:
            raise ValueError(f"RoPE needs an even rotary dim, got {self.rotary_dim}")
        if self.is_hybrid != (self.linear_attention is not None) or (
            self.layer_types and len(self.layer_types) != self.num_layers
        ):
            raise ValueError("a hybrid model needs layer_types for every layer and its linear-attention shape")

    @property
    def is_hybrid(self) -> bool:
        """Whether some layers are Gated DeltaNet linear attention (no KV cache)."""
        return self.architecture in HYBRID_MODEL_TYPES

    @property
    def rotary_dim(self) -> int:
        """Dims of each head that RoPE rotates (the leading ones; HF's partial rotary)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def kv_layer_ids(self) -> tuple[int, ...]:
        """The layers that hold KV: every layer, or a hybrid model's full-attention layers."""
        if not self.is_hybrid:
            return tuple(range(self.num_layers))
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL_ATTENTION)

    @property
    def num_kv_layers(self) -> int:
        """Layers of the KV pool (only full-attention layers hold KV)."""
        return len(self.kv_layer_ids)

    @property
    def num_linear_layers(self) -> int:
        return self.num_layers - self.num_kv_layers

    def state_bytes_per_request(self, dtype: torch.dtype, ssm_dtype: str | None = None) -> int:
        """Linear-attention state bytes of one request over all layers (0 for non-hybrid models): the conv
        windows in ``dtype``, the recurrent states in ``ssm_dtype`` (default: the config's)."""
        if self.linear_attention is None:
            return 0
        conv = torch.finfo(dtype).bits // 8
        return self.num_linear_layers * self.linear_attention.state_bytes(conv, ssm_dtype)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @staticmethod
    def from_hf(raw: Mapping[str, Any]) -> ModelConfig:
        """Build from a parsed HF ``config.json``; ``ValueError`` for configs we cannot run exactly."""
        model_type = str(raw.get("model_type", ""))
        if model_type == "qwen3_5" and isinstance(raw.get("text_config"), Mapping):
            # Qwen3.5 checkpoints are vision-language: the decoder's fields live in text_config (top-level keys,
            # such as --json-model-override-args, win)
            top = {k: v for k, v in raw.items() if k != "text_config"}
            raw = {**raw["text_config"], **top, "model_type": "qwen3_5"}
        elif model_type == "qwen3_5_text":
            raw = {**raw, "model_type": "qwen3_5"}
            model_type = "qwen3_5"
        _reject_unsupported_hf(raw, model_type)
        hybrid = hybrid_fields(raw) if model_type in HYBRID_MODEL_TYPES else {}
        num_heads = int(raw["num_attention_heads"])
        hidden = int(raw["hidden_size"])
        max_pos = int(raw.get("max_position_embeddings", 4096))
        # NOTE: transformers 5 moved rope_theta / rope_scaling into ``rope_parameters``.
        rope_params = raw.get("rope_parameters") or {}
        rope_scaling_raw = raw.get("rope_scaling") or rope_params
        rope_theta = raw.get("rope_theta", rope_params.get("rope_theta", 10000.0))
        attention_bias = bool(raw.get("attention_bias", False))
        if raw.get("mlp_bias", False):
            raise ValueError("mlp_bias=True is not supported")
        return ModelConfig(
            architecture=model_type,
            num_layers=int(raw["num_hidden_layers"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_heads=num_heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
            head_dim=int(raw.get("head_dim") or hidden // num_heads),
            vocab_size=int(raw["vocab_size"]),
            max_position_embeddings=max_pos,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            rope_scaling=RopeScaling.from_hf(rope_scaling_raw, max_pos),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            # Qwen2's q/k/v always carry a bias; its o_proj never does.
            attention_bias=attention_bias or model_type == "qwen2",
            o_proj_bias=attention_bias and model_type != "qwen2",
            qk_norm=model_type in ("qwen3", *HYBRID_MODEL_TYPES),
            bos_token_id=_optional_int(raw.get("bos_token_id")),
            eos_token_ids=_int_tuple(raw.get("eos_token_id")),
            dtype=_DTYPES.get(str(raw.get("torch_dtype") or raw.get("dtype") or "float32"), torch.float32),
            **hybrid,
        )

    @staticmethod
    def from_gguf(
        meta: Mapping[str, Any], tensor_names: Collection[str], rope_freqs: Sequence[float] | None = None
    ) -> ModelConfig:
        """Build from GGUF metadata (key -> python value), the file's tensor names and, when the file
        has a ``rope_freqs`` tensor, its values.

        Bias, q/k-norm and weight tying are read from which tensors exist, as llama.cpp does.
        """
        arch = str(meta["general.architecture"])
        if arch not in ("llama", "qwen2", "qwen3"):
            raise ValueError(f"unsupported GGUF architecture {arch!r}; supported: llama, qwen2, qwen3")
        if f"{arch}.expert_count" in meta and int(meta[f"{arch}.expert_count"]) > 0:
            raise ValueError("mixture-of-experts GGUF models are not supported")
        if "rope_freqs.weight" in tensor_names and rope_freqs is None:
            raise ValueError("this GGUF has a rope_freqs tensor: pass its values as rope_freqs")

        def get(key: str, default: Any = None) -> Any:
            return meta.get(f"{arch}.{key}", default)

        num_heads = int(get("attention.head_count"))
        hidden = int(get("embedding_length"))
        rope_type = str(get("rope.scaling.type", "none"))
        if rope_type not in ("none", "linear"):
            raise ValueError(f"unsupported GGUF RoPE scaling {rope_type!r}")
        scaling = RopeScaling("linear", float(get("rope.scaling.factor"))) if rope_type == "linear" else RopeScaling()
        if rope_freqs is not None:
            if rope_type != "none":
                raise ValueError("GGUF with both rope_freqs and rope.scaling.type is not supported")
            scaling = RopeScaling("freq_factors", freq_factors=tuple(float(f) for f in rope_freqs))
        vocab = get("vocab_size") or len(meta.get("tokenizer.ggml.tokens", ()))
        name = str(meta.get("general.name", "")).lower()
        return ModelConfig(
            # NOTE: llama.cpp stores Mistral as "llama"; the math is identical when no sliding window.
            architecture="mistral" if arch == "llama" and "mistral" in name else arch,
            num_layers=int(get("block_count")),
            hidden_size=hidden,
            intermediate_size=int(get("feed_forward_length")),
            num_heads=num_heads,
            num_kv_heads=int(get("attention.head_count_kv") or num_heads),
            head_dim=int(get("attention.key_length") or get("rope.dimension_count") or hidden // num_heads),
            vocab_size=int(vocab),
            max_position_embeddings=int(get("context_length", 4096)),
            rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
            rope_theta=float(get("rope.freq_base", 10000.0)),
            rope_scaling=scaling,
            tie_word_embeddings="output.weight" not in tensor_names,
            attention_bias="blk.0.attn_q.bias" in tensor_names,
            o_proj_bias="blk.0.attn_output.bias" in tensor_names,
            qk_norm="blk.0.attn_q_norm.weight" in tensor_names,
            bos_token_id=_optional_int(meta.get("tokenizer.ggml.bos_token_id")),
            eos_token_ids=_int_tuple(meta.get("tokenizer.ggml.eos_token_id")),
            dtype=torch.float32,
        )


def _reject_unsupported_hf(raw: Mapping[str, Any], model_type: str) -> None:
    """Raise ``ValueError`` for HF configs whose math the decoder does not implement."""
    if model_type in ("qwen3_5_moe", "qwen3_5_moe_text"):
        raise ValueError(
            f"{model_type} (mixture-of-experts hybrid) is not supported: only dense hybrid models (qwen3_5, "
            "qwen3_next with num_experts=0) run; the sparse MoE block and its router are missing"
        )
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"unsupported model_type {model_type!r}; supported: {sorted(SUPPORTED_MODEL_TYPES)}")
    hybrid = model_type in HYBRID_MODEL_TYPES
    reject_hybrid_moe(raw, model_type)
    # NOTE: HF writes the MoE defaults (moe_intermediate_size ...) into dense hybrid configs too
    for key in () if hybrid else _MOE_KEYS:
        if raw.get(key):
            raise ValueError(f"mixture-of-experts models are not supported ({key}={raw[key]!r})")
    for key in _MLA_KEYS:
        if raw.get(key):
            raise ValueError(f"multi-head latent attention is not supported ({key}={raw[key]!r})")
    if raw.get("hidden_act", "silu") != "silu":
        raise ValueError(f"only SiLU-gated MLPs are supported, got hidden_act={raw['hidden_act']!r}")
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not hybrid and float(raw.get("partial_rotary_factor", rope.get("partial_rotary_factor", 1.0))) != 1.0:
        raise ValueError("partial rotary embeddings are not supported")
    layer_types = raw.get("layer_types") or ()
    if not hybrid and any(t != "full_attention" for t in layer_types):
        raise ValueError(f"only full attention layers are supported, got layer_types {sorted(set(layer_types))}")
    window = raw.get("sliding_window")
    max_pos = int(raw.get("max_position_embeddings", 4096))
    # Qwen2/3 configs carry a window that is off unless use_sliding_window; Mistral's is on when set.
    window_on = raw.get("use_sliding_window", model_type == "mistral")
    if window_on and window is not None and int(window) < max_pos:
        raise ValueError(f"sliding-window attention (window {window} < context {max_pos}) is not supported")


def _optional_int(value: Any) -> int | None:
    if isinstance(value, list | tuple):
        return int(value[0]) if value else None
    return None if value is None else int(value)


def _int_tuple(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, list | tuple):
        return tuple(int(v) for v in value)
    return (int(value),)
