"""What the server needs from the engine, and the one place that reads engine outputs.

The server talks to :class:`nibblekv.engine.AsyncEngine` only through :class:`ServingEngine`; the
incremental outputs it yields are read by :func:`to_delta`, so an engine-side rename touches one file.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from nibblekv.model.tokenizer import ChatRender

# (token id, logprob) pairs, best first.
TopLogprobs = list[tuple[int, float]]


class ServingTokenizer(Protocol):
    """The tokenizer calls the server makes (see :class:`nibblekv.model.tokenizer.Tokenizer`)."""

    eos_token_ids: list[int]
    vocab_size: int

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    def apply_chat_template(
        self, messages: Sequence[dict[str, str]], how: ChatRender = ..., add_special_tokens: bool = False
    ) -> list[int]: ...


class ServingEngine(Protocol):
    """The async engine calls the server makes."""

    tokenizer: Any

    def generate(
        self, prompt: str | list[int], params: Any, request_id: str | None = None
    ) -> AsyncIterator[Any]:
        """Incremental outputs of one request."""
        ...

    def abort(self, request_id: str) -> None: ...

    async def flush_cache(self) -> bool:
        """Drop the prefix cache; False while requests run or wait."""
        ...

    def stats(self) -> Any: ...

    def is_healthy(self) -> bool: ...

    def shutdown(self) -> None: ...


@dataclass
class TokenLogprob:
    """One position's logprob: the chosen token's and the top alternatives."""

    token_id: int
    logprob: float | None
    top: TopLogprobs = field(default_factory=list)


@dataclass
class Delta:
    """What one engine output adds to a request, in the server's terms."""

    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob]
    prompt_logprobs: list[TokenLogprob] | None
    finished: bool
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


def _token_logprobs(ids: Sequence[int], raw: Sequence[Any]) -> list[TokenLogprob]:
    """Pair token ids with the engine's per-token records (``token_id``, ``logprob``, ``top_logprobs``)."""
    result: list[TokenLogprob] = []
    for token_id, entry in zip(ids, raw, strict=False):
        top = [(int(t), float(lp)) for t, lp in entry.top_logprobs]
        result.append(TokenLogprob(int(token_id), float(entry.logprob), top))
    return result


class DeltaReader:
    """Reads one request's engine outputs (:class:`nibblekv.engine.request.RequestOutput`) as deltas.

    The engine reports the completion so far (``token_ids``, ``logprobs``); this keeps what was
    already seen so each :class:`Delta` carries only the new part. Prompt logprobs start at prompt
    token 1 in the engine; a ``None`` entry is put in front for token 0, as OpenAI does.
    """

    def __init__(self, prompt_ids: Sequence[int]) -> None:
        self.prompt_ids = list(prompt_ids)
        self._tokens_seen = 0
        self._logprobs_seen = 0
        self._prompt_logprobs_sent = False

    def read(self, out: Any) -> Delta:
        """The new part of ``out``."""
        all_ids = [int(t) for t in out.token_ids]
        new_ids = all_ids[self._tokens_seen :]
        self._tokens_seen = len(all_ids)
        raw_lp = list(out.logprobs or [])[self._logprobs_seen :]
        self._logprobs_seen += len(raw_lp)
        return Delta(
            text=str(out.text_delta or ""),
            token_ids=new_ids,
            logprobs=_token_logprobs(new_ids, raw_lp),
            prompt_logprobs=self._prompt_logprobs(out.prompt_logprobs),
            finished=bool(out.finished),
            finish_reason=out.finish_reason,
            prompt_tokens=int(out.prompt_tokens),
            completion_tokens=int(out.completion_tokens),
            cached_tokens=int(out.cached_tokens),
        )

    def _prompt_logprobs(self, raw: Sequence[Any] | None) -> list[TokenLogprob] | None:
        if self._prompt_logprobs_sent or not raw or len(raw) < len(self.prompt_ids) - 1:
            return None  # not (all) computed yet
        self._prompt_logprobs_sent = True
        first = TokenLogprob(self.prompt_ids[0], None)
        return [first, *_token_logprobs(self.prompt_ids[1:], raw)]
