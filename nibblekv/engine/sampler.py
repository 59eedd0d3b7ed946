"""Turn logits into next tokens: penalties, logit bias, the min-tokens stop mask, temperature, top-k / top-p /
min-p, seeded sampling, logprobs.

Batched over requests with per-row parameters; rows whose request has a seed draw their noise from
the request's own generator, so a seeded request samples the same tokens whatever it is batched with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from nibblekv.engine.request import Request, TokenLogprob
from nibblekv.engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class SampleResult:
    token_ids: list[int]
    logprobs: list[TokenLogprob | None]  # per row; None unless that request asked for logprobs


def _to(values: Sequence[float] | Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list on ``device`` without waiting for the device (the overlap schedule relies on it)."""
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)


def _param_column(reqs: Sequence[Request], name: str, device: torch.device) -> torch.Tensor:
    return _to([float(getattr(r.params, name)) for r in reqs], torch.float32, device)


def _padded_ids(rows: Sequence[Sequence[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, max_len]`` ids (padded with 0) and a matching 0/1 float weight."""
    width = max([len(r) for r in rows] + [1])
    ids = torch.zeros(len(rows), width, dtype=torch.int64)
    weight = torch.zeros(len(rows), width, dtype=torch.float32)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.int64)
        weight[i, : len(r)] = 1.0
    return ids.to(device), weight.to(device)


def apply_penalties(logits: torch.Tensor, reqs: Sequence[Request]) -> torch.Tensor:
    """Repetition (HF, over prompt + output), frequency and presence (OpenAI, over output) penalties."""
    rows = [i for i, r in enumerate(reqs) if r.params.penalized]
    if not rows:
        return logits
    sub_reqs = [reqs[i] for i in rows]
    sub = logits[rows]
    dev = logits.device
    vocab = logits.shape[-1]
    ids, w = _padded_ids([r.token_ids for r in sub_reqs], dev)
    seen = torch.zeros_like(sub).scatter_add_(1, ids.clamp(max=vocab - 1), w) > 0
    rep = _param_column(sub_reqs, "repetition_penalty", dev)[:, None]
    sub = torch.where(seen, torch.where(sub > 0, sub / rep, sub * rep), sub)
    out_ids, out_w = _padded_ids([r.output_token_ids for r in sub_reqs], dev)
    counts = torch.zeros_like(sub).scatter_add_(1, out_ids.clamp(max=vocab - 1), out_w)
    freq = _param_column(sub_reqs, "frequency_penalty", dev)[:, None]
    pres = _param_column(sub_reqs, "presence_penalty", dev)[:, None]
    sub = sub - freq * counts - pres * (counts > 0).float()
    logits = logits.clone()
    logits[rows] = sub
    return logits


def apply_logit_bias(logits: torch.Tensor, reqs: Sequence[Request]) -> torch.Tensor:
    """Each request's ``logit_bias`` added to its row (token ids checked against the vocabulary upstream)."""
    rows = [(i, t, b) for i, r in enumerate(reqs) for t, b in r.params.logit_bias]
    if not rows:
        return logits
    at, ids, bias = zip(*rows)
    dev = logits.device
    index = (_to(at, torch.int64, dev), _to(ids, torch.int64, dev))
    return logits.index_put(index, _to(bias, torch.float32, dev), accumulate=True)


def mask_early_stops(
    logits: torch.Tensor, reqs: Sequence[Request], eos_token_ids: frozenset[int]
) -> torch.Tensor:
    """``-inf`` at the tokens that would end a request (EOS unless ``ignore_eos``, ``stop_token_ids``) in the
    rows whose request has fewer than ``min_new_tokens`` output tokens."""
    rows: list[tuple[int, int]] = []
    vocab = logits.shape[-1]
    for i, r in enumerate(reqs):
        p = r.params
        if r.num_output_tokens < p.min_new_tokens:
            stops = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_token_ids))
            rows += [(i, t) for t in stops if t < vocab]
    if not rows:
        return logits
    at, ids = zip(*rows)
    dev = logits.device
    return logits.index_put(
        (_to(at, torch.int64, dev), _to(ids, torch.int64, dev)), torch.tensor(float("-inf"), device=dev)
    )


