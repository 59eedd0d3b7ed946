"""``POST /generate``: SGLang's native generation endpoint (``text`` or ``input_ids``, ``sampling_params``).

One prompt with ``n == 1`` answers one object, a batch (or ``n > 1``) a list, each
``{"text", "output_ids", "meta_info"}`` with SGLang's ``meta_info`` (``id``, ``finish_reason`` as
``{"type": "stop", "matched": ...}`` / ``{"type": "length", "length": N}`` / ``{"type": "abort"}``, token
counts, ``e2e_latency``, and with ``return_logprob`` the ``[logprob, token_id, text]`` lists, ``text`` None
unless ``return_text_in_logprobs``). ``stream`` sends SGLang's server-sent events: each carries one output's
whole text so far, then ``data: [DONE]``. Unknown ``sampling_params`` keys, the constrained-decoding ones this
server lacks, and the request fields it cannot honour (``NATIVE_REFUSED``) are a 400.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nibblekv.server.errors import APIError
from nibblekv.server.formatting import ChoiceState, TokenNames, prompt_entries
from nibblekv.server.params import (
    check_logit_bias,
    check_min_tokens,
    check_prompt_ids,
    make_params,
    resolve_max_tokens,
)
from nibblekv.server.protocol import (
    MAX_BATCH_PROMPTS,
    MAX_LOGPROBS,
    MAX_N,
    MAX_STOP_SEQUENCES,
    REFUSED_FIELDS,
    TokenId,
    refuse,
)
from nibblekv.server.responses import Generation, observed, run_to_end, stream_response
from nibblekv.server.state import ServerState, describe_validation, get_state, parse_body

CONSTRAINTS = ("json_schema", "regex", "ebnf", "structural_tag")
# NOTE: SGLang's request fields this server cannot honour: a 400 when set (as protocol.REFUSED_FIELDS)
NATIVE_REFUSED = {
    **dict.fromkeys(
        ("input_embeds", "image_data", "audio_data", "video_data"), "input other than text or token ids"
    ),
    "lora_path": REFUSED_FIELDS["lora_path"],
    "lora_id": REFUSED_FIELDS["lora_path"],
    "return_hidden_states": REFUSED_FIELDS["return_hidden_states"],
    "session_params": "continuing sessions",
    "custom_logit_processor": "a custom logit processor",
    "token_ids_logprob": "returning logprobs of chosen token ids",
}


class NativeSampling(BaseModel):
    """SGLang's ``sampling_params`` (its names and defaults); other keys are refused, not ignored."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int = Field(default=128, ge=0, lt=2**31)
    min_new_tokens: int = Field(default=0, ge=0, lt=2**31)
    temperature: float = Field(default=1.0, ge=0.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int = Field(default=-1, ge=-1, lt=2**31)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0, allow_inf_nan=False)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    repetition_penalty: float = Field(default=1.0, gt=0.0, allow_inf_nan=False)
    stop: str | list[str] | None = Field(default=None)
    stop_token_ids: list[TokenId] | None = Field(default=None, max_length=MAX_STOP_SEQUENCES)
    ignore_eos: StrictBool = False
    skip_special_tokens: StrictBool = True
    no_stop_trim: StrictBool = False
    # NOTE: accepted as SGLang does; HF's fast tokenizers (the ones served here) ignore it there too
    spaces_between_special_tokens: StrictBool = True
    logit_bias: dict[int, float] | None = None
    sampling_seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
    n: int = Field(default=1, ge=1, le=MAX_N)
    json_schema: Any = None
    regex: Any = None
    ebnf: Any = None
    structural_tag: Any = None

    @model_validator(mode="after")
    def _no_constraints(self) -> NativeSampling:
        asked = [name for name in CONSTRAINTS if getattr(self, name) is not None]
        if asked:
            raise ValueError(f"constrained decoding ({', '.join(asked)}) is not supported by this server")
        return self

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOP_SEQUENCES:
            raise APIError(f"at most {MAX_STOP_SEQUENCES} stop sequences", param="stop")
        return [s for s in stops if s]


