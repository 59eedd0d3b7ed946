"""The hybrid Gated-DeltaNet families' config fields (Qwen3-Next, Qwen3.5 dense): which layers are linear
attention, the shape of their per-request state, and the MoE variants refused. Read by
:class:`nibblekv.model.config.ModelConfig`, run by :mod:`nibblekv.model.hybrid`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Hybrid models: Gated DeltaNet linear-attention layers between gated full-attention layers.
HYBRID_MODEL_TYPES: frozenset[str] = frozenset({"qwen3_next", "qwen3_5"})
# HF layer_types entries of a hybrid model.
LINEAR_ATTENTION, FULL_ATTENTION = "linear_attention", "full_attention"
# dtypes of the recurrent state (SGLang's --mamba-ssm-dtype, config field ``mamba_ssm_dtype``) and their bytes
SSM_DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}
DEFAULT_SSM_DTYPE = "float32"


def ssm_dtype_from(raw: Mapping[str, Any]) -> str:
    """The config's ``mamba_ssm_dtype`` (float32 where absent); ValueError naming it if unknown."""
    name = str(raw.get("mamba_ssm_dtype") or DEFAULT_SSM_DTYPE)
    if name not in SSM_DTYPE_BYTES:
        raise ValueError(f"mamba_ssm_dtype {name!r} is not one of {', '.join(SSM_DTYPE_BYTES)}")
    return name


@dataclass(frozen=True)
class LinearAttentionConfig:
    """Shape of a hybrid model's Gated DeltaNet layers (HF's ``linear_*`` fields).

    Per request and layer the state is a recurrent ``[num_value_heads, key_head_dim, value_head_dim]``
    (``ssm_dtype``: float32 unless the config or ``--mamba-ssm-dtype`` says otherwise; the kernels compute in
    float32 either way) and a causal-conv window ``[conv_dim, conv_kernel - 1]`` (model dtype).
    """

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    ssm_dtype: str = DEFAULT_SSM_DTYPE

    def __post_init__(self) -> None:
        if self.num_value_heads % self.num_key_heads != 0:
            raise ValueError(
                f"linear_num_value_heads {self.num_value_heads} is not a multiple of "
                f"linear_num_key_heads {self.num_key_heads}"
            )

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the causal conv: ``[q | k | v]``."""
        return 2 * self.key_dim + self.value_dim

    def state_bytes(self, conv_dtype_bytes: int, ssm_dtype: str | None = None) -> int:
        """Bytes of one request's state in one layer: the recurrent state in ``ssm_dtype`` (default: the
        config's) + the conv window."""
        ssm = SSM_DTYPE_BYTES[ssm_dtype or self.ssm_dtype]
        rec = self.num_value_heads * self.key_head_dim * self.value_head_dim * ssm
        return rec + self.conv_dim * (self.conv_kernel - 1) * conv_dtype_bytes


def hybrid_fields(raw: Mapping[str, Any]) -> dict[str, Any]:
    """ModelConfig's hybrid fields from a Qwen3-Next / Qwen3.5 text config (HF's defaults where absent)."""
    layers = int(raw["num_hidden_layers"])
    layer_types = raw.get("layer_types")
    if not layer_types:  # HF: every ``full_attention_interval``-th layer is full attention
        interval = int(raw.get("full_attention_interval", 4))
        layer_types = [FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION for i in range(layers)]
    unknown = set(layer_types) - {FULL_ATTENTION, LINEAR_ATTENTION}
    if unknown:
        raise ValueError(
            f"unsupported layer_types {sorted(unknown)}; supported: {FULL_ATTENTION}, {LINEAR_ATTENTION}"
        )
    if not raw.get("attn_output_gate", True):
        raise ValueError(
            "hybrid models without the attention output gate (attn_output_gate=False) are not supported"
        )
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    return {
        "layer_types": tuple(str(t) for t in layer_types),
        "linear_attention": LinearAttentionConfig(
            num_key_heads=int(raw.get("linear_num_key_heads", 16)),
            num_value_heads=int(raw.get("linear_num_value_heads", 32)),
            key_head_dim=int(raw.get("linear_key_head_dim", 128)),
            value_head_dim=int(raw.get("linear_value_head_dim", 128)),
            conv_kernel=int(raw.get("linear_conv_kernel_dim", 4)),
            ssm_dtype=ssm_dtype_from(raw),
        ),
        # HF's default for these models is a quarter of the head
        "partial_rotary_factor": float(
            raw.get("partial_rotary_factor", rope.get("partial_rotary_factor", 0.25))
        ),
    }


def reject_hybrid_moe(raw: Mapping[str, Any], model_type: str) -> None:
    """Qwen3-Next's MLPs are sparse MoE blocks unless ``num_experts`` is 0 (HF's default is 512) or every
    layer is in ``mlp_only_layers``: refuse those, naming what is missing."""
    if model_type != "qwen3_next":
        return
    experts = int(raw.get("num_experts", 512))
    only = set(raw.get("mlp_only_layers") or ())
    step = int(raw.get("decoder_sparse_step", 1))
    moe = [
        i
        for i in range(int(raw["num_hidden_layers"]))
        if i not in only and experts > 0 and (i + 1) % step == 0
    ]
    if moe:
        raise ValueError(
            f"qwen3_next with mixture-of-experts MLPs (num_experts={experts}, in {len(moe)} layers) is not "
            "supported: only dense hybrid models run (the sparse MoE block and its router are missing); "
            "a dense config sets num_experts=0"
        )
