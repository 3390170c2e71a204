"""The OpenAI API's request and response bodies, as pydantic models (what `tokenflow serve`
accepts and returns, and what its OpenAPI document publishes).

Requests accept OpenAI's fields; unknown fields are ignored (as vLLM does), so agent code that
sends a vendor's extras still runs. Fields OpenAI defines that this server cannot honour are
accepted only at their neutral value and refused otherwise (`tokenflow.serve.generation`), never
silently dropped. Extensions: ``return_token_ids``, ``tool_format``, ``top_k`` and
``ignore_eos``.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer

MAX_TOP_LOGPROBS = 20
"""Most alternatives per token (OpenAI's limit for chat; vLLM's default for both endpoints)."""

StopString = Annotated[str, Field(min_length=1)]
TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]


class _Request(BaseModel):
    # Strict: JSON types as the document declares them (OpenAI refuses "temperature": true too).
    model_config = ConfigDict(extra="ignore", strict=True)


class _Response(BaseModel):
    """A response body; keys in ``_omit_if_none`` (extensions) are left out when not set."""

    _omit_if_none: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _drop_unset_extensions(self, handler):
        data = handler(self)
        for key in self._omit_if_none:
            if data.get(key) is None:
                data.pop(key, None)
        return data


# ---- shared request parts ------------------------------------------------------------------------

class StreamOptions(_Request):
    include_usage: bool = False
    """Send one more chunk before ``[DONE]`` with the request's token usage (and no choices)."""


class _Sampling(_Request):
    """The fields both endpoints share."""

    model: str | None = None
    """The served model's name (`/v1/models`); another name is a 404. Omitted: the served one."""
    n: int = Field(default=1, ge=1, le=128)
    """Samples of each prompt (they share one prefill; at most the engine's ``max_num_seqs``)."""
    temperature: float | None = Field(default=None, ge=0, le=2)
    """Sampling temperature (default 1); 0 is greedy."""
    top_p: float | None = Field(default=None, gt=0, le=1)
    """Nucleus sampling (default 1: off)."""
    top_k: int | None = Field(default=None, ge=0)
    """Extension: keep the k most likely tokens (0 or omitted: off)."""
    stop: StopString | list[StopString] | None = None
    """Strings that end a completion; the text returned stops before the first one."""
    seed: int | None = None
    """Makes sampling reproducible: the same request with the same seed gives the same tokens."""
    stream: bool = False
    """Return server-sent events as tokens come, ending with ``data: [DONE]``."""
    stream_options: StreamOptions | None = None
    return_token_ids: bool = False
    """Extension: return the prompt's token ids and each choice's completion ids (``token_ids``,
    the stop or turn-end token included), exactly as the engine used and sampled them."""
    ignore_eos: bool = False
    """Extension: keep generating past the model's end-of-sequence token (benchmarks)."""
    # Fields the server cannot honour: the document publishes the one value accepted; another
    # gets a 400 that says so.
    presence_penalty: float | None = Field(default=None, json_schema_extra={"enum": [0, None]})
    """Not supported: accepted only as 0."""
    frequency_penalty: float | None = Field(default=None, json_schema_extra={"enum": [0, None]})
    """Not supported: accepted only as 0."""
    logit_bias: dict[str, float] | None = Field(default=None, json_schema_extra={"maxProperties": 0})
    """Not supported: accepted only empty."""
    user: str | None = None
    """Accepted and ignored."""


# ---- chat requests -------------------------------------------------------------------------------

class TextPart(_Request):
    type: Literal["text"]
    text: str


class FunctionCall(_Request):
    name: str
    arguments: str
    """The arguments as a JSON object, encoded as a string (as OpenAI sends them)."""


class ToolCall(_Request):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    """Text, or a list of text parts (joined with newlines)."""
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    """Assistant messages: the calls it made."""
    tool_call_id: str | None = None
    """Tool messages: the call this answers."""


class FunctionDefinition(_Request):
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    """A JSON schema object; the chat template renders it."""
    strict: bool | None = None


class Tool(_Request):
    type: Literal["function"]
    function: FunctionDefinition


