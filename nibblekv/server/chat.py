"""``POST /v1/chat/completions``: the model's chat template, ``n`` choices, streaming."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nibblekv.server.formatting import ChoiceState, TokenNames, chat_logprobs, usage_of
from nibblekv.server.generation import GenerationJob, merged_streams
from nibblekv.server.metrics import TokenTimer
from nibblekv.server.params import chat_prompt, make_params, resolve_max_tokens, sampling_kwargs
from nibblekv.server.protocol import (
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatResponseMessage,
    ChatStreamChoice,
    dump,
    make_id,
)
from nibblekv.server.responses import (
    admit,
    check_model,
    check_not_shut_down,
    finish_metrics,
    respond,
    sse_response,
)
from nibblekv.server.state import ServerState, get_state, parse_body


def _jobs(
    req: ChatCompletionRequest, state: ServerState
) -> tuple[list[GenerationJob], dict[int, ChoiceState]]:
    """``n`` engine requests for the templated conversation."""
    ids = chat_prompt(req, state.tokenizer, state.limits)
    max_new = resolve_max_tokens(req.max_new_tokens(), len(ids), state.limits)
    top = (req.top_logprobs or 0) if req.logprobs else None
    params = make_params(state.sampling_params, sampling_kwargs(req, max_new, top, None))
    jobs = [GenerationJob(j, ids, params) for j in range(req.n)]
    return jobs, {j: ChoiceState(j, ids, drop_output=max_new == 0) for j in range(req.n)}


async def create_chat_completion(request: Request) -> Response:
    """Handle one chat completions request, streaming or not."""
    state = get_state(request)
    req = await parse_body(request, ChatCompletionRequest)
    check_model(state, req.model)
    jobs, states = _jobs(req, state)
    release = admit(state, len(jobs))
    rid = make_id("chatcmpl")
    if req.stream:
        return sse_response(request, _stream(req, state, jobs, states, rid), release)
    try:
        await respond(request, _collect(state, jobs, states))
    finally:
        release()
    check_not_shut_down(state, states.values())
    names = TokenNames(state.tokenizer)
    choices = [
        ChatChoice(
            index=i,
            message=ChatResponseMessage(role="assistant", content="".join(s.text)),
            logprobs=chat_logprobs(s.logprobs, names) if req.logprobs else None,
            finish_reason=s.finish_reason,
        )
        for i, s in sorted(states.items())
    ]
    body = ChatCompletionResponse(
        id=rid, model=state.model_name, choices=choices, usage=usage_of(list(states.values()))
    )
    return JSONResponse(dump(body))


async def _collect(state: ServerState, jobs: list[GenerationJob], states: dict[int, ChoiceState]) -> None:
    timers = {job.index: TokenTimer(state.metrics) for job in jobs}
    async for index, delta in merged_streams(state.engine, jobs, state.live_requests):
        timers[index].on_tokens(len(delta.token_ids))
        states[index].apply(delta)
        if delta.finished:
            finish_metrics(state, states[index], timers[index])


async def _stream(
    req: ChatCompletionRequest,
    state: ServerState,
    jobs: list[GenerationJob],
    states: dict[int, ChoiceState],
    rid: str,
) -> AsyncIterator[str]:
    """SSE payloads: a role chunk per choice, content deltas, finish, optional usage."""
    names = TokenNames(state.tokenizer)
    timers = {job.index: TokenTimer(state.metrics) for job in jobs}

    def chunk(choice: ChatStreamChoice) -> str:
        return json.dumps(dump(ChatCompletionChunk(id=rid, model=state.model_name, choices=[choice])))

    for index in sorted(states):
        yield chunk(ChatStreamChoice(index=index, delta=ChatResponseMessage(role="assistant", content="")))
    async for index, delta in merged_streams(state.engine, jobs, state.live_requests):
        choice = states[index]
        timers[index].on_tokens(len(delta.token_ids))
        shown = choice.apply(delta)
        finish = None
        if delta.finished:
            finish = choice.finish_reason
            finish_metrics(state, choice, timers[index])
        if shown.text or finish or (req.logprobs and shown.logprobs):
            logprobs = chat_logprobs(shown.logprobs, names) if req.logprobs else None
            yield chunk(
                ChatStreamChoice(
                    index=index,
                    delta=ChatResponseMessage(content=shown.text or None),
                    logprobs=logprobs,
                    finish_reason=finish,
                )
            )
    if req.include_usage():
        usage = usage_of(list(states.values()))
        yield json.dumps(dump(ChatCompletionChunk(id=rid, model=state.model_name, choices=[], usage=usage)))
