"""The fast option study: fake quantization in one dense teacher-forced pass per window.

Cheaper than the engine path (one forward per configuration and window, no per-step cache work) and
able to model options the engine's cache does not offer (bf16 sink tokens). Every position of a
window is scored; each query reads quantized K/V except its sinks and its newest ``window`` tokens
(see :class:`FakeQuantAttention`), i.e. what decode sees.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from nibblekv.eval.configs import KVConfig
from nibblekv.eval.fakequant import FakeQuantAttention
from nibblekv.eval.metrics import TokenScores, WindowAccumulator, compare
from nibblekv.model import CausalLM, DenseAttention


@torch.inference_mode()
def run_study(
    model: CausalLM,
    windows: torch.Tensor,
    configs: Sequence[KVConfig],
    scales: Callable[[KVConfig], torch.Tensor | None],
    batch: int = 2,
    progress: Callable[[str], None] | None = None,
    chunk: int = 0,
    means: Callable[[KVConfig], torch.Tensor | None] | None = None,
) -> dict[str, WindowAccumulator]:
    """Per-window scores of every configuration against the unquantized dense pass.

    ``means`` gives a smoothed configuration its K/V means (see :class:`FakeQuantAttention`)."""
    num, n = windows.shape
    accs = {c.name: WindowAccumulator(num) for c in configs}
    dev = model.device
    for b0 in range(0, num, batch):
        wids = list(range(b0, min(b0 + batch, num)))
        ids = windows[wids, :-1].reshape(-1).to(dev)
        pos = torch.arange(n - 1, device=dev).repeat(len(wids))
        targets = windows[wids, 1:].reshape(-1).to(dev)
        cu = [i * (n - 1) for i in range(len(wids) + 1)]
        ref_lp = torch.log_softmax(model.compute_logits(model.forward(ids, pos, DenseAttention(cu))), -1)
        for cfg in configs:
            mu = means(cfg) if means is not None else None
            attn = (
                FakeQuantAttention(cu, cfg, scales(cfg), chunk, mu) if cfg.quantized else DenseAttention(cu)
            )
            s = compare(ref_lp, model.compute_logits(model.forward(ids, pos, attn)), targets)
            for i, w in enumerate(wids):
                sl = slice(i * (n - 1), (i + 1) * (n - 1))
                accs[cfg.name].add(w, TokenScores(s.kl[sl], s.agree[sl], s.nll[sl]))
        if progress is not None:
            progress(f"study: windows {wids[0]}..{wids[-1]} done")
    return accs
