"""OpenAI-compatible request and response bodies (pydantic v2).

Requests ignore unknown fields (clients such as lm-eval send extras) but reject wrong types and
out-of-range values with a 400. Fields marked "extension" follow vLLM / SGLang.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationInfo,
    field_validator,
    model_validator,
)

from nibblekv.model.tokenizer import ChatRender

# Upper bounds that keep a hostile body from allocating absurd work before the engine sees it.
MAX_N = 16
MAX_LOGPROBS = 20
MAX_STOP_SEQUENCES = 16
MAX_LOGIT_BIAS = 1024
MAX_BATCH_PROMPTS = 256
TokenId = Annotated[int, Field(ge=0, lt=2**31)]


class _Request(BaseModel):
    """Base for request bodies: unknown fields are ignored, strings are not coerced to numbers."""

    model_config = ConfigDict(extra="ignore", str_strip_whitespace=False)


# NOTE: vLLM's / SGLang's request fields this server cannot honour, and what each asks for: a 400 when set
# (to anything but null / false), since ignoring one would answer another question than the client asked
REFUSED_FIELDS = {
    **dict.fromkeys(
        (
            "guided_json",
            "guided_regex",
            "guided_choice",
            "guided_grammar",
            "structured_outputs",
            "json_schema",
            "regex",
            "ebnf",
        ),
        "structured output",
    ),
    "use_beam_search": "beam search",
    "lora_path": "loading LoRA adapters",
    "return_hidden_states": "returning hidden states",
}
TEMPLATE_REFUSED = {
    "chat_template": "a per-request chat template (vLLM refuses it by default too; start the server with "
    "--chat-template)",
}


def refuse(value: Any, info: ValidationInfo, reasons: dict[str, str]) -> Any:
    """A field validator's body: ``value`` if unset (None / False), else the ``reasons`` entry as an error."""
    if value is None or value is False:
        return value
    raise ValueError(f"{reasons[str(info.field_name)]} is not supported by this server")


class StreamOptions(_Request):
    """``stream_options``: ``include_usage`` adds a final chunk carrying ``usage``."""

    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False


class SamplingFields(_Request):
    """Sampling fields shared by completions and chat completions."""

    model: str | None = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    # allow_inf_nan=False: NaN would slip through ge/le comparisons.
    temperature: float | None = Field(default=None, ge=0.0, allow_inf_nan=False)
    top_p: float | None = Field(default=None, allow_inf_nan=False)
    top_k: int | None = Field(default=None, ge=-1, lt=2**31)  # extension; -1 or 0 = off
    min_p: float | None = Field(default=None, ge=0.0, le=1.0, allow_inf_nan=False)  # extension
    repetition_penalty: float | None = Field(default=None, gt=0.0, allow_inf_nan=False)  # extension
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0, allow_inf_nan=False)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0, allow_inf_nan=False)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = Field(default=None, max_length=MAX_STOP_SEQUENCES)  # extension
    ignore_eos: StrictBool = False  # extension
    min_tokens: int = Field(default=0, ge=0, lt=2**31)  # extension
    include_stop_str_in_output: StrictBool = False  # extension
    skip_special_tokens: StrictBool = True  # extension
    # NOTE: accepted as vLLM / SGLang do; HF's fast tokenizers (the ones served here) ignore it there too
    spaces_between_special_tokens: StrictBool = True  # extension
    truncate_prompt_tokens: int | None = Field(default=None, ge=1, lt=2**31)  # extension: keep the last N
    # OpenAI's: token id (a string key in JSON) -> bias in [-100, 100] (SamplingParams checks the range)
    logit_bias: dict[int, float] | None = Field(default=None, max_length=MAX_LOGIT_BIAS)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # NOTE: known fields this server cannot honour are a 400, not silently dropped (the output would not be
    # what the client asked for): structured output and tool calls
    response_format: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    structured_outputs: Any = None
    json_schema: Any = None
    regex: Any = None
    ebnf: Any = None
    use_beam_search: Any = None
    lora_path: Any = None
    return_hidden_states: Any = None

    @field_validator(*REFUSED_FIELDS)
    @classmethod
    def _refused(cls, value: Any, info: ValidationInfo) -> Any:
        return refuse(value, info, REFUSED_FIELDS)

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and value.get("type", "text") != "text":
            raise ValueError(f"response_format {value.get('type')!r} is not supported: only 'text'")
        return value

    @model_validator(mode="after")
    def _no_tool_calls(self) -> SamplingFields:
        if self.tools and self.tool_choice != "none":
            raise ValueError("tool calls are not supported: send tools with tool_choice 'none', or no tools")
        return self

    @field_validator("top_p")
    @classmethod
    def _top_p_range(cls, value: float | None) -> float | None:
        if value is not None and not 0.0 < value <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        return value

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences")
        return value

    def stop_list(self) -> list[str]:
        """``stop`` as a list with empty strings dropped."""
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stops if s]

    def include_usage(self) -> bool:
        """Whether a streaming response ends with a usage chunk."""
        return bool(self.stream_options and self.stream_options.include_usage)


