"""``POST /v1/completions``: string, batch or token-id prompts; ``echo`` + ``logprobs`` for scoring."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nibblekv.server.engine_api import Delta
from nibblekv.server.errors import APIError
from nibblekv.server.formatting import (
    ChoiceState,
    TokenNames,
    completion_logprobs,
    prompt_entries,
    text_length,
    usage_of,
)
from nibblekv.server.generation import GenerationJob, merged_streams
from nibblekv.server.metrics import TokenTimer
from nibblekv.server.params import completion_prompts, make_params, resolve_max_tokens, sampling_kwargs
from nibblekv.server.protocol import CompletionChoice, CompletionRequest, CompletionResponse, dump, make_id
from nibblekv.server.responses import (
    admit,
    check_model,
    check_not_shut_down,
    finish_metrics,
    respond,
    sse_response,
)
from nibblekv.server.state import ServerState, get_state, parse_body


def _jobs(req: CompletionRequest, state: ServerState) -> tuple[list[GenerationJob], dict[int, ChoiceState]]:
    """One engine request per (prompt, n) pair; choice index = prompt index * n + j, as in OpenAI."""
    prompts = completion_prompts(req, state.tokenizer, state.limits)
    logprobs = req.logprobs
    jobs: list[GenerationJob] = []
    states: dict[int, ChoiceState] = {}
    for p, ids in enumerate(prompts):
        max_new = resolve_max_tokens(req.max_tokens, len(ids), state.limits)
        kwargs = sampling_kwargs(
            req, max_new, logprobs, logprobs if req.echo and logprobs is not None else None
        )
        params = make_params(state.sampling_params, kwargs)
        for j in range(req.n):
            index = p * req.n + j
            jobs.append(GenerationJob(index, ids, params))
            states[index] = ChoiceState(index, ids, drop_output=max_new == 0)
    return jobs, states


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
    jobs, states = _jobs(req, state)
    release = admit(state, len(jobs))
    rid = make_id("cmpl")
    if req.stream:
        return sse_response(request, _stream(req, state, jobs, states, rid), release)
    try:
        await respond(request, _collect(state, jobs, states))
    finally:
        release()
    check_not_shut_down(state, states.values())
    names = TokenNames(state.tokenizer)
    choices = [_final_choice(req, state, states[i], names) for i in sorted(states)]
    body = CompletionResponse(
        id=rid, model=state.model_name, choices=choices, usage=usage_of(list(states.values()))
    )
    return JSONResponse(dump(body))


async def _collect(state: ServerState, jobs: list[GenerationJob], states: dict[int, ChoiceState]) -> None:
    timers = {job.index: TokenTimer(state.metrics) for job in jobs}
    async for index, delta in merged_streams(state.engine, jobs, state.live_requests):
        _observe(states[index], delta, timers[index], state)


def _observe(choice: ChoiceState, delta: Delta, timer: TokenTimer, state: ServerState) -> Delta:
    """Fold a delta into its choice and record its latency / token metrics."""
    timer.on_tokens(len(delta.token_ids))
    shown = choice.apply(delta)
    if delta.finished:
        finish_metrics(state, choice, timer)
    return shown


async def _stream(
    req: CompletionRequest,
    state: ServerState,
    jobs: list[GenerationJob],
    states: dict[int, ChoiceState],
    rid: str,
) -> AsyncIterator[str]:
    """SSE payloads: text deltas per choice, a usage chunk if asked, then ``[DONE]``."""
    names = TokenNames(state.tokenizer)
    timers = {job.index: TokenTimer(state.metrics) for job in jobs}
    offsets = {i: 0 for i in states}  # text offset of the next token, per choice
    started: set[int] = set()

    def chunk(choice: CompletionChoice) -> str:
        return json.dumps(dump(CompletionResponse(id=rid, model=state.model_name, choices=[choice])))

    async for index, delta in merged_streams(state.engine, jobs, state.live_requests):
        choice = states[index]
        shown = _observe(choice, delta, timers[index], state)
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
        usage = usage_of(list(states.values()))
        yield json.dumps(dump(CompletionResponse(id=rid, model=state.model_name, choices=[], usage=usage)))
