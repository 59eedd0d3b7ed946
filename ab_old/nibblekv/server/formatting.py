"""Turning engine deltas into OpenAI response objects (whole responses and stream chunks)."""

from __future__ import annotations

from dataclasses import dataclass, field

from nibblekv.server.engine_api import Delta, ServingTokenizer, TokenLogprob
from nibblekv.server.protocol import (
    ChatLogprobs,
    CompletionLogprobs,
    TopLogprob,
    UsageInfo,
)
from nibblekv.server.protocol import TokenLogprob as ChatTokenLogprob


class TokenNames:
    """Token id -> the text it stands for (special tokens spelled out), memoized."""

    def __init__(self, tokenizer: ServingTokenizer) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        name = self._cache.get(token_id)
        if name is None:
            name = self._tokenizer.decode([token_id], skip_special_tokens=False)
            self._cache[token_id] = name
        return name


@dataclass
class ChoiceState:
    """Everything one choice has produced so far."""

    index: int
    prompt_ids: list[int]
    drop_output: bool = False  # max_tokens=0: the engine's one token is not returned
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    def apply(self, delta: Delta) -> Delta:
        """Fold one delta in; return it as the client should see it (emptied when output is dropped)."""
        if delta.prompt_logprobs is not None:
            self.prompt_logprobs = delta.prompt_logprobs
        self.prompt_tokens = delta.prompt_tokens
        self.cached_tokens = delta.cached_tokens
        if delta.finished:
            self.finish_reason = delta.finish_reason or "stop"
        if self.drop_output:
            delta = Delta(
                "",
                [],
                [],
                delta.prompt_logprobs,
                delta.finished,
                "length",
                delta.prompt_tokens,
                0,
                delta.cached_tokens,
            )
            if delta.finished:
                self.finish_reason = "length"
            return delta
        self.text.append(delta.text)
        self.token_ids.extend(delta.token_ids)
        self.logprobs.extend(delta.logprobs)
        self.completion_tokens = delta.completion_tokens or len(self.token_ids)
        return delta


def usage_of(states: list[ChoiceState]) -> UsageInfo:
    """Usage summed over choices; a prompt shared by ``n`` choices is counted once per prompt."""
    usage = UsageInfo()
    seen_prompts: set[int] = set()
    for s in states:
        key = id(s.prompt_ids)
        first = key not in seen_prompts
        seen_prompts.add(key)
        usage.add(s.prompt_tokens if first else 0, s.completion_tokens, s.cached_tokens if first else 0)
    return usage


def completion_logprobs(
    entries: list[TokenLogprob], names: TokenNames, offset: int = 0
) -> CompletionLogprobs:
    """Legacy completions logprobs for ``entries``; ``offset`` is the text offset of the first token."""
    out = CompletionLogprobs()
    for entry in entries:
        token = names(entry.token_id)
        out.tokens.append(token)
        out.token_logprobs.append(entry.logprob)
        out.text_offset.append(offset)
        offset += len(token)
        if entry.logprob is None:
            out.top_logprobs.append(None)
            continue
        top = {names(t): lp for t, lp in entry.top}
        # OpenAI returns the sampled token among the alternatives even when it is not in the top k.
        top.setdefault(token, entry.logprob)
        out.top_logprobs.append(top)
    return out


def prompt_entries(state: ChoiceState) -> list[TokenLogprob]:
    """Echoed prompt tokens with their logprobs (all ``None`` if the engine sent none)."""
    if state.prompt_logprobs is not None and len(state.prompt_logprobs) == len(state.prompt_ids):
        return state.prompt_logprobs
    return [TokenLogprob(t, None) for t in state.prompt_ids]


def chat_logprobs(entries: list[TokenLogprob], names: TokenNames) -> ChatLogprobs:
    """Chat-style logprobs for generated tokens."""
    content = []
    for entry in entries:
        token = names(entry.token_id)
        top = [TopLogprob(token=names(t), logprob=lp, bytes=list(names(t).encode())) for t, lp in entry.top]
        content.append(
            ChatTokenLogprob(
                token=token,
                logprob=entry.logprob if entry.logprob is not None else 0.0,
                bytes=list(token.encode()),
                top_logprobs=top,
            )
        )
    return ChatLogprobs(content=content)


def text_length(entries: list[TokenLogprob], names: TokenNames) -> int:
    """Characters spanned by ``entries``' token strings (for ``text_offset`` after an echo)."""
    return sum(len(names(e.token_id)) for e in entries)
