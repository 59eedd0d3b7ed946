"""Per-request sampling parameters (SGLang / vLLM names), validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token and when to stop.

    ``temperature == 0`` is greedy. ``top_k`` of -1 (or 0) and ``top_p == 1`` and ``min_p == 0``
    disable those filters. ``repetition_penalty`` (HF's: divides positive logits, multiplies negative
    ones) applies to prompt and output tokens; ``frequency_penalty`` / ``presence_penalty`` (OpenAI's)
    to output tokens only; ``logit_bias`` (OpenAI's: token id -> bias in [-100, 100], a dict accepted) is
    added after them. ``stop`` strings are cut from the returned text (kept with
    ``include_stop_str_in_output``, vLLM's name, SGLang's ``no_stop_trim``); ``stop_token_ids`` and EOS
    (unless ``ignore_eos``) end generation with the token kept in ``token_ids``. Before
    ``min_new_tokens`` output tokens none of them ends it (SGLang's name, vLLM's ``min_tokens``: the stop
    ids are masked out of the draw, stop strings not searched). ``logprobs`` /
    ``prompt_logprobs`` ask for the top-n log-probabilities of the model's raw distribution (before
    penalties and temperature) for each generated / prompt token (None = not returned).
    """

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    include_stop_str_in_output: bool = False
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    logit_bias: tuple[tuple[int, float], ...] = field(default_factory=tuple)
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        # Accept lists / a single string from callers and the JSON API; store tuples (hashable, frozen).
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop or ()))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in (self.stop_token_ids or ())))
        try:  # one bias a token id (a dict's, or the last of repeated pairs'), sorted
            bias = {int(t): float(b) for t, b in dict(self.logit_bias or {}).items()}
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"invalid sampling parameter: logit_bias must map token ids to numbers ({exc})"
            ) from exc
        object.__setattr__(self, "logit_bias", tuple(sorted(bias.items())))
        self._validate()

    def _validate(self) -> None:
        p = self
        rules: list[tuple[bool, str, object]] = [
            (
                _is_int(p.max_new_tokens) and p.max_new_tokens >= 0,
                "max_new_tokens must be an int >= 0",
                p.max_new_tokens,
            ),
            (
                _is_int(p.min_new_tokens) and 0 <= p.min_new_tokens <= p.max_new_tokens,
                "min_new_tokens must be an int in [0, max_new_tokens]",
                p.min_new_tokens,
            ),
            (
                _finite(p.temperature) and p.temperature >= 0,
                "temperature must be finite and >= 0",
                p.temperature,
            ),
            (_finite(p.top_p) and 0 < p.top_p <= 1, "top_p must be in (0, 1]", p.top_p),
            (
                _is_int(p.top_k) and (p.top_k >= 1 or p.top_k in (0, -1)),
                "top_k must be -1, 0 (off) or >= 1",
                p.top_k,
            ),
            (_finite(p.min_p) and 0 <= p.min_p <= 1, "min_p must be in [0, 1]", p.min_p),
            (
                _finite(p.repetition_penalty) and p.repetition_penalty > 0,
                "repetition_penalty must be > 0",
                p.repetition_penalty,
            ),
            (
                _finite(p.frequency_penalty) and -2 <= p.frequency_penalty <= 2,
                "frequency_penalty must be in [-2, 2]",
                p.frequency_penalty,
            ),
            (
                _finite(p.presence_penalty) and -2 <= p.presence_penalty <= 2,
                "presence_penalty must be in [-2, 2]",
                p.presence_penalty,
            ),
            (p.seed is None or _is_int(p.seed), "seed must be an int or None", p.seed),
            (all(isinstance(s, str) and s for s in p.stop), "stop must be non-empty strings", p.stop),
            (all(t >= 0 for t in p.stop_token_ids), "stop_token_ids must be >= 0", p.stop_token_ids),
            (
                all(t >= 0 and math.isfinite(b) and -100 <= b <= 100 for t, b in p.logit_bias),
                "logit_bias must map token ids >= 0 to biases in [-100, 100]",
                dict(p.logit_bias),
            ),
        ]
        for name in ("logprobs", "prompt_logprobs"):
            n = getattr(p, name)
            rules.append(
                (n is None or (_is_int(n) and 0 <= n <= 20), f"{name} must be None or an int in [0, 20]", n)
            )
        for ok, message, value in rules:
            if not ok:
                raise ValueError(f"invalid sampling parameter: {message}, got {value!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @property
    def penalized(self) -> bool:
        return self.repetition_penalty != 1 or self.frequency_penalty != 0 or self.presence_penalty != 0


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
