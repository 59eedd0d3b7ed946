"""Detokenize each request's new tokens, find stop strings, and build :class:`RequestOutput` objects."""

from __future__ import annotations

from dataclasses import dataclass

from nibblekv.engine.request import Request, RequestOutput
from nibblekv.model import DetokenizeState, Tokenizer


@dataclass
class _TextState:
    detok: DetokenizeState
    text: str = ""  # completion text so far (stop string cut off once found)
    emitted: int = 0  # characters of ``text`` already streamed
    num_detokenized: int = 0  # output tokens pushed into ``detok``
    stopped: bool = False


class OutputProcessor:
    """Per-request incremental text; a stop string found in it ends the request."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._states: dict[str, _TextState] = {}

    def _state(self, req: Request) -> _TextState:
        st = self._states.get(req.request_id)
        if st is None:
            prompt = req.token_ids[: req.num_prompt_tokens]
            st = _TextState(DetokenizeState(self.tokenizer, prompt, req.params.skip_special_tokens))
            self._states[req.request_id] = st
        return st

    def update(self, req: Request) -> bool:
        """Detokenize the request's new tokens; True when a stop string was found (caller finishes it)."""
        st = self._state(req)
        new = req.output_token_ids[st.num_detokenized :]
        st.num_detokenized += len(new)
        if st.stopped:
            return False
        piece = st.detok.push(new) if new else ""
        if req.finished:
            piece += st.detok.finish()
        if not piece:
            return False
        search_from = max(0, len(st.text) - max((len(s) for s in req.params.stop), default=0))
        st.text += piece
        if req.num_output_tokens < req.params.min_new_tokens:
            return False  # NOTE: as vLLM, no stop string ends a request before min_new_tokens
        for stop in req.params.stop:
            idx = st.text.find(stop, search_from)
            if idx >= 0:
                st.text = st.text[: idx + (len(stop) if req.params.include_stop_str_in_output else 0)]
                st.stopped = True
        return st.stopped

    def output(self, req: Request) -> RequestOutput:
        """The request's output now; ``text_delta`` is what was not streamed before."""
        st = self._state(req)
        # NOTE: while running, hold back a tail that could be the start of a stop string.
        hold = 0 if req.finished else max((len(s) - 1 for s in req.params.stop), default=0)
        visible = len(st.text) - hold
        delta = st.text[st.emitted : max(visible, st.emitted)]
        st.emitted = max(visible, st.emitted)
        if req.finished:
            self._states.pop(req.request_id, None)
        return RequestOutput(
            request_id=req.request_id,
            text=st.text,
            token_ids=list(req.output_token_ids),
            finished=req.finished,
            finish_reason=req.finish_reason,
            prompt_tokens=req.num_prompt_tokens,
            completion_tokens=req.num_output_tokens,
            cached_tokens=req.cached_tokens,
            text_delta=delta,
            logprobs=list(req.output_logprobs) if req.params.logprobs is not None else None,
            prompt_logprobs=list(req.prompt_logprobs) if req.params.prompt_logprobs is not None else None,
            prompt_token_ids=req.token_ids[: req.num_prompt_tokens] if req.finished else [],
        )
