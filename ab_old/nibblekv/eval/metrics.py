"""Per-token comparisons against the baseline and their summaries with confidence intervals.

Intervals are 95% percentile-bootstrap intervals over *windows* (the independent units: tokens
within a window are correlated), with a fixed seed so a rerun gives the same numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

BOOTSTRAP_RESAMPLES: int = 2000
BOOTSTRAP_SEED: int = 0


@dataclass(frozen=True)
class TokenScores:
    """Per-token KL(baseline || config), top-1 agreement (0/1) and NLL of the true next token."""

    kl: torch.Tensor
    agree: torch.Tensor
    nll: torch.Tensor


def compare(ref_logprobs: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor) -> TokenScores:
    """``ref_logprobs`` (baseline log-softmax) and ``logits`` ``[N, V]``, ``targets [N]`` -> scores."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    ref = ref_logprobs.float()
    kl = (ref.exp() * (ref - lp)).sum(-1).clamp(min=0.0)  # clamp: float error can dip below 0
    agree = (lp.argmax(-1) == ref.argmax(-1)).float()
    nll = -lp.gather(-1, targets.long().view(-1, 1)).squeeze(-1)
    return TokenScores(kl.cpu(), agree.cpu(), nll.cpu())


@dataclass
class WindowAccumulator:
    """Sums of one configuration's scores, per window (windows are the bootstrap units)."""

    num_windows: int
    kl: list[float] = field(init=False)
    agree: list[float] = field(init=False)
    nll: list[float] = field(init=False)
    count: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.kl = [0.0] * self.num_windows
        self.agree = [0.0] * self.num_windows
        self.nll = [0.0] * self.num_windows
        self.count = [0] * self.num_windows

    def add(self, window: int, scores: TokenScores) -> None:
        self.kl[window] += float(scores.kl.double().sum())
        self.agree[window] += float(scores.agree.double().sum())
        self.nll[window] += float(scores.nll.double().sum())
        self.count[window] += int(scores.kl.numel())

    def per_window(self) -> dict[str, torch.Tensor]:
        """Per-window means (float64 ``[W]``): ``kl``, ``top1``, ``nll``."""
        n = torch.tensor(self.count, dtype=torch.float64)
        if bool((n == 0).any()):
            raise ValueError("a window has no scored tokens")
        return {
            "kl": torch.tensor(self.kl, dtype=torch.float64) / n,
            "top1": torch.tensor(self.agree, dtype=torch.float64) / n,
            "nll": torch.tensor(self.nll, dtype=torch.float64) / n,
        }


def _resample_index(num_windows: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(BOOTSTRAP_SEED)
    return torch.randint(0, num_windows, (BOOTSTRAP_RESAMPLES, num_windows), generator=gen)


def _interval(samples: torch.Tensor) -> list[float]:
    lo, hi = torch.quantile(samples, torch.tensor([0.025, 0.975], dtype=samples.dtype)).tolist()
    return [float(lo), float(hi)]


def summarize(acc: WindowAccumulator, ref: WindowAccumulator) -> dict[str, float | list[float] | int]:
    """One results row's numbers: means and 95% CIs of KL, top-1, perplexity and its delta vs ``ref``.

    Perplexity is ``exp`` of the mean per-token NLL (windows weigh equally: they have equal token
    counts); its delta is paired -- the same resampled windows for both -- so the interval reflects
    the quantization's effect, not the text's difficulty.
    """
    w, r = acc.per_window(), ref.per_window()
    idx = _resample_index(acc.num_windows)
    kl_b, top1_b = w["kl"][idx].mean(1), w["top1"][idx].mean(1)
    nll_b, ref_nll_b = w["nll"][idx].mean(1), r["nll"][idx].mean(1)
    ppl, ref_ppl = math.exp(float(w["nll"].mean())), math.exp(float(r["nll"].mean()))
    return {
        "kl": float(w["kl"].mean()),
        "kl_ci": _interval(kl_b),
        "top1": float(w["top1"].mean()),
        "top1_ci": _interval(top1_b),
        "ppl": ppl,
        "ppl_ci": _interval(nll_b.exp()),
        "ppl_delta": ppl - ref_ppl,
        "ppl_delta_ci": _interval(nll_b.exp() - ref_nll_b.exp()),
        "windows": acc.num_windows,
        "tokens": int(sum(acc.count)),
    }
