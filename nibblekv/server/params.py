"""From a validated request body to engine inputs: prompt token ids and sampling parameters.

Length checks happen here, before anything reaches the engine, so an over-long prompt is a 400 with
vLLM's wording instead of a failure deep in the scheduler.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from nibblekv.server.engine_api import ServingTokenizer
from nibblekv.server.errors import APIError
from nibblekv.server.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    ChatTemplateFields,
    CompletionRequest,
    SamplingFields,
)


@dataclass(frozen=True)
class ModelLimits:
    """What bounds a request: the context length, the vocabulary, and the longest prompt + 1 token
    the KV pool can hold (``kv_tokens``; at most the context length)."""

    context_length: int
    vocab_size: int
    kv_tokens: int


def completion_prompts(
    req: CompletionRequest, tokenizer: ServingTokenizer, limits: ModelLimits
) -> list[list[int]]:
    """The request's prompts as token-id lists (a string, strings, ids, or lists of ids)."""
    raw, special = req.prompt, req.add_special_tokens
    if isinstance(raw, str):
        prompts = [tokenizer.encode(raw, add_special_tokens=special)]
    elif all(isinstance(p, int) for p in raw):
        prompts = [[int(p) for p in raw]]  # type: ignore[arg-type]
    elif all(isinstance(p, str) for p in raw):
        prompts = [tokenizer.encode(str(p), add_special_tokens=special) for p in raw]
    elif all(isinstance(p, list) for p in raw):
        prompts = [[int(t) for t in p] for p in raw]  # type: ignore[union-attr]
    else:
        raise APIError(
            "prompt must be a string, a list of strings, a list of token ids or a list of those",
            param="prompt",
        )
    prompts = [truncate(ids, req.truncate_prompt_tokens) for ids in prompts]
    for ids in prompts:
        check_prompt_ids(ids, limits)
    return prompts


def truncate(ids: list[int], keep: int | None) -> list[int]:
    """vLLM's ``truncate_prompt_tokens``: the prompt's last ``keep`` tokens (all of them for None)."""
    return ids if keep is None else ids[-keep:]


def chat_prompt(req: ChatCompletionRequest, tokenizer: ServingTokenizer, limits: ModelLimits) -> list[int]:
    """The chat template applied to the messages, as token ids checked against the limits."""
    ids = render_chat(req.messages, req, tokenizer, req.add_special_tokens)
    ids = truncate(ids, req.truncate_prompt_tokens)
    check_prompt_ids(ids, limits)
    return ids


def render_chat(
    messages: Sequence[ChatMessage],
    how: ChatTemplateFields,
    tokenizer: ServingTokenizer,
    add_special_tokens: bool = False,
) -> list[int]:
    """The chat template applied to ``messages`` as ``how`` says, as token ids (a template error is a 400)."""
    rendered = [{"role": m.role, "content": m.text()} for m in messages]
    try:
        return list(tokenizer.apply_chat_template(rendered, how.render(), add_special_tokens))
    except ValueError as exc:  # e.g. a template that rejects the role order
        raise APIError(f"cannot apply the chat template: {exc}", param="messages") from exc
    except Exception as exc:  # jinja2 TemplateError and friends are client-caused too
        raise APIError(
            f"cannot apply the chat template: {type(exc).__name__}: {exc}", param="messages"
        ) from exc


def check_prompt_ids(ids: list[int], limits: ModelLimits) -> None:
    """Reject empty prompts, out-of-vocabulary ids and prompts that fill the whole context."""
    if not ids:
        raise APIError("the prompt is empty", param="prompt")
    bad = next((t for t in ids if not 0 <= t < limits.vocab_size), None)
    if bad is not None:
        raise APIError(f"token id {bad} is out of range [0, {limits.vocab_size})", param="prompt")
    if len(ids) >= limits.context_length:
        raise APIError(
            f"This model's maximum context length is {limits.context_length} tokens. However, your prompt "
            f"has {len(ids)} tokens, which leaves no room for a completion. Please reduce the length of "
            "the prompt.",
            param="prompt",
        )
    if len(ids) >= limits.kv_tokens:
        raise APIError(
            f"The prompt has {len(ids)} tokens, more than this server's KV cache holds for one request "
            f"({limits.kv_tokens - 1} tokens). Please reduce the length of the prompt.",
            param="prompt",
        )


