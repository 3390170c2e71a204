"""`ServeConfig`: the limits that keep `tokenflow serve` answering under abuse (docs/serve.md,
"Limits"). ``tokenflow serve ... --serve.KEY VALUE`` sets any of them.

What each bounds, in the order a request meets them: the connections open, the time its head and
its body take to arrive, its body (bytes, before it is parsed) and the body bytes held over all
requests, the requests in flight (once the body is read), its JSON's depth, its prompts
(characters, before they are tokenized; prompts x n), the time its chat template takes to
render, the tokens in flight (prompt tokens + max_tokens x n, once the prompt is tokenized), and,
for training sessions, their number, calls and idle time. A refusal is an error in OpenAI's
shape: 503 past the connection cap, 408 for a slow head or body, 413 for a body, 429 with
``Retry-After`` for admission, 400 for the rest.
"""

from __future__ import annotations

from pydantic import Field

from tokenflow.config.base import ConfigModel

MIB = 1 << 20


class ServeConfig(ConfigModel):
    """Limits of `tokenflow serve` and of training sessions' servers."""

    max_body_bytes: int | None = Field(default=None, ge=1)
    """Largest request body, in bytes: a larger one is a 413, answered from its
    ``Content-Length`` before any of it is read, or as soon as a chunked body passes the limit.
    None: 8 bytes for each character of the prompt bound (JSON's ``\\uXXXX`` escapes take 6),
    at least 1 MiB."""

    prompt_chars_per_token: float = Field(default=16.0, ge=1)
    """The prompt bound, checked before a prompt is tokenized: a prompt of more than
    ``max_model_len x prompt_chars_per_token`` characters (a chat call: its messages' text,
    tool calls and tools together) cannot fit the context and is a 400 without being tokenized.
    16 characters a token is generous: English text averages about 4."""

    max_choices: int = Field(default=256, ge=1)
    """Most completions one request may ask for, prompts x ``n`` (a 400 beyond)."""

    max_body_bytes_in_flight: int | None = Field(default=None, ge=0)
    """Most body bytes held at once over all requests in flight (a declared ``Content-Length``
    is reserved before reading, a chunked body as it arrives); past it a request is a 429 with
    ``Retry-After``. It bounds the memory bodies take (docs/serve.md, "Memory"). None: 16 x
    the body limit. 0: no limit."""

    max_requests: int = Field(default=256, ge=0)
    """Most requests in flight at once, from their body read to their last byte (streams
    included); past it a request is a 429 with ``Retry-After``. The slot is taken once the body
    is read, so a slow body never holds one. 0: no limit."""

    max_tokens_in_flight: int | None = Field(default=None, ge=0)
    """Most tokens admitted at once, counting each request as its prompt tokens + max_tokens x n
    (max_tokens as capped by the context); past it a request is a 429 with ``Retry-After``, and
    a request that alone needs more is a 400. None: 4 x the engine's ``max_num_seqs`` x
    ``max_model_len`` (every KV-cache slot full, and three times as much waiting in the
    engine's queue). 0: no limit."""

    header_timeout_s: float = Field(default=10.0, gt=0)
    """A connection that has not sent a whole request head this long after it opened (or, kept
    alive, after the first byte of its next request) gets a 408 and is closed."""

    body_timeout_s: float = Field(default=30.0, gt=0)
    """A request whose body has not fully arrived this long after its head gets a 408 (the
    connection closes after it). Request slots are taken only once the body is read, so a slow
    body never holds one."""

    max_connections: int = Field(default=4096, ge=0)
    """Most connections open at once; a request on one past it gets a 503 and its connection
    closes. `tokenflow serve` raises its soft open-file limit to this + 256 (within the hard
    limit). 0: no cap."""

    max_json_depth: int = Field(default=64, ge=2)
    """Deepest nesting of arrays and objects a JSON body may have: deeper is a 400, found by a
    scan of the bytes before the body is parsed."""

    render_timeout_s: float = Field(default=10.0, gt=0)
    """Longest a chat template may take to render one request (or a prompt to tokenize): past
    it the request is a 400 (``chat_template_timeout``) and the rendering thread is stopped and
    replaced, so a template that loops fails its request, not the server."""

    retry_after_s: int = Field(default=1, ge=1)
    """The ``Retry-After`` of a 429, in seconds."""

    shutdown_timeout_s: float = Field(default=10.0, gt=0)
    """How long a stop (SIGINT, SIGTERM) may take. New requests get a 503 at once; requests in
    flight may finish until 80% of it has passed, then get a 503 (a stream: an error event) and
    their engine work is aborted; the engine thread stops in the rest."""

    max_sessions: int = Field(default=16384, ge=1)
    """Training sessions: most open at once (opening one more raises `SessionLimitError`,
    after expired sessions are closed)."""

    max_calls_per_session: int = Field(default=256, ge=1)
    """Training sessions: most calls one session may make (a 400 beyond)."""

    session_idle_s: float = Field(default=3600.0, gt=0)
    """Training sessions: a session with no call running and none started for this long is
    closed (its later calls get a 404). Keep it above ``episode.agent_timeout_s``."""

    allow_dropped_tools: bool = False
    """A chat request with ``tools``, or with an assistant's ``tool_calls`` in its history, whose
    chat template renders neither (SmolLM2's own ignores both; found by rendering with and
    without them) is a 400 naming the template. True: serve it anyway, without them, and log it
    once. Training sessions allow it (the run logs it)."""

    def prompt_chars(self, max_model_len: int) -> int:
        """The prompt bound, in characters."""
        return int(max_model_len * self.prompt_chars_per_token)

    def body_bytes(self, max_model_len: int) -> int:
        """The body limit, in bytes."""
        if self.max_body_bytes is not None:
            return self.max_body_bytes
        return max(MIB, 8 * self.prompt_chars(max_model_len))

    def body_bytes_in_flight(self, max_model_len: int) -> int:
        """The body-bytes budget (0: none)."""
        if self.max_body_bytes_in_flight is not None:
            return self.max_body_bytes_in_flight
        return 16 * self.body_bytes(max_model_len)

    def tokens_in_flight(self, max_num_seqs: int, max_model_len: int) -> int:
        """The token budget (0: none)."""
        if self.max_tokens_in_flight is not None:
            return self.max_tokens_in_flight
        return 4 * max_num_seqs * max_model_len


SESSION_DEFAULTS = ServeConfig(max_requests=0, max_tokens_in_flight=0, shutdown_timeout_s=5.0,
                               allow_dropped_tools=True)
"""Training sessions' limits: no admission limit (the run bounds its agents, which share the
engine with training), a 5 s stop (the runtime waits that long for its server), a template that
drops tools logged rather than refused, the other limits as served."""
