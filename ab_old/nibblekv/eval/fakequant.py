"""A cache-free attention backend that sees K/V as a quantized cache would serve them.

For the fast option study: one dense pass over whole windows, where every key/value a query reads is
the round-tripped (fake-quantized) copy, except the first ``sinks`` tokens and the query's newest
``window`` tokens, which stay exact -- what decode sees from a cache with bf16 sinks and a bf16 tail.
(The engine's tail is page-granular: it holds between ``window - page_size + 1`` and ``window``
tokens; this study keeps exactly ``window``.) The query's own key is quantized too when
``window == 0``, as in the engine's decode path, which writes the token before attending.

With ``chunk = C > 0`` it models chunked prefill instead: a query in chunk ``[c0, c0 + C)`` reads its
own chunk's keys exact (fresh K/V) and the cached prefix as the engine's extend path serves it, the
``window`` tokens before ``c0`` exact (the bf16 tail; ``C + window`` with the prefill window,
``config.prefill_window``) and the rest quantized.

Mean smoothing (``smooth_k`` / ``smooth_v``) subtracts a per-layer, per-KV-head vector from every
key / value, exact and quantized alike, before the rotation and quantization. For K this is exact
(it shifts each query's scores by one constant); the V mean is added back to the output (the
attention weights sum to 1). Only the quantization error changes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nibblekv.attention.backend import AttentionBackend
from nibblekv.eval.configs import KVConfig
from nibblekv.eval.quant import fake_quantize, hadamard

# Queries per attention call in decode mode (chunked prefill uses its chunks); only speed depends on it.
_DECODE_BLOCK = 256


class FakeQuantAttention(AttentionBackend):
    """Causal attention per sequence of a flattened batch (``cu_seqlens`` as :class:`DenseAttention`).

    ``global_scales [layers, 2]`` (K, V) are used when ``config.calibrated``; otherwise 1.0.
    ``means [layers, 2, kv_heads, D]`` (K, V; see :meth:`KVMeans.tensor`) are needed when
    ``config.smoothed``.
    """

    def __init__(
        self,
        cu_seqlens: list[int],
        config: KVConfig,
        global_scales: torch.Tensor | None = None,
        chunk: int = 0,
        means: torch.Tensor | None = None,
    ) -> None:
        if config.calibrated and global_scales is None:
            raise ValueError(f"{config.name}: calibrated scales requested but none given")
        if config.smoothed and means is None:
            raise ValueError(f"{config.name}: mean smoothing requested but no means given")
        self.bounds = [int(b) for b in cu_seqlens]
        self.config = config
        self.global_scales = global_scales
        self.chunk = chunk
        self.means = means

    def _scales(self, layer_id: int) -> tuple[float | torch.Tensor, float | torch.Tensor]:
        if self.config.calibrated and self.global_scales is not None:
            return self.global_scales[layer_id, 0], self.global_scales[layer_id, 1]
        return 1.0, 1.0

    def _block(
        self, qs: torch.Tensor, ke: torch.Tensor, ve: torch.Tensor, kk: torch.Tensor, vv: torch.Tensor,
        b0: int, b1: int,
    ) -> torch.Tensor:  # fmt: skip
        """Attention of queries ``[b0, b1)`` of one sequence (``[H, n, D]`` inputs) -> ``[H, b1 - b0, D]``.

        Keys before ``lo`` (the earliest exact-tail start of the block) are quantized for every query
        of the block, bar the sinks; from ``lo`` on both copies are offered and the mask picks one.
        """
        cfg = self.config
        if self.chunk:  # the block is one chunk: exact from the tail before its start on
            # NOTE: with the prefill window the tail before a chunk is the previous chunk + W
            lo = max(b0 - cfg.window - (self.chunk if cfg.prefill_window else 0), 0)
        else:
            lo = max(b0 - cfg.window + 1, 0)
        s = min(cfg.sink_tokens, lo)
        i = torch.arange(b0, b1, device=qs.device)[:, None]
        j = torch.arange(lo, b1, device=qs.device)[None, :]
        causal = j <= i
        recent = j >= lo if self.chunk else i - j < cfg.window
        exact = causal & (recent | (j < cfg.sink_tokens))
        mask = torch.cat((causal.new_ones(b1 - b0, lo), exact, causal & ~exact), dim=1)
        keys = torch.cat((ke[:, :s], kk[:, s:lo], ke[:, lo:b1], kk[:, lo:b1]), dim=1)
        values = torch.cat((ve[:, :s], vv[:, s:lo], ve[:, lo:b1], vv[:, lo:b1]), dim=1)
        return F.scaled_dot_product_attention(qs[:, b0:b1], keys, values, attn_mask=mask)

    def forward(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        rot = hadamard(q.shape[-1], q.device, torch.float32) if cfg.hadamard else None
        qf, kf, vf = q.float(), k.float(), v.float()
        mu_v = None
        if cfg.smoothed and self.means is not None:
            mu = self.means[layer_id].to(device=q.device, dtype=torch.float32)  # [2, Hkv, D]
            if cfg.smooth_k:
                kf = kf - mu[0]
            if cfg.smooth_v:
                vf, mu_v = vf - mu[1], mu[1]
        if rot is not None:
            qf, kf, vf = qf @ rot, kf @ rot, vf @ rot
        gk, gv = self._scales(layer_id)
        kq = fake_quantize(kf, cfg.kv_dtype, gk, cfg.four_over_six)
        vq = fake_quantize(vf, cfg.kv_dtype, gv, cfg.four_over_six)
        group = q.shape[1] // k.shape[1]
        out = torch.empty_like(qf)
        for start, end in zip(self.bounds[:-1], self.bounds[1:]):
            if end == start:
                continue
            qs = qf[start:end].transpose(0, 1)  # [Hq, n, D]
            ke, ve, kk, vv = (
                t[start:end].repeat_interleave(group, dim=1).transpose(0, 1) for t in (kf, vf, kq, vq)
            )
            block = self.chunk or _DECODE_BLOCK
            for b0 in range(0, end - start, block):
                b1 = min(b0 + block, end - start)
                out[start + b0 : start + b1] = self._block(qs, ke, ve, kk, vv, b0, b1).transpose(0, 1)
        if rot is not None:
            out = out @ rot  # the rotation is symmetric and orthogonal: its own inverse
        if mu_v is not None:
            out = out + mu_v.repeat_interleave(group, dim=0)  # weights sum to 1: the mean comes back
        return out.to(q.dtype)
