"""``nibblekv eval kv``'s measurements: KV configurations against the baseline cache, teacher-forced.

Two modes, every configuration advanced in lockstep with the baseline so the baseline's next-token
distributions are used at once and never stored for a whole run:

* ``prefill``: windows of ``window_tokens`` fed as chunked prefill of ``prefill_chunk`` tokens. A
  chunk attends to its own fresh K/V and to the *cached* prefix, so quantization is visible only
  from the second chunk on; the first chunk (identical for every configuration) is not scored.
* ``decode``: a context of ``decode_context`` tokens prefilled in one chunk, then the next
  ``decode_tokens`` true tokens fed one at a time through the decode path (each step writes the
  token, then attends over the whole cache) -- what generation experiences. Every step is scored.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from nibblekv.eval.configs import KVConfig
from nibblekv.eval.metrics import WindowAccumulator, compare
from nibblekv.eval.paged_runner import PagedRunner
from nibblekv.model import CausalLM

Progress = Callable[[str], None]


@dataclass(frozen=True)
class EvalSettings:
    """Sizes of one run (see the module docstring); ``batch`` windows run as one batch of requests."""

    windows: int = 16
    window_tokens: int = 512
    prefill_chunk: int = 128
    decode_context: int = 256
    decode_tokens: int = 64
    batch: int = 16

    def __post_init__(self) -> None:
        if self.prefill_chunk >= self.window_tokens:
            raise ValueError(
                "--prefill-chunk must be smaller than --window-tokens (the first chunk is not scored)"
            )
        if self.decode_context + self.decode_tokens + 1 > self.window_tokens:
            raise ValueError("--decode-context + --decode-tokens + 1 must fit in --window-tokens")
        if min(self.windows, self.prefill_chunk, self.decode_context, self.decode_tokens, self.batch) < 1:
            raise ValueError("window counts and sizes must be >= 1")


def _scores_into(
    accs: WindowAccumulator, window_ids: Sequence[int], ref_lp: torch.Tensor, logits: torch.Tensor,
    targets: torch.Tensor, rows_per_window: int,
) -> None:  # fmt: skip
    scores = compare(ref_lp, logits, targets)
    for i, w in enumerate(window_ids):
        sl = slice(i * rows_per_window, (i + 1) * rows_per_window)
        accs.add(w, type(scores)(scores.kl[sl], scores.agree[sl], scores.nll[sl]))


class LockstepEval:
    """The baseline (``configs[0]``) and every other configuration, fed the same tokens step by step."""

    def __init__(
        self,
        model: CausalLM,
        configs: Sequence[KVConfig],
        settings: EvalSettings,
        scales: Callable[[KVConfig], torch.Tensor | None],
        progress: Progress | None = None,
    ) -> None:
        if not configs or configs[0].quantized:
            raise ValueError("the first configuration must be the unquantized baseline")
        self.model = model
        self.configs = list(configs)
        self.settings = settings
        self.progress = progress or (lambda _msg: None)
        self.runners = [
            PagedRunner(
                model,
                c,
                max_requests=settings.batch,
                max_len=settings.window_tokens,
                global_scales=scales(c),
                prefill_chunk=settings.prefill_chunk,
            )
            for c in self.configs
        ]

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(hidden)

    def _batches(self, windows: torch.Tensor) -> list[list[int]]:
        b = self.settings.batch
        return [list(range(i, min(i + b, windows.shape[0]))) for i in range(0, windows.shape[0], b)]

    @torch.inference_mode()
    def run_prefill(self, windows: torch.Tensor) -> dict[str, WindowAccumulator]:
        s = self.settings
        accs = {c.name: WindowAccumulator(windows.shape[0]) for c in self.configs}
        n = windows.shape[1]
        for wids in self._batches(windows):
            for r in self.runners:
                r.start(len(wids))
            for c0 in range(0, n - 1, s.prefill_chunk):
                c1 = min(c0 + s.prefill_chunk, n - 1)  # the last token has no target: never fed
                chunks = [windows[w, c0:c1].tolist() for w in wids]
                targets = windows[wids, c0 + 1 : c1 + 1].reshape(-1).to(self.model.device)
                more = c1 < n - 1  # a non-final chunk of the window's prompt
                ref = self.runners[0].step(chunks, more)
                scored = c0 > 0
                ref_lp = torch.log_softmax(self._logits(ref), -1) if scored else None
                for cfg, runner in zip(self.configs, self.runners):
                    hidden = ref if runner is self.runners[0] else runner.step(chunks, more)
                    if ref_lp is not None:
                        _scores_into(accs[cfg.name], wids, ref_lp, self._logits(hidden), targets, c1 - c0)
            self.progress(f"prefill: windows {wids[0]}..{wids[-1]} done")
        for r in self.runners:
            r.release()
        return accs

    @torch.inference_mode()
    def run_decode(self, windows: torch.Tensor) -> dict[str, WindowAccumulator]:
        s = self.settings
        accs = {c.name: WindowAccumulator(windows.shape[0]) for c in self.configs}
        ctx = s.decode_context
        for wids in self._batches(windows):
            for r in self.runners:
                r.start(len(wids))
                r.step([windows[w, :ctx].tolist() for w in wids])  # one prefill chunk, not scored
            for j in range(s.decode_tokens):
                pos = ctx + j
                tokens = [[int(windows[w, pos])] for w in wids]
                targets = windows[wids, pos + 1].to(self.model.device)
                ref = self.runners[0].step(tokens)
                ref_lp = torch.log_softmax(self._logits(ref), -1)
                for cfg, runner in zip(self.configs, self.runners):
                    hidden = ref if runner is self.runners[0] else runner.step(tokens)
                    _scores_into(accs[cfg.name], wids, ref_lp, self._logits(hidden), targets, 1)
            self.progress(f"decode: windows {wids[0]}..{wids[-1]} done")
        for r in self.runners:
            r.release()
        return accs
