"""vLLM's ``POST /tokenize`` and ``POST /detokenize``: the served tokenizer, for clients that count or
build token ids (a prompt's length against ``max_model_len``, ``logit_bias`` keys, ``input_ids``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator
from starlette.requests import Request
from starlette.responses import JSONResponse

from nibblekv.server.errors import APIError
from nibblekv.server.params import render_chat
from nibblekv.server.protocol import ChatMessage, ChatTemplateFields, TokenId
from nibblekv.server.responses import check_model
from nibblekv.server.state import get_state, parse_body


class TokenizeRequest(ChatTemplateFields):
    """A ``prompt`` (``add_special_tokens`` as the completions route encodes it), or chat ``messages``
    rendered by the model's template as the chat route does (``ChatTemplateFields``)."""

    model: str | None = None
    prompt: str | None = None
    add_special_tokens: StrictBool = True
    messages: list[ChatMessage] | None = Field(default=None, min_length=1, max_length=4096)

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt and messages")
        return self


class DetokenizeRequest(BaseModel):
    """Token ids to decode (special tokens kept, as vLLM does)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    tokens: list[TokenId]


async def tokenize(request: Request) -> JSONResponse:
    """``{"tokens", "count", "max_model_len"}`` for the prompt or the templated messages."""
    state = get_state(request)
    req = await parse_body(request, TokenizeRequest)
    check_model(state, req.model)
    if req.messages is not None:
        ids = render_chat(req.messages, req, state.tokenizer)
    else:
        ids = state.tokenizer.encode(req.prompt or "", add_special_tokens=req.add_special_tokens)
    return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": state.limits.context_length})


async def detokenize(request: Request) -> JSONResponse:
    """``{"prompt"}``: the text of ``tokens``; an id outside the vocabulary is a 400."""
    state = get_state(request)
    req = await parse_body(request, DetokenizeRequest)
    check_model(state, req.model)
    bad = next((t for t in req.tokens if t >= state.limits.vocab_size), None)
    if bad is not None:
        raise APIError(f"token id {bad} is out of range [0, {state.limits.vocab_size})", param="tokens")
    return JSONResponse({"prompt": state.tokenizer.decode(req.tokens, skip_special_tokens=False)})