def check_logit_bias(bias: dict[int, float] | None, limits: ModelLimits) -> None:
    """A 400 for a ``logit_bias`` token outside the vocabulary (the ranges are the protocol's)."""
    bad = next((t for t in bias or {} if t >= limits.vocab_size), None)
    if bad is not None:
        raise APIError(
            f"logit_bias token id {bad} is out of range [0, {limits.vocab_size})", param="logit_bias"
        )


def check_min_tokens(min_tokens: int, max_new_tokens: int, names: tuple[str, str]) -> None:
    """A 400 for a minimum above the most new tokens; ``names``: the route's (min, max) field names."""
    if min_tokens > max_new_tokens:
        raise APIError(
            f"{names[0]} must be less than or equal to {names[1]}={max_new_tokens}, got {min_tokens}",
            param=names[0],
        )


def resolve_max_tokens(requested: int | None, prompt_len: int, limits: ModelLimits) -> int:
    """``max_tokens`` checked against the context; ``None`` means "up to the context length"."""
    room = limits.context_length - prompt_len
    if requested is None:
        return room
    if prompt_len + requested > limits.context_length:
        raise APIError(
            f"This model's maximum context length is {limits.context_length} tokens. However, you "
            f"requested {prompt_len + requested} tokens ({prompt_len} in the prompt, {requested} for "
            "the completion). Please reduce the length of the prompt or the completion.",
            param="max_tokens",
        )
    return requested


def sampling_kwargs(
    req: SamplingFields,
    max_new_tokens: int,
    logprobs: int | None,
    prompt_logprobs: int | None,
    limits: ModelLimits,
) -> dict[str, Any]:
    """Keyword arguments for ``SamplingParams``; unset fields keep the engine's defaults. A ``logit_bias``
    token outside the vocabulary, or ``min_tokens`` above ``max_tokens``, is a 400."""
    check_logit_bias(req.logit_bias, limits)
    check_min_tokens(req.min_tokens, max_new_tokens, ("min_tokens", "max_tokens"))
    kwargs: dict[str, Any] = {
        # The engine generates at least one token; max_tokens=0 (lm-eval scoring) drops it later.
        "max_new_tokens": max(1, max_new_tokens),
        "stop": req.stop_list(),
        "stop_token_ids": list(req.stop_token_ids or []),
        "ignore_eos": req.ignore_eos,
        "min_new_tokens": req.min_tokens,
        "include_stop_str_in_output": req.include_stop_str_in_output,
        "skip_special_tokens": req.skip_special_tokens,
        "logit_bias": dict(req.logit_bias or {}),
        "logprobs": logprobs,
        "prompt_logprobs": prompt_logprobs,
    }
    optional = {
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": None if req.top_k is None or req.top_k <= 0 else req.top_k,
        "min_p": req.min_p,
        "repetition_penalty": req.repetition_penalty,
        "frequency_penalty": req.frequency_penalty,
        "presence_penalty": req.presence_penalty,
        "seed": req.seed,
    }
    kwargs.update({k: v for k, v in optional.items() if v is not None})
    return kwargs


def make_params(factory: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """Build ``SamplingParams``; its own ``ValueError`` becomes a 400 naming the field if it can."""
    try:
        return factory(**kwargs)
    except (ValueError, TypeError) as exc:
        message = str(exc)
        param = next((k for k in kwargs if k in message), None)
        raise APIError(f"invalid sampling parameters: {message}", param=param) from exc
