"""A cache-free attention backend that sees K/V as a quantized cache would serve them.

For the fast option study: one dense pass over whole windows, where every key/value a query reads is
the round-tripped (fake-quantized) copy, except the first ``sinks`` tokens and the query's newest
``window`` tokens, which stay exact -- what decode sees from a cache with bf16 sinks and a bf16 tail.
(The engine's tail is page-granular: it holds between ``window - page_size + 1`` and ``window``
tokens; this study keeps exactly ``window``.) The query's own key is quantized too when
``window == 0``, as in the engine's decode path, which writes the token before attending.

With ``chunk = C > 0`` it models chunked prefill instead: a query in chunk ``[c0, c0 + C)`` reads its
own chunk's keys exact (fresh K/V) and the cached prefix as the engine's extend path serves it, the
``window`` tokens before ``c0`` exact (the bf16 tail) and the rest quantized.
"""

from __future__ import annotations

import torch

from nibblekv.attention.backend import AttentionBackend
from nibblekv.eval.configs import KVConfig
from nibblekv.eval.quant import fake_quantize, hadamard


class FakeQuantAttention(AttentionBackend):
    """Causal attention per sequence of a flattened batch (``cu_seqlens`` as :class:`DenseAttention`).

    ``global_scales [layers, 2]`` (K, V) are used when ``config.calibrated``; otherwise 1.0.
    """

    def __init__(
        self,
        cu_seqlens: list[int],
        config: KVConfig,
        global_scales: torch.Tensor | None = None,
        chunk: int = 0,
    ) -> None:
        if config.calibrated and global_scales is None:
            raise ValueError(f"{config.name}: calibrated scales requested but none given")
        self.bounds = [int(b) for b in cu_seqlens]
        self.config = config
        self.global_scales = global_scales
        self.chunk = chunk

    def _scales(self, layer_id: int) -> tuple[float | torch.Tensor, float | torch.Tensor]:
        if self.config.calibrated and self.global_scales is not None:
            return self.global_scales[layer_id, 0], self.global_scales[layer_id, 1]
        return 1.0, 1.0

    def forward(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        rot = hadamard(q.shape[-1], q.device, torch.float32) if cfg.hadamard else None
        qf, kf, vf = q.float(), k.float(), v.float()
        if rot is not None:
            qf, kf, vf = qf @ rot, kf @ rot, vf @ rot
        gk, gv = self._scales(layer_id)
        kq = fake_quantize(kf, cfg.kv_dtype, gk, cfg.four_over_six)
        vq = fake_quantize(vf, cfg.kv_dtype, gv, cfg.four_over_six)
        group = q.shape[1] // k.shape[1]
        scale = q.shape[-1] ** -0.5
        out = torch.empty_like(qf)
        for start, end in zip(self.bounds[:-1], self.bounds[1:]):
            n = end - start
            if n == 0:
                continue
            qs = qf[start:end].transpose(0, 1)  # [Hq, n, D]
            ke, ve, kk, vv = (
                t[start:end].repeat_interleave(group, dim=1).transpose(0, 1) for t in (kf, vf, kq, vq)
            )
            i = torch.arange(n, device=q.device)
            dist = i[:, None] - i[None, :]  # query minus key position
            causal = dist >= 0
            if self.chunk:  # exact from the tail before the query's chunk start on
                recent = i[None, :] >= (i[:, None] // self.chunk) * self.chunk - cfg.window
            else:
                recent = dist < cfg.window
            exact = causal & (recent | (i[None, :] < cfg.sink_tokens))
            s = torch.where(exact, qs @ ke.transpose(1, 2), qs @ kk.transpose(1, 2)) * scale
            p = torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1)
            pe = p * exact
            out[start:end] = (pe @ ve + (p - pe) @ vv).transpose(0, 1)
        if rot is not None:
            out = out @ rot  # the rotation is symmetric and orthogonal: its own inverse
        return out.to(q.dtype)
