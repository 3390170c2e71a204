"""The served model's tokenizer over HTTP, in vLLM's shapes: ``GET /tokenizer_info``,
``POST /tokenize`` (a text, or chat messages through the chat template) and ``POST /detokenize``.

They sit beside ``/v1`` (at the root, or ``/sessions/{session_id}`` when `openai_router` is
mounted there), where vLLM has them and where lm-evaluation-harness's remote tokenizer
(``tokenizer_backend=remote``) looks: an evaluation then needs no copy of the tokenizer. Work on
the tokenizer runs in the service's tokenizer thread, within ``serve.render_timeout_s``; token
ids outside the model's vocabulary are a 400 naming the field.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from tokenflow.serve.chat import template_messages
from tokenflow.serve.errors import bad_request
from tokenflow.serve.limits import limited_route
from tokenflow.serve.protocol import ChatMessage, ErrorResponse, Tool

_ERRORS = (400, 401, 404, 408, 413, 429, 500, 503)
"""What these routes may answer besides 200 (as the OpenAI routes: see `tokenflow.serve.app`)."""


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class TokenizeCompletionRequest(_Request):
    model: str | None = None
    prompt: str
    """The text to tokenize."""
    add_special_tokens: bool = True
    """Add the tokenizer's special tokens (a BOS, ...) as a completions prompt gets them."""
    return_token_strs: bool = False
    """Also return each token's string (``token_strs``)."""


class TokenizeChatRequest(_Request):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    """A conversation, rendered with the model's chat template."""
    add_generation_prompt: bool = True
    """End with the assistant's turn opening (the ids `/v1/chat/completions` generates from)."""
    continue_final_message: bool = False
    """Leave the last message open, to be continued (no generation prompt then)."""
    add_special_tokens: bool = False
    """Add the tokenizer's special tokens on top of the template's."""
    tools: list[Tool] | None = None
    return_token_strs: bool = False


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(_Request):
    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0)]]
    """Token ids of the model's vocabulary."""


class DetokenizeResponse(BaseModel):
    prompt: str


class TokenizerInfoResponse(BaseModel):
    """The tokenizer's configuration (its ``tokenizer_config.json`` settings, special tokens
    as strings, file paths left out), its class and its chat template."""

    model_config = ConfigDict(extra="allow")
    tokenizer_class: str


def _responses(model) -> dict:
    return {200: {"model": model, "description": "The result"},
            **{code: {"model": ErrorResponse, "description": "An error, in OpenAI's shape"} for code in _ERRORS}}


def _plain(value):
    """``value`` as JSON: special tokens (`AddedToken`) as their text, other objects as strings."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    content = getattr(value, "content", None)
    return content if isinstance(content, str) else str(value)


def tokenizer_info(tokenizer) -> dict[str, Any]:
    """What ``/tokenizer_info`` returns for ``tokenizer`` (vLLM's shape)."""
    config = {k: v for k, v in dict(getattr(tokenizer, "init_kwargs", None) or {}).items()
              if not k.endswith(("_file", "name_or_path")) and k not in ("added_tokens_decoder", "chat_template")}
    info = _plain(config)
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        value = getattr(tokenizer, name, None)
        info[name] = value if isinstance(value, str) else info.get(name)
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str):
        info["chat_template"] = template
    info["tokenizer_class"] = type(tokenizer).__name__
    return info


