"""A request's state as it moves through the engine, and what the engine hands back."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from nibblekv.cache.pages import RequestPages
from nibblekv.engine.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(frozen=True)
class TokenLogprob:
    """One position's log-probability: the chosen token's and the top-n alternatives (best first)."""

    token_id: int
    logprob: float
    top_logprobs: tuple[tuple[int, float], ...] = ()


@dataclass(eq=False)  # NOTE: identity semantics: requests live in lists, sets and dicts
class Request:
    """One generation request.

    ``token_ids`` is prompt + output so far; ``pages.num_tokens`` of them have K/V in the cache.
    NOTE: a running request always has at least one token without K/V (the next one to feed);
    when exactly one is left it decodes, otherwise it is (re)prefilling. Under the overlap schedule
    the last ``num_pending`` tokens are placeholders (``-(row + 1)``) for tokens still on the device
    (see ``engine/overlap.py``): they count for lengths, never for outputs or the prefix cache.
    """

    request_id: str
    token_ids: list[int]
    params: SamplingParams
    max_new_tokens: int  # params.max_new_tokens clipped to the context length
    arrival_time: float = field(default_factory=time.monotonic)
    num_prompt_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    pages: RequestPages = field(default_factory=RequestPages)
    finish_reason: str | None = None
    output_logprobs: list[TokenLogprob] = field(default_factory=list)
    # prompt_logprobs[i] is for prompt token i + 1 (token 0 has no prediction)
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)
    num_preemptions: int = 0
    cached_tokens: int = 0  # prompt tokens the prefix cache served at (the first) admission
    first_token_time: float | None = None
    generator: torch.Generator | None = field(default=None, repr=False)  # seeded requests only
    num_pending: int = 0  # trailing placeholder tokens (overlap schedule)
    state_slot: int | None = None  # hybrid models: the linear-attention state slot while running

    def __post_init__(self) -> None:
        if not self.num_prompt_tokens:
            self.num_prompt_tokens = len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens : len(self.token_ids) - self.num_pending]

    @property
    def known_token_ids(self) -> list[int]:
        """``token_ids`` without the placeholders (the list itself when there are none)."""
        return (
            self.token_ids[: len(self.token_ids) - self.num_pending] if self.num_pending else self.token_ids
        )

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Output tokens known on the host (placeholders not counted)."""
        return len(self.token_ids) - self.num_prompt_tokens - self.num_pending

    @property
    def num_cached(self) -> int:
        """Tokens whose K/V is stored."""
        return self.pages.num_tokens

    @property
    def is_decoding(self) -> bool:
        return self.num_tokens - self.num_cached == 1

    @property
    def finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def wants_prompt_logprobs(self) -> bool:
        """Prompt logprobs still to compute (they survive preemption, so recompute skips them)."""
        return (
            self.params.prompt_logprobs is not None and len(self.prompt_logprobs) < self.num_prompt_tokens - 1
        )


def placeholder(row: int) -> int:
    """The token id that stands for row ``row`` of a launched step's device tokens (overlap schedule)."""
    return -(row + 1)


def fill_placeholders(ids: torch.Tensor, prev_tokens: torch.Tensor) -> torch.Tensor:
    """``ids`` with each :func:`placeholder` ``-(k + 1)`` replaced by ``prev_tokens[k]`` (on the device, no sync)."""
    rows = (-ids - 1).clamp(0, prev_tokens.numel() - 1)
    return torch.where(ids < 0, prev_tokens[rows], ids)


@dataclass
class RequestOutput:
    """What :meth:`nibblekv.Engine.generate` returns for one prompt (and the streaming API per step).

    ``text_delta`` is the text added since the previous output of this request (streaming);
    ``text`` the whole completion so far, stop string excluded; ``prompt_token_ids`` is filled in
    the final output only (copying long prompts every step costs real time).
    """

    request_id: str
    text: str
    token_ids: list[int]
    finished: bool
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens the prefix cache served
    text_delta: str = ""
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob] | None = None
    prompt_token_ids: list[int] = field(default_factory=list)