def filter_logits(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Temperature, then top-k, top-p and min-p as ``-inf`` masks (every row keeps its best token)."""
    dev = logits.device
    temp = _to([p.temperature for p in params], torch.float32, dev)[:, None]
    logits = logits / temp
    vocab = logits.shape[-1]
    if all(not 0 < p.top_k < vocab and p.top_p >= 1.0 and p.min_p <= 0.0 for p in params):
        # NOTE: no row filters: skip the full-vocabulary sort (48 x 128K rows per decode step at Llama-3's vocab)
        return logits
    top_k = _to([p.top_k if p.top_k > 0 else vocab for p in params], torch.int64, dev)[:, None]
    top_p = _to([p.top_p for p in params], torch.float32, dev)[:, None]
    min_p = _to([p.min_p for p in params], torch.float32, dev)[:, None]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    rank = torch.arange(vocab, device=dev)[None, :]
    drop = rank >= top_k
    # NOTE: a token is dropped when the mass *before* it already reaches top_p, so the best survives.
    drop |= (probs.cumsum(dim=-1) - probs) >= top_p
    drop |= probs < min_p * probs[:, :1]
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def top_logprobs(logprobs: torch.Tensor, chosen: torch.Tensor, ns: Sequence[int]) -> list[TokenLogprob]:
    """Per row: the chosen token's log-probability and the top ``ns[row]`` alternatives."""
    k = max(list(ns) + [0])
    top_vals, top_ids = logprobs.topk(k, dim=-1) if k else (None, None)
    chosen_lp = logprobs.gather(1, chosen[:, None])[:, 0].tolist()
    chosen_ids = chosen.tolist()
    out = []
    for i, n in enumerate(ns):
        top: tuple[tuple[int, float], ...] = ()
        if n and top_ids is not None and top_vals is not None:
            top = tuple(zip(top_ids[i, :n].tolist(), top_vals[i, :n].tolist()))
        out.append(TokenLogprob(chosen_ids[i], chosen_lp[i], top))
    return out


class Sampler:
    """Picks one token per row of logits (one row per request)."""

    def __init__(self, device: torch.device, seed: int = 0, eos_token_ids: Sequence[int] = ()) -> None:
        """``eos_token_ids``: the tokens ``min_new_tokens`` holds back (with each request's stop ids)."""
        self.device = device
        self.eos_token_ids = frozenset(eos_token_ids)
        # noise for rows without a seed of their own
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def request_generator(self, req: Request) -> torch.Generator | None:
        """The request's own generator (made on first use), or None when it has no seed."""
        if req.params.seed is None:
            return None
        if req.generator is None:
            req.generator = torch.Generator(device=self.device).manual_seed(req.params.seed)
        return req.generator

    def __call__(self, logits: torch.Tensor, reqs: Sequence[Request]) -> SampleResult:
        logits = logits.float()
        want_lp = [r.params.logprobs for r in reqs]
        raw_lp = logits.log_softmax(dim=-1) if any(n is not None for n in want_lp) else None
        chosen = self.choose(logits, reqs)
        lps: list[TokenLogprob | None] = [None] * len(reqs)
        rows = [i for i, n in enumerate(want_lp) if n is not None]
        if raw_lp is not None and rows:
            found = top_logprobs(raw_lp[rows], chosen[rows], [int(want_lp[i] or 0) for i in rows])
            for i, lp in zip(rows, found):
                lps[i] = lp
        return SampleResult(chosen.tolist(), lps)

    def choose(self, logits: torch.Tensor, reqs: Sequence[Request]) -> torch.Tensor:
        """The next token of each row, left on the device (int64 ``[rows]``): penalties, logit bias, the
        min-tokens mask, filters, draws."""
        logits = apply_penalties(logits.float(), reqs)
        logits = mask_early_stops(apply_logit_bias(logits, reqs), reqs, self.eos_token_ids)
        chosen = logits.argmax(dim=-1)
        sampled = [i for i, r in enumerate(reqs) if not r.params.greedy]
        if sampled:
            sub = [reqs[i] for i in sampled]
            rows = _to(sampled, torch.int64, logits.device)
            probs = filter_logits(logits.index_select(0, rows), [r.params for r in sub]).softmax(dim=-1)
            chosen.index_copy_(0, rows, self._draw(probs, sub))
        return chosen

    def _draw(self, probs: torch.Tensor, reqs: Sequence[Request]) -> torch.Tensor:
        """Sample each row by the exponential race: ``argmax(p / E)``, ``E ~ Exp(1)``."""
        noise = torch.empty_like(probs).exponential_(generator=self.generator)
        for i, r in enumerate(reqs):
            gen = self.request_generator(r)
            if gen is not None:
                noise[i].exponential_(generator=gen)
        return (probs / noise).argmax(dim=-1)
