"""``POST /v1/chat/completions``: the model's chat template, ``n`` choices, streaming."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nibblekv.server.formatting import TokenNames, chat_logprobs, usage_of
from nibblekv.server.params import chat_prompt, make_params, resolve_max_tokens, sampling_kwargs
from nibblekv.server.protocol import (
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatResponseMessage,
    ChatStreamChoice,
    dump,
)
from nibblekv.server.responses import Generation, check_model, observed, run_to_end, stream_response
from nibblekv.server.state import ServerState, get_state, parse_body


def _generation(req: ChatCompletionRequest, state: ServerState) -> Generation:
    """``n`` engine requests for the templated conversation."""
    ids = chat_prompt(req, state.tokenizer, state.limits)
    max_new = resolve_max_tokens(req.max_new_tokens(), len(ids), state.limits)
    top = (req.top_logprobs or 0) if req.logprobs else None
    params = make_params(state.sampling_params, sampling_kwargs(req, max_new, top, None, state.limits))
    return Generation.of([(ids, params, max_new)], req.n, "chatcmpl")


async def create_chat_completion(request: Request) -> Response:
    """Handle one chat completions request, streaming or not."""
    state = get_state(request)
    req = await parse_body(request, ChatCompletionRequest)
    check_model(state, req.model)
    gen = _generation(req, state)
    if req.stream:
        return stream_response(request, state, gen, _stream(req, state, gen))
    await run_to_end(request, state, gen)
    names = TokenNames(state.tokenizer)
    choices = [
        ChatChoice(
            index=i,
            message=ChatResponseMessage(role="assistant", content="".join(s.text)),
            logprobs=chat_logprobs(s.logprobs, names) if req.logprobs else None,
            finish_reason=s.finish_reason,
        )
        for i, s in sorted(gen.choices.items())
    ]
    usage = usage_of(list(gen.choices.values()))
    return JSONResponse(
        dump(ChatCompletionResponse(id=gen.rid, model=state.model_name, choices=choices, usage=usage))
    )


async def _stream(req: ChatCompletionRequest, state: ServerState, gen: Generation) -> AsyncIterator[str]:
    """SSE payloads: a role chunk per choice, content deltas, finish, optional usage."""
    names = TokenNames(state.tokenizer)

    def chunk(choice: ChatStreamChoice) -> str:
        return json.dumps(dump(ChatCompletionChunk(id=gen.rid, model=state.model_name, choices=[choice])))

    for index in sorted(gen.choices):
        yield chunk(ChatStreamChoice(index=index, delta=ChatResponseMessage(role="assistant", content="")))
    async for choice, delta, shown in observed(state, gen):
        finish = choice.finish_reason if delta.finished else None
        if shown.text or finish or (req.logprobs and shown.logprobs):
            logprobs = chat_logprobs(shown.logprobs, names) if req.logprobs else None
            yield chunk(
                ChatStreamChoice(
                    index=choice.index,
                    delta=ChatResponseMessage(content=shown.text or None),
                    logprobs=logprobs,
                    finish_reason=finish,
                )
            )
    if req.include_usage():
        usage = usage_of(list(gen.choices.values()))
        yield json.dumps(
            dump(ChatCompletionChunk(id=gen.rid, model=state.model_name, choices=[], usage=usage))
        )
