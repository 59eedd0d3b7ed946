"""``POST /v1/completions``: string, batch or token-id prompts; ``echo`` + ``logprobs`` for scoring."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nibblekv.server.errors import APIError
from nibblekv.server.formatting import (
    ChoiceState,
    TokenNames,
    completion_logprobs,
    prompt_entries,
    text_length,
    usage_of,
)
from nibblekv.server.params import completion_prompts, make_params, resolve_max_tokens, sampling_kwargs
from nibblekv.server.protocol import CompletionChoice, CompletionRequest, CompletionResponse, dump
from nibblekv.server.responses import Generation, check_model, observed, run_to_end, stream_response
from nibblekv.server.state import ServerState, get_state, parse_body


def _generation(req: CompletionRequest, state: ServerState) -> Generation:
    """One engine request per (prompt, n) pair; choice index = prompt index * n + j, as in OpenAI."""
    logprobs = req.logprobs
    prompts: list[tuple[list[int], Any, int]] = []
    for ids in completion_prompts(req, state.tokenizer, state.limits):
        max_new = resolve_max_tokens(req.max_tokens, len(ids), state.limits)
        echo_lp = logprobs if req.echo and logprobs is not None else None
        kwargs = sampling_kwargs(req, max_new, logprobs, echo_lp, state.limits)
        prompts.append((ids, make_params(state.sampling_params, kwargs), max_new))
    return Generation.of(prompts, req.n, "cmpl")


def _echo_text(req: CompletionRequest, state: ServerState, choice: ChoiceState) -> str:
    """The prompt as the client sent it (strings) or decoded (token ids)."""
    if isinstance(req.prompt, str):
        return req.prompt
    if isinstance(req.prompt, list) and req.prompt and isinstance(req.prompt[0], str):
        return str(req.prompt[choice.index // req.n])
    return state.tokenizer.decode(choice.prompt_ids, skip_special_tokens=False)


def _final_choice(
    req: CompletionRequest, state: ServerState, choice: ChoiceState, names: TokenNames
) -> CompletionChoice:
    text = "".join(choice.text)
    logprobs = None
    if req.logprobs is not None:
        entries = (prompt_entries(choice) if req.echo else []) + choice.logprobs
        logprobs = completion_logprobs(entries, names)
    if req.echo:
        text = _echo_text(req, state, choice) + text
    return CompletionChoice(
        index=choice.index, text=text, logprobs=logprobs, finish_reason=choice.finish_reason
    )


async def create_completion(request: Request) -> Response:
    """Handle one completions request, streaming or not."""
    state = get_state(request)
    req = await parse_body(request, CompletionRequest)
    check_model(state, req.model)
    if req.suffix:
        raise APIError("suffix (insertion) is not supported", param="suffix")
    gen = _generation(req, state)
    if req.stream:
        return stream_response(request, state, gen, _stream(req, state, gen))
    await run_to_end(request, state, gen)
    names = TokenNames(state.tokenizer)
    choices = [_final_choice(req, state, gen.choices[i], names) for i in sorted(gen.choices)]
    usage = usage_of(list(gen.choices.values()))
    return JSONResponse(
        dump(CompletionResponse(id=gen.rid, model=state.model_name, choices=choices, usage=usage))
    )


async def _stream(req: CompletionRequest, state: ServerState, gen: Generation) -> AsyncIterator[str]:
    """SSE payloads: text deltas per choice, a usage chunk if asked, then ``[DONE]``."""
    names = TokenNames(state.tokenizer)
    offsets = {i: 0 for i in gen.choices}  # text offset of the next token, per choice
    started: set[int] = set()

    def chunk(choice: CompletionChoice) -> str:
        return json.dumps(dump(CompletionResponse(id=gen.rid, model=state.model_name, choices=[choice])))

    async for choice, delta, shown in observed(state, gen):
        index = choice.index
        text, entries = shown.text, list(shown.logprobs)
        if req.echo and index not in started and (req.logprobs is None or shown.prompt_logprobs is not None):
            started.add(index)
            text = _echo_text(req, state, choice) + text
            entries = prompt_entries(choice) + entries
        logprobs = None
        if req.logprobs is not None:
            logprobs = completion_logprobs(entries, names, offsets[index])
            offsets[index] += text_length(entries, names)
        finish = choice.finish_reason if delta.finished else None
        if text or finish or entries:
            yield chunk(CompletionChoice(index=index, text=text, logprobs=logprobs, finish_reason=finish))
    if req.include_usage():
        usage = usage_of(list(gen.choices.values()))
        yield json.dumps(
            dump(CompletionResponse(id=gen.rid, model=state.model_name, choices=[], usage=usage))
        )