PromptInput = str | list[str] | list[TokenId] | list[list[TokenId]]


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``."""

    prompt: PromptInput
    max_tokens: int | None = Field(default=16, ge=0, lt=2**31)
    echo: StrictBool = False
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    add_special_tokens: StrictBool = True  # extension: BOS etc. before a text prompt
    suffix: str | None = None
    best_of: int | None = Field(default=None, ge=1, le=MAX_N)

    @model_validator(mode="after")
    def _best_of_is_n(self) -> CompletionRequest:
        # NOTE: best_of > n would rank extra samples by logprob and drop them; not done, so refused
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError(f"best_of ({self.best_of}) other than n ({self.n}) is not supported")
        return self

    @field_validator("prompt")
    @classmethod
    def _prompt_shape(cls, value: PromptInput) -> PromptInput:
        if isinstance(value, list):
            if not value:
                raise ValueError("prompt must not be empty")
            if len(value) > MAX_BATCH_PROMPTS and not isinstance(value[0], int):
                raise ValueError(f"at most {MAX_BATCH_PROMPTS} prompts per request")
        return value


class TextPart(_Request):
    """One text part of a multi-part message ``content``."""

    type: Literal["text"]
    text: str


class ChatMessage(_Request):
    """One chat message; ``content`` may be a string or a list of text parts."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, value: Any) -> Any:
        # NOTE: before pydantic's union check, whose error would name the str branch, not the part
        for part in value if isinstance(value, list) else []:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in (None, "text"):
                raise ValueError(
                    f"content parts of type {kind!r} are not supported: the served model is text-only"
                )
        return value

    def text(self) -> str:
        """The message content as one string."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatTemplateFields(_Request):
    """How the chat template renders ``messages`` (vLLM's extensions; the chat and tokenize routes)."""

    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False  # the last message left open for the model to continue
    chat_template_kwargs: dict[str, Any] | None = None  # more template variables, e.g. enable_thinking
    chat_template: Any = None

    @field_validator("chat_template")
    @classmethod
    def _refused_template(cls, value: Any, info: ValidationInfo) -> Any:
        return refuse(value, info, TEMPLATE_REFUSED)

    @model_validator(mode="after")
    def _one_open_turn(self) -> ChatTemplateFields:
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt cannot both be true")
        return self

    def render(self) -> ChatRender:
        """These fields as the tokenizer's typed rendering options."""
        return ChatRender(
            self.add_generation_prompt, self.continue_final_message, self.chat_template_kwargs or {}
        )


class ChatCompletionRequest(SamplingFields, ChatTemplateFields):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1, max_length=4096)
    max_tokens: int | None = Field(default=None, ge=0, lt=2**31)
    max_completion_tokens: int | None = Field(default=None, ge=0, lt=2**31)
    logprobs: StrictBool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    add_special_tokens: StrictBool = False  # extension: BOS etc. on top of the template's own

    def max_new_tokens(self) -> int | None:
        """``max_completion_tokens`` (newer name) wins over ``max_tokens``."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


# ---------------------------------------------------------------- responses


def make_id(prefix: str) -> str:
    """A fresh response id such as ``cmpl-3f2a...``."""
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    """Unix time in seconds, for ``created``."""
    return int(time.time())


class PromptTokensDetails(BaseModel):
    """How many prompt tokens came from the prefix cache."""

    cached_tokens: int = 0


class UsageInfo(BaseModel):
    """Token accounting of one response."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)

    def add(self, prompt: int, completion: int, cached: int) -> None:
        """Accumulate one generation's counts."""
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        self.total_tokens += prompt + completion
        self.prompt_tokens_details.cached_tokens += cached


class CompletionLogprobs(BaseModel):
    """Legacy completions logprobs: parallel lists, one entry per token."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


LogprobsT = TypeVar("LogprobsT", bound=BaseModel)


class _Choice(BaseModel, Generic[LogprobsT]):
    """The fields every response choice has; a subclass adds its content (after them)."""

    index: int
    logprobs: LogprobsT | None = None
    finish_reason: str | None = None


ChoiceT = TypeVar("ChoiceT", bound=_Choice[Any])


class _Response(BaseModel, Generic[ChoiceT]):
    """The fields of every completion body and stream chunk; a subclass fixes ``object`` (its value and
    place stay those of this declaration)."""

    id: str
    object: str
    created: int = Field(default_factory=now)
    model: str
    choices: list[ChoiceT]
    usage: UsageInfo | None = None


class CompletionChoice(_Choice[CompletionLogprobs]):
    """One choice of a completion (or one delta of a streamed one)."""

    text: str


class CompletionResponse(_Response[CompletionChoice]):
    """Body of ``/v1/completions`` (``object`` is the same for stream chunks, as in OpenAI)."""

    object: Literal["text_completion"] = "text_completion"


class TopLogprob(BaseModel):
    """One alternative token in chat logprobs."""

    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    """One sampled token in chat logprobs with its alternatives."""

    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    """Chat ``logprobs``: one entry per generated token."""

    content: list[TokenLogprob] = Field(default_factory=list)


class ChatResponseMessage(BaseModel):
    """The assistant message of a chat choice (``delta`` in a stream chunk)."""

    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChoice(_Choice[ChatLogprobs]):
    """One choice of a chat completion."""

    message: ChatResponseMessage


class ChatStreamChoice(_Choice[ChatLogprobs]):
    """One choice of a streamed chat chunk."""

    delta: ChatResponseMessage


class ChatCompletionResponse(_Response[ChatChoice]):
    """Body of ``/v1/chat/completions``."""

    object: Literal["chat.completion"] = "chat.completion"


class ChatCompletionChunk(_Response[ChatStreamChoice]):
    """One SSE chunk of a streamed chat completion."""

    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"


class ModelCard(BaseModel):
    """One entry of ``/v1/models``."""

    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=now)
    owned_by: str = "nibblekv"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    """Body of ``/v1/models``."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    """The ``error`` object of an OpenAI-style error body."""

    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(BaseModel):
    """OpenAI-style error body: ``{"error": {"message", "type", "param", "code"}}``."""

    error: ErrorInfo


def dump(model: BaseModel) -> dict[str, Any]:
    """A response model as a JSON-ready dict."""
    return model.model_dump(mode="json")