class ResponseFormat(_Request):
    type: Literal["text"]


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    """The conversation, rendered with the model's chat template."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Most completion tokens (capped at what the context leaves; default: all of it)."""
    max_completion_tokens: int | None = Field(default=None, ge=1)
    """Same as ``max_tokens`` (OpenAI's newer name); the smaller wins when both are set."""
    logprobs: bool = False
    """Return the log-prob of each completion token."""
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    """With ``logprobs``: also the most likely alternatives at each token."""
    tools: list[Tool] | None = None
    """Functions the model may call; the chat template renders them."""
    tool_choice: Literal["auto", "none"] | None = None
    """"auto" (the default with tools): calls in the model's text are returned as ``tool_calls``;
    "none": the text is returned as it is."""
    tool_format: Literal["hermes", "plain"] = "hermes"
    """Extension: how the model writes calls: "hermes" (``<tool_call>{json}</tool_call>``) or
    "plain" (``name(arg,...)`` alone on a line; see docs/environments.md)."""
    parallel_tool_calls: bool | None = None
    """Accepted and ignored: every call in the text is returned."""
    response_format: ResponseFormat | None = None
    """Only ``{"type": "text"}`` is supported."""


# ---- completions requests ------------------------------------------------------------------------

class CompletionRequest(_Sampling):
    prompt: Annotated[str, Field(min_length=1)] | Annotated[list[str], Field(min_length=1)] | TokenIds | Annotated[list[TokenIds], Field(min_length=1)]
    """A text, several texts, token ids, or several lists of token ids (one request each)."""
    max_tokens: int | None = Field(default=16, ge=0)
    """Most completion tokens (OpenAI's default, 16; capped at what the context leaves); 0
    generates nothing (with ``echo``: the prompt is only scored). Not with ``stream``."""
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    """Return each token's log-prob and this many most likely alternatives."""
    echo: bool = False
    """Return the prompt before the completion: ``text`` is prompt + completion and, with
    ``logprobs``, the lists cover the prompt's tokens first (the first one's log-prob and
    alternatives null). Not with ``stream``."""
    best_of: int | None = Field(default=None, ge=1)
    """Not supported beyond ``best_of == n``."""
    suffix: str | None = Field(default=None, json_schema_extra={"enum": ["", None]})
    """Not supported: accepted only empty."""


# ---- responses -----------------------------------------------------------------------------------

class Usage(_Response):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class TopLogprob(_Response):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(_Response):
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(_Response):
    content: list[TokenLogprob] | None = None
    refusal: list[TokenLogprob] | None = None


class ToolCallOut(_Response):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(_Response):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[ToolCallOut] | None = None

    _omit_if_none = ("tool_calls",)


ChatFinishReason = Literal["stop", "length", "tool_calls"]


class ChatChoice(_Response):
    index: int
    message: AssistantMessage
    finish_reason: ChatFinishReason
    logprobs: ChoiceLogprobs | None = None
    token_ids: list[int] | None = None
    """Extension (``return_token_ids``): the completion's token ids."""

    _omit_if_none = ("token_ids",)


class ChatCompletion(_Response):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None
    prompt_token_ids: list[int] | None = None
    """Extension (``return_token_ids``): the prompt's token ids, as rendered by the template."""

    _omit_if_none = ("prompt_token_ids",)


class FunctionCallDelta(_Response):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(_Response):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta | None = None


class ChatDelta(_Response):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None

    _omit_if_none = ("role", "content", "tool_calls")


class ChatChunkChoice(_Response):
    index: int
    delta: ChatDelta
    finish_reason: ChatFinishReason | None = None
    logprobs: ChoiceLogprobs | None = None
    token_ids: list[int] | None = None

    _omit_if_none = ("token_ids",)


class ChatCompletionChunk(_Response):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
    prompt_token_ids: list[int] | None = None

    _omit_if_none = ("prompt_token_ids",)


class CompletionLogprobs(_Response):
    tokens: list[str]
    token_logprobs: list[float | None]
    """Null only for the first prompt token (``echo``): it has no context."""
    top_logprobs: list[dict[str, float] | None] | None = None
    text_offset: list[int]


CompletionFinishReason = Literal["stop", "length"]


class CompletionChoice(_Response):
    index: int
    text: str
    finish_reason: CompletionFinishReason | None = None
    logprobs: CompletionLogprobs | None = None
    prompt_token_ids: list[int] | None = None
    """Extension (``return_token_ids``): this choice's prompt ids."""
    token_ids: list[int] | None = None
    """Extension (``return_token_ids``): the completion's token ids."""

    _omit_if_none = ("prompt_token_ids", "token_ids")


class Completion(_Response):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class ModelCard(_Response):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "tokenflow"
    max_model_len: int
    """Extension: the context, in tokens (prompt + completion)."""


class ModelList(_Response):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(_Response):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(_Response):
    error: ErrorBody
