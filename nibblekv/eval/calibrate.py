"""Per-layer K and V global scales for NVFP4 KV: ``g = amax / (6 * 448)`` from calibration text.

The amax is of K *after RoPE* (what the cache stores) and of V, per layer, over every token of the
calibration windows, recorded by a pass-through :class:`AttentionBackend` around dense attention.
With ``g = amax / 2688`` the largest value maps to the top of the format: E2M1's 6 times E4M3's 448.
Scales already in a checkpoint (llm-compressor style ``...self_attn.k_scale`` / ``v_scale`` tensors
in its safetensors) are used as they are when present.
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
        }

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")


class AmaxRecorder(AttentionBackend):
    """Records per-layer amax of the K and V handed to ``inner`` (optionally Hadamard-rotated first)."""

    def __init__(self, inner: AttentionBackend, num_layers: int, rotate: bool = False) -> None:
        self.inner = inner
        self.rotate = rotate
        self.amax = torch.zeros(num_layers, 2, dtype=torch.float32)

    def forward(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        kk, vv = k.float(), v.float()
        if self.rotate:
            h = hadamard(k.shape[-1], k.device)
            kk, vv = kk @ h, vv @ h
        seen = torch.stack((kk.abs().amax(), vv.abs().amax())).cpu()
        self.amax[layer_id] = torch.maximum(self.amax[layer_id], seen)
        return self.inner.forward(layer_id, q, k, v)


@torch.inference_mode()
def calibrate(model: CausalLM, windows: torch.Tensor, rotate: bool = False) -> KVScales:
    """Scales from ``windows`` (int64 ``[W, N]``), one window per forward. ``rotate``: amax of
    Hadamard-rotated K/V (what the cache holds with the rotation on; rotation changes the amax)."""
    if windows.ndim != 2 or windows.shape[0] == 0:
        raise ValueError("calibration needs windows as a non-empty [W, N] tensor")
    n = windows.shape[1]
    rec = AmaxRecorder(DenseAttention.single(n), model.config.num_layers, rotate)
    for row in windows:
        model.forward(row.to(model.device), torch.arange(n, device=model.device), rec)
    # NOTE: a layer whose K or V is all zeros would get scale 0, which the pool rejects; keep 1.0 there.
    g = torch.where(rec.amax > 0, rec.amax / NVFP4_MAX, torch.ones_like(rec.amax))
    return KVScales(
        tuple(g[:, 0].tolist()), tuple(g[:, 1].tolist()), "calibration", int(windows.numel()), rotate
    )


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