class GenerateRequest(BaseModel):
    """``POST /generate``: one of ``text`` / ``input_ids``, a single prompt or a batch (other fields are
    ignored, as the OpenAI routes do)."""

    model_config = ConfigDict(extra="ignore")

    text: str | list[str] | None = None
    input_ids: list[TokenId] | list[list[TokenId]] | None = None
    # NOTE: validated per prompt by ``_sampling``, so an error names the key, not pydantic's union branch
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    stream: StrictBool = False
    return_logprob: StrictBool = False
    logprob_start_len: int = Field(default=-1, ge=-1, lt=2**31)
    top_logprobs_num: int = Field(default=0, ge=0, le=MAX_LOGPROBS)
    return_text_in_logprobs: StrictBool = False
    rid: str | list[str] | None = None
    input_embeds: Any = None
    image_data: Any = None
    audio_data: Any = None
    video_data: Any = None
    lora_path: Any = None
    lora_id: Any = None
    return_hidden_states: Any = None
    session_params: Any = None
    custom_logit_processor: Any = None
    token_ids_logprob: Any = None

    @field_validator(*NATIVE_REFUSED)
    @classmethod
    def _refused(cls, value: Any, info: ValidationInfo) -> Any:
        return refuse(value, info, NATIVE_REFUSED)

    @field_validator("text", "input_ids")
    @classmethod
    def _batch_size(cls, value: Any) -> Any:
        if isinstance(value, list) and (not value or len(value) > MAX_BATCH_PROMPTS):
            raise ValueError(f"a batch holds 1 to {MAX_BATCH_PROMPTS} prompts")
        return value

    @model_validator(mode="after")
    def _one_input(self) -> GenerateRequest:
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("give exactly one of text and input_ids")
        return self

    def batched(self) -> bool:
        return isinstance(self.text, list) or bool(self.input_ids and isinstance(self.input_ids[0], list))


def _prompts(req: GenerateRequest, state: ServerState) -> list[list[int]]:
    if req.text is not None:
        texts = req.text if isinstance(req.text, list) else [req.text]
        prompts = [state.tokenizer.encode(t) for t in texts]
    else:
        raw = req.input_ids or []
        prompts = [list(p) for p in raw] if req.batched() else [list(raw)]  # type: ignore[arg-type]
    for ids in prompts:
        check_prompt_ids(ids, state.limits)
    return prompts


def _params(req: GenerateRequest, sp: NativeSampling, prompt_len: int, state: ServerState) -> tuple[Any, int]:
    """The engine's sampling parameters for one prompt, and its most new tokens."""
    max_new = resolve_max_tokens(sp.max_new_tokens, prompt_len, state.limits)
    check_logit_bias(sp.logit_bias, state.limits)
    check_min_tokens(sp.min_new_tokens, max_new, ("min_new_tokens", "max_new_tokens"))
    logprobs = req.top_logprobs_num if req.return_logprob else None
    kwargs: dict[str, Any] = {
        "max_new_tokens": max(1, max_new),  # the engine makes one token; max_new_tokens=0 drops it later
        "min_new_tokens": sp.min_new_tokens,
        "temperature": sp.temperature,
        "top_p": sp.top_p,
        "top_k": sp.top_k if sp.top_k > 0 else -1,
        "min_p": sp.min_p,
        "frequency_penalty": sp.frequency_penalty,
        "presence_penalty": sp.presence_penalty,
        "repetition_penalty": sp.repetition_penalty,
        "stop": sp.stops(),
        "stop_token_ids": list(sp.stop_token_ids or []),
        "ignore_eos": sp.ignore_eos,
        "skip_special_tokens": sp.skip_special_tokens,
        "include_stop_str_in_output": sp.no_stop_trim,
        "logit_bias": dict(sp.logit_bias or {}),
        "seed": sp.sampling_seed,
        "logprobs": logprobs,
        "prompt_logprobs": logprobs if req.return_logprob and req.logprob_start_len >= 0 else None,
    }
    return make_params(state.sampling_params, kwargs), max_new


def _sampling(raw: dict[str, Any]) -> NativeSampling:
    try:
        return NativeSampling.model_validate(raw)
    except ValidationError as exc:
        message, status, _ = describe_validation(exc, "sampling_params")
        raise APIError(message, status, param="sampling_params") from exc


def _generation(req: GenerateRequest, state: ServerState) -> tuple[Generation, list[NativeSampling], int]:
    """The engine requests of ``req`` (each output's rid its job's ``client_id``), each prompt's sampling
    parameters and ``n``."""
    prompts = _prompts(req, state)
    raw = req.sampling_params
    sps = [_sampling(r) for r in raw] if isinstance(raw, list) else [_sampling(raw or {})] * len(prompts)
    if len(sps) != len(prompts):
        raise APIError(f"{len(prompts)} prompts but {len(sps)} sampling_params", param="sampling_params")
    n = sps[0].n
    if any(sp.n != n for sp in sps):
        raise APIError("every prompt's sampling_params must have the same n", param="sampling_params")
    jobs = [(ids, *_params(req, sp, len(ids), state)) for ids, sp in zip(prompts, sps)]
    return Generation.of(jobs, n, "gen", client_ids=_rids(req, len(prompts) * n)), sps, n


