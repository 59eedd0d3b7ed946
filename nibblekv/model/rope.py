"""Rotary position embeddings, computed exactly as HF transformers does (NeoX "rotate half" layout).

NOTE: the inverse frequencies stay float32 whatever the model dtype, and cos/sin are computed in
float32 and only then cast to the activations' dtype, as in HF. That keeps our logits bit-compatible
in spirit with HF's (same operations in the same precision), which the equivalence tests rely on.
"""

from __future__ import annotations

import math

import torch

from nibblekv.model.config import ModelConfig, RopeScaling


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    """float32 ``[head_dim // 2]`` inverse frequencies, scaled per ``scaling`` (HF's formulas)."""
    # NOTE: explicit CPU device: models are built under ``torch.device("meta")``.
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").to(torch.float32) / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    if scaling.rope_type == "llama3":
        return _llama3_scale(inv_freq, scaling)
    if scaling.rope_type == "yarn":
        return _yarn_scale(exponents, head_dim, theta, scaling)
    if scaling.rope_type == "freq_factors":
        factors = torch.tensor(scaling.freq_factors, dtype=torch.float32, device="cpu")
        if factors.shape != inv_freq.shape:
            raise ValueError(f"rope_freqs has {factors.numel()} values, head_dim {head_dim} needs {inv_freq.numel()}")
        return inv_freq / factors  # llama.cpp: theta / freq_factor
    return inv_freq


def _llama3_scale(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    """Llama 3.1 scaling: keep high frequencies, divide low ones by ``factor``, blend in between."""
    old_len = s.original_max_position_embeddings
    low_freq_wavelen = old_len / s.low_freq_factor
    high_freq_wavelen = old_len / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_scale(exponents: torch.Tensor, head_dim: int, theta: float, s: RopeScaling) -> torch.Tensor:
    """YaRN (HF's formulas): extrapolated (unscaled) frequencies for the fast dimensions, interpolated (divided
    by ``factor``) for the slow ones, a linear ramp between ``beta_fast`` and ``beta_slow`` rotations."""

    def correction_dim(rotations: float) -> float:
        orig = s.original_max_position_embeddings
        return head_dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # NOTE: HF's guard against a zero-width ramp
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low)).clamp(0, 1)
    extrapolated = 1 - ramp
    pos_freqs = theta**exponents
    return (1.0 / (s.factor * pos_freqs)) * (1 - extrapolated) + (1.0 / pos_freqs) * extrapolated


class RotaryEmbedding:
    """cos/sin tables for the given positions; not an ``nn.Module`` so dtype casts never touch it.

    NOTE: deliberately not a buffer: ``model.to(bfloat16)`` or meta-device construction must not
    round or wipe the float32 frequencies.
    """

    def __init__(self, config: ModelConfig) -> None:
        self.inv_freq = inverse_frequencies(config.rotary_dim, config.rope_theta, config.rope_scaling)
        # YaRN scales cos and sin (HF's attention_scaling); 1.0 for the other types
        self.attention_factor = config.rope_scaling.attention_factor
        self._on_device: dict[torch.device, torch.Tensor] = {}

    def prepare(self, device: torch.device) -> torch.Tensor:
        """The frequencies on ``device``, copied there once.

        NOTE: loaders call this up front so the copy never happens inside a CUDA graph capture.
        """
        inv_freq = self._on_device.get(device)
        if inv_freq is None:
            inv_freq = self._on_device.setdefault(device, self.inv_freq.to(device))
        return inv_freq

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``positions [T]`` -> ``(cos, sin)``, each ``[T, 1, rotary_dim]`` in ``dtype`` (rotary_dim: head_dim
        unless the model rotates only part of each head)."""
        inv_freq = self.prepare(positions.device)
        freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]
        if self.attention_factor != 1.0:
            return (emb.cos() * self.attention_factor).to(dtype), (emb.sin() * self.attention_factor).to(dtype)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [T, heads, D]`` by position: ``x * cos + rotate_half(x) * sin``."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