class TokenizerRoutes:
    """The routes' behaviour on an `OpenAIService` (its tokenizer, chat format and thread)."""

    def __init__(self, service) -> None:
        self.service = service
        self.vocab_size = service.driver.engine.vocab_size
        self._info: dict | None = None

    def _tokenizer(self, param: str):
        tokenizer = self.service.tokenizer
        if tokenizer is None:
            raise bad_request("this model has no tokenizer in its folder", param, "tokenizer_missing")
        return tokenizer

    def _check_model(self, name: str | None) -> None:
        if name is not None:
            self.service.model(name)  # a 404 for another name

    def info(self) -> dict:
        if self._info is None:
            self._info = tokenizer_info(self._tokenizer(None))
        return self._info

    async def tokenize(self, body: TokenizeCompletionRequest | TokenizeChatRequest) -> TokenizeResponse:
        self._check_model(body.model)
        chat = isinstance(body, TokenizeChatRequest)
        tokenizer = self._tokenizer("messages" if chat else "prompt")
        ids = await self.service.tokenizing.run(self._chat_ids if chat else self._text_ids, tokenizer, body)
        strs = tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
        return TokenizeResponse(count=len(ids), max_model_len=self.service.max_model_len, tokens=ids,
                                token_strs=strs)

    @staticmethod
    def _text_ids(tokenizer, body: TokenizeCompletionRequest) -> list[int]:
        try:
            return list(tokenizer(body.prompt, add_special_tokens=body.add_special_tokens)["input_ids"])
        except Exception as e:  # noqa: BLE001 - tokenizers raise plain Exceptions
            raise bad_request(f"the prompt cannot be encoded by this model's tokenizer ({e})", "prompt") from None

    def _chat_ids(self, tokenizer, body: TokenizeChatRequest) -> list[int]:
        chat_format = self.service.chat_format
        if body.add_generation_prompt and not body.continue_final_message and not body.add_special_tokens:
            return list(chat_format.prompt_ids(body.messages, body.tools))  # exactly what a chat call reads
        if chat_format.bridge is None:
            raise bad_request(chat_format.unavailable, "messages", "chat_template_missing")
        schemas = [t.model_dump(mode="json", exclude_none=True) for t in body.tools] if body.tools else None
        try:
            text = tokenizer.apply_chat_template(
                template_messages(body.messages), tools=schemas, tokenize=False,
                add_generation_prompt=body.add_generation_prompt and not body.continue_final_message,
                continue_final_message=body.continue_final_message)
            return list(tokenizer(text, add_special_tokens=body.add_special_tokens)["input_ids"])
        except Exception as e:  # noqa: BLE001 - Jinja and tokenizers raise many types
            raise bad_request(f"the chat template cannot render these messages ({type(e).__name__}: {e})",
                              "messages") from None

    async def detokenize(self, body: DetokenizeRequest) -> DetokenizeResponse:
        self._check_model(body.model)
        tokenizer = self._tokenizer("tokens")
        # The model's vocabulary may be padded past the tokenizer's: ids there decode to nothing.
        size = min(self.vocab_size, len(tokenizer))
        bad = [(i, t) for i, t in enumerate(body.tokens) if t >= size]
        if bad:
            i, t = bad[0]
            raise bad_request(f"tokens[{i}] = {t} is not a token id of this model's tokenizer (it has {size} ids: "
                              f"0 to {size - 1})", "tokens", "invalid_value")
        text = await self.service.tokenizing.run(tokenizer.decode, body.tokens)
        return DetokenizeResponse(prompt=text)


def tokenizer_router(service, *, prefix: str = "/v1", tags: list[str] | None = None) -> APIRouter:
    """The tokenizer routes beside an `openai_router` mounted at ``prefix`` (``/v1`` → the root,
    ``/sessions/{session_id}/v1`` → ``/sessions/{session_id}``)."""
    root = prefix.removesuffix("/v1")
    routes = TokenizerRoutes(service)
    router = APIRouter(prefix=root, tags=tags or ["tokenizer"], route_class=limited_route(service))

    @router.get("/tokenizer_info", response_model=TokenizerInfoResponse, responses=_responses(TokenizerInfoResponse),
                summary="The served model's tokenizer configuration (vLLM's /tokenizer_info)")
    async def get_tokenizer_info():
        return routes.info()

    @router.post("/tokenize", response_model=TokenizeResponse, responses=_responses(TokenizeResponse),
                 summary="Token ids of a text or of chat messages (vLLM's /tokenize)")
    async def tokenize(body: TokenizeCompletionRequest | TokenizeChatRequest):
        return await routes.tokenize(body)

    @router.post("/detokenize", response_model=DetokenizeResponse, responses=_responses(DetokenizeResponse),
                 summary="The text of token ids (vLLM's /detokenize)")
    async def detokenize(body: DetokenizeRequest):
        return await routes.detokenize(body)

    return router