def _triples(pairs: list[tuple[float | None, int]], names: TokenNames | None) -> list[list[Any]]:
    """SGLang's ``[logprob, token_id, text]`` lists (``text`` None without ``names``)."""
    return [[lp, t, names(t) if names else None] for lp, t in pairs]


def _finish(choice: ChoiceState, sp: NativeSampling, state: ServerState) -> dict[str, Any] | None:
    reason, ids = choice.finish_reason, choice.token_ids
    if reason is None:
        return None
    if reason == "length":
        return {"type": "length", "length": choice.completion_tokens}
    if reason != "stop":
        return {"type": reason}
    text = "".join(choice.text)
    full = state.tokenizer.decode(ids, skip_special_tokens=sp.skip_special_tokens)
    kept = max(map(len, sp.stops()), default=0) if sp.no_stop_trim else 0  # the stop string left in the text
    tail = full[max(0, len(text) - kept) :]
    matched: str | int | None = next((s for s in sp.stops() if s in tail), None)
    if matched is None and ids:
        matched = ids[-1]  # an EOS or stop token
    return {"type": "stop", "matched": matched}


def _item(
    req: GenerateRequest,
    choice: ChoiceState,
    sp: NativeSampling,
    rid: str,
    state: ServerState,
    t0: float,
    names: TokenNames | None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": _finish(choice, sp, state),
        "prompt_tokens": choice.prompt_tokens,
        "completion_tokens": choice.completion_tokens,
        "cached_tokens": choice.cached_tokens,
        "e2e_latency": time.perf_counter() - t0,
    }
    if req.return_logprob:
        meta["output_token_logprobs"] = _triples([(e.logprob, e.token_id) for e in choice.logprobs], names)
        if req.top_logprobs_num:
            tops = [_triples([(lp, t) for t, lp in e.top], names) for e in choice.logprobs]
            meta["output_top_logprobs"] = tops
        if req.logprob_start_len >= 0:
            prompt = prompt_entries(choice)[req.logprob_start_len :]
            meta["input_token_logprobs"] = _triples([(e.logprob, e.token_id) for e in prompt], names)
    return {"text": "".join(choice.text), "output_ids": list(choice.token_ids), "meta_info": meta}


def _rids(req: GenerateRequest, count: int) -> list[str]:
    given = [req.rid] if isinstance(req.rid, str) else list(req.rid or [])
    if given and len(given) != count:
        raise APIError(f"{len(given)} rids for {count} outputs", param="rid")
    return given or [uuid.uuid4().hex for _ in range(count)]


async def generate(request: Request) -> Response:
    """Handle one ``/generate`` request, streaming or not."""
    t0 = time.perf_counter()
    state = get_state(request)
    req = await parse_body(request, GenerateRequest)
    gen, sps, n = _generation(req, state)
    rids = {job.index: job.client_id for job in gen.jobs}
    names = TokenNames(state.tokenizer) if req.return_text_in_logprobs else None

    def item(index: int) -> dict[str, Any]:
        return _item(req, gen.choices[index], sps[index // n], rids[index], state, t0, names)

    if req.stream:
        return stream_response(request, state, gen, _stream(state, gen, item))
    await run_to_end(request, state, gen)
    items = [item(i) for i in sorted(gen.choices)]
    return JSONResponse(items if req.batched() or n > 1 else items[0])


async def _stream(state: ServerState, gen: Generation, item: Any) -> AsyncIterator[str]:
    """One event per engine delta: that output's whole text so far (SGLang's default), with ``index``."""
    async for choice, delta, shown in observed(state, gen):
        if shown.text or shown.token_ids or delta.finished:
            yield json.dumps({**item(choice.index), "index": choice.index})


class AbortRequest(BaseModel):
    """SGLang's ``POST /abort_request`` body."""

    model_config = ConfigDict(extra="ignore")

    rid: str = ""
    abort_all: StrictBool = False


async def abort_request(request: Request) -> Response:
    """Abort the running outputs the client knows as ``rid`` (a ``/generate`` output's ``rid`` /
    ``meta_info.id``, or an OpenAI response's ``id``: all its choices), or every one with ``abort_all``.
    They end with finish reason ``abort``, their pages freed. 200 whether or not any ran, as SGLang answers."""
    state = get_state(request)
    req = await parse_body(request, AbortRequest)
    for engine_id, client_id in list(state.live_requests.items()):
        if req.abort_all or (req.rid and client_id == req.rid):
            state.engine.abort(engine_id)
    return Response(status_code=200)
