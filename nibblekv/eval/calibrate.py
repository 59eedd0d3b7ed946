"""Per-layer K and V global scales for NVFP4 KV: ``g = amax / (6 * 448)`` from calibration text.

The amax is of K *after RoPE* (what the cache stores) and of V, per layer, over every token of the
calibration windows, recorded by a pass-through :class:`AttentionBackend` around dense attention.
With ``g = amax / 2688`` the largest value maps to the top of the format: E2M1's 6 times E4M3's 448.
Scales already in a checkpoint (llm-compressor style ``...self_attn.k_scale`` / ``v_scale`` tensors
in its safetensors) are used as they are when present.

For the fake-quant study's mean smoothing, :func:`calibrate_means` records per-layer, per-KV-head
means of K (after RoPE) and V; scales calibrated for smoothed K/V take the amax of ``x - mean``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from nibblekv.attention.backend import AttentionBackend
from nibblekv.eval.quant import hadamard
from nibblekv.formats.nvfp4 import NVFP4_MAX
from nibblekv.model import CausalLM, DenseAttention

_CKPT_KEY = re.compile(r"layers\.(\d+)\.self_attn\.(?:attn\.)?([kv])_scale$")


@dataclass(frozen=True)
class KVScales:
    """Per-layer global scales and where they came from (``calibration`` or ``checkpoint``)."""

    k: tuple[float, ...]
    v: tuple[float, ...]
    source: str
    num_tokens: int = 0
    hadamard: bool = False
    smoothed: bool = False

    def tensor(self) -> torch.Tensor:
        """FP32 ``[layers, 2]`` (K, V), the shape :class:`KVPool` takes."""
        return torch.tensor([self.k, self.v], dtype=torch.float32).T.contiguous()

    def to_json(self) -> dict[str, object]:
        """The ``--kv-scales-path`` format (``k_scale`` / ``v_scale`` lists) plus provenance."""
        return {
            "k_scale": list(self.k),
            "v_scale": list(self.v),
            "convention": "amax / (6 * 448)",
            "source": self.source,
            "num_tokens": self.num_tokens,
            "hadamard": self.hadamard,
            "smoothed": self.smoothed,
        }

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")


@dataclass(frozen=True)
class KVMeans:
    """Per-channel statistics of K (after RoPE) and V: float32 ``[layers, kv_heads, head_dim]`` each.

    ``k`` / ``v`` are the means (what smoothing subtracts); ``k_sq`` / ``v_sq`` the mean squares.
    """

    k: torch.Tensor
    v: torch.Tensor
    k_sq: torch.Tensor
    v_sq: torch.Tensor
    num_tokens: int = 0

    def tensor(self) -> torch.Tensor:
        """FP32 ``[layers, 2, kv_heads, head_dim]`` (K, V), what :class:`FakeQuantAttention` takes."""
        return torch.stack((self.k, self.v), dim=1).contiguous()

    def dc_ratio(self) -> torch.Tensor:
        """``||mean|| / rms`` per layer and KV head (norms over head_dim): ``[layers, kv_heads, 2]``."""
        mean = torch.stack((self.k, self.v), -1).norm(dim=-2)
        rms = torch.stack((self.k_sq, self.v_sq), -1).sum(-2).sqrt()
        return mean / rms.clamp(min=1e-30)


class MeanRecorder(AttentionBackend):
    """Accumulates per-layer, per-KV-head channel sums and sums of squares of K and V (float64)."""

    def __init__(self, inner: AttentionBackend, num_layers: int) -> None:
        self.inner = inner
        self.sums: list[torch.Tensor | None] = [None] * num_layers
        self.tokens = [0] * num_layers

    def forward(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        kv = torch.stack((k, v)).double()  # [2, T, H, D]
        seen = torch.stack((kv.sum(1), kv.square().sum(1))).cpu()  # [2 (sum, sq), 2 (k, v), H, D]
        prev = self.sums[layer_id]
        self.sums[layer_id] = seen if prev is None else prev + seen
        self.tokens[layer_id] += k.shape[0]
        return self.inner.forward(layer_id, q, k, v)

    def result(self) -> KVMeans:
        if any(s is None for s in self.sums):
            raise ValueError("MeanRecorder saw no tokens for some layer")
        stats = torch.stack([s / n for s, n in zip(self.sums, self.tokens)]).float()  # type: ignore[operator]
        return KVMeans(stats[:, 0, 0], stats[:, 0, 1], stats[:, 1, 0], stats[:, 1, 1], self.tokens[0])


class AmaxRecorder(AttentionBackend):
    """Records per-layer amax of the K and V handed to ``inner`` (optionally Hadamard-rotated first).

    ``means [layers, 2, kv_heads, D]`` (see :meth:`KVMeans.tensor`): subtracted before the rotation.
    """

    def __init__(
        self,
        inner: AttentionBackend,
        num_layers: int,
        rotate: bool = False,
        means: torch.Tensor | None = None,
    ) -> None:
        self.inner = inner
        self.rotate = rotate
        self.means = means
        self.amax = torch.zeros(num_layers, 2, dtype=torch.float32)

    def forward(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        kk, vv = k.float(), v.float()
        if self.means is not None:
            mu = self.means[layer_id].to(kk.device)
            kk, vv = kk - mu[0], vv - mu[1]
        if self.rotate:
            h = hadamard(k.shape[-1], k.device)
            kk, vv = kk @ h, vv @ h
        seen = torch.stack((kk.abs().amax(), vv.abs().amax())).cpu()
        self.amax[layer_id] = torch.maximum(self.amax[layer_id], seen)
        return self.inner.forward(layer_id, q, k, v)


def _check_windows(windows: torch.Tensor) -> None:
    if windows.ndim != 2 or windows.shape[0] == 0:
        raise ValueError("calibration needs windows as a non-empty [W, N] tensor")


@torch.inference_mode()
def calibrate(
    model: CausalLM, windows: torch.Tensor, rotate: bool = False, means: torch.Tensor | None = None
) -> KVScales:
    """Scales from ``windows`` (int64 ``[W, N]``), one window per forward. ``rotate``: amax of
    Hadamard-rotated K/V (what the cache holds with the rotation on; rotation changes the amax).
    ``means`` (``[layers, 2, kv_heads, D]``): amax of the mean-smoothed K/V."""
    _check_windows(windows)
    n = windows.shape[1]
    rec = AmaxRecorder(DenseAttention.single(n), model.config.num_kv_layers, rotate, means)
    for row in windows:
        model.forward(row.to(model.device), torch.arange(n, device=model.device), rec)
    # NOTE: a layer whose K or V is all zeros would get scale 0, which the pool rejects; keep 1.0 there.
    g = torch.where(rec.amax > 0, rec.amax / NVFP4_MAX, torch.ones_like(rec.amax))
    return KVScales(
        tuple(g[:, 0].tolist()),
        tuple(g[:, 1].tolist()),
        "calibration",
        int(windows.numel()),
        rotate,
        means is not None,
    )


@torch.inference_mode()
def calibrate_means(model: CausalLM, windows: torch.Tensor) -> KVMeans:
    """Per-layer, per-KV-head channel means (and mean squares) of K after RoPE and of V over
    ``windows`` (int64 ``[W, N]``), one window per forward."""
    _check_windows(windows)
    n = windows.shape[1]
    rec = MeanRecorder(DenseAttention.single(n), model.config.num_kv_layers)
    for row in windows:
        model.forward(row.to(model.device), torch.arange(n, device=model.device), rec)
    return rec.result()


def checkpoint_scales(model_path: str | Path | None, num_layers: int) -> KVScales | None:
    """K/V scales stored in an HF folder's safetensors (llm-compressor names), or None if absent.

    Raises ``ValueError`` when only some layers carry them (a partial set is a broken checkpoint).
    """
    if model_path is None or not Path(model_path).is_dir():
        return None
    from safetensors import safe_open

    found: dict[tuple[int, str], float] = {}
    for shard in sorted(Path(model_path).glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                m = _CKPT_KEY.search(name)
                if m:
                    found[(int(m.group(1)), m.group(2))] = float(f.get_tensor(name).float().max())
    if not found:
        return None
    missing = [(i, kv) for i in range(num_layers) for kv in "kv" if (i, kv) not in found]
    if missing:
        raise ValueError(
            f"{model_path}: checkpoint has k/v scales for some layers only (missing {missing[:4]})"
        )
    k = tuple(found[(i, "k")] for i in range(num_layers))
    v = tuple(found[(i, "v")] for i in range(num_layers))
    return KVScales(k, v, "checkpoint")
