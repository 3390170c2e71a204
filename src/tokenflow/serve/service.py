"""`OpenAIService`: chat and text completions on an `EngineDriver`, whole or streamed.

A request becomes one engine request per prompt (its ``n`` samples share the prefill). A
non-streamed call waits for every sample's `Rollout`; a streamed one sends each sample's tokens
as the engine hands them out and completes them from the rollout. Either way the ids, behaviour
log-probs and versions of the call reach ``on_call`` (a `CallHook`) as rollouts, which is how a
training runtime can record agent traffic served here.

Prompts are tokenized (and chat templates rendered) in a thread of their own, never on the event
loop, within ``serve.render_timeout_s`` (`TokenizerThread`: a template that loops fails its
request, and the thread is replaced); a call's tokens (prompt + max_tokens x n) are admitted against the token budget before
they reach the engine (`tokenflow.serve.limits`), and whatever ends a call (its answer, its
client going away, a stop) aborts what it still runs in the engine and frees its tokens.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from tokenflow.config.serve import ServeConfig
from tokenflow.engine.base import TokenDelta
from tokenflow.engine.errors import InvalidRequest
from tokenflow.engine.sampling_params import SamplingParams
from tokenflow.rollout import Rollout
from tokenflow.serve.calls import (  # noqa: F401 - CallHook, ServedCall: re-exported, as before
    Call, CallHook, ServedCall, disconnected, new_id, notify, refuse_unsupported, sse_event, sse_stream,
)
from tokenflow.serve.chat import ChatFormat, parse_output
from tokenflow.serve.driver import DriverClosed, EngineDriver, EngineFailed
from tokenflow.serve.errors import APIError, bad_request, internal_error, unavailable
from tokenflow.serve.limits import Admission, EventStream, PromptBound, Turns
from tokenflow.serve.output import (
    ChoiceOutput, TextAssembler, TokenStrings, chat_logprobs, completion_choice, completion_logprobs,
)
from tokenflow.serve.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChoiceLogprobs,
    Completion,
    CompletionChoice,
    CompletionRequest,
    FunctionCallDelta,
    ModelCard,
    ModelList,
    ToolCallDelta,
)
from tokenflow.serve.tokenizing import TokenizerThread

logger = logging.getLogger(__name__)


class OpenAIService:
    """The endpoints' behaviour, independent of routing (`tokenflow.serve.app` mounts it)."""

    def __init__(self, driver: EngineDriver, model_name: str, config: ServeConfig | None = None) -> None:
        engine = driver.engine
        self.driver = driver
        self.model_name = model_name
        self.config = config = config or ServeConfig()
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.max_model_len
        max_num_seqs = getattr(getattr(engine, "config", None), "max_num_seqs", 256)
        self.admission = Admission(config, max_num_seqs, self.max_model_len)
        self.prompt_bound = PromptBound(config, self.max_model_len)
        self.max_body_bytes = config.body_bytes(self.max_model_len)
        self.chat_format = ChatFormat(self.tokenizer, model_name, config.allow_dropped_tools)
        self.strings = TokenStrings(self.tokenizer)
        self.created = int(time.time())
        self.closing = False
        """Set when the server starts shutting down: new calls get a 503."""
        self.turns = Turns()
        """The event loop, in turns (`Turns`): a burst of work is spread over loop iterations."""
        self.tokenizing = TokenizerThread(config.render_timeout_s)
        """The one thread that tokenizes prompts and renders chat templates (one tokenizer is not
        called from two threads at once), each job within ``serve.render_timeout_s``."""

    def close(self) -> None:
        """Let the tokenizer thread go (the server has stopped)."""
        self.tokenizing.close()

    def drain(self, reason: str = "the server is shutting down") -> None:
        """A stop's time is nearly up: every call still running gets a 503 (a stream: an error
        event) and its engine work is aborted."""
        self.closing = True
        self.driver.abort_all(reason)

    async def _off_loop(self, fn, *args):
        """``fn(*args)`` in the tokenizer thread: the event loop keeps answering meanwhile."""
        return await self.tokenizing.run(fn, *args)

    # -- models -------------------------------------------------------------------------------

    def models(self) -> ModelList:
        return ModelList(data=[self._card()])

    def model(self, name: str) -> ModelCard:
        self._check_model(name)
        return self._card()

    def _card(self) -> ModelCard:
        return ModelCard(id=self.model_name, created=self.created, max_model_len=self.max_model_len)

    def _check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name:
            raise APIError(404, f"The model `{name}` does not exist; this server serves `{self.model_name}`.",
                           param="model", code="model_not_found")

    def _check_open(self) -> None:
        if self.closing or self.driver.failure is not None:
            raise unavailable("the server is shutting down" if self.driver.failure is None
                              else "the engine failed; restart the server")

    # -- chat ---------------------------------------------------------------------------------

    async def chat(self, body: ChatCompletionRequest, request: Request, on_call: CallHook | None = None):
        self._check_open()
        self._check_model(body.model)
        refuse_unsupported(body)
        if body.top_logprobs and not body.logprobs:
            raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
        prompt = await self._off_loop(self.chat_prompt, body, request)
        self._check_context([prompt], "messages")
        limit = min(x for x in (body.max_tokens, body.max_completion_tokens, 1 << 62) if x is not None)
        top_n = (body.top_logprobs or 0) if body.logprobs else 0
        params = [self.sampling(body, request, self._params(body, prompt, limit, self.chat_format.turn_end_ids, top_n))]
        call = await self._start([prompt], params, body.stream, "messages")
        tools = body.tools if body.tools and body.tool_choice != "none" else None
        if body.stream:
            return self._sse(self._chat_stream(call, body, tools, top_n, request, on_call), call)
        try:
            if not await self._wait(call, request):
                return Response(status_code=499)
        finally:
            self._end(call)
        await self.turns.take()
        choices = []
        for c in call.choices:
            content, calls = (c.text.released, [])
            if tools:
                content, calls = parse_output(c.text.released, tools, body.tool_format)
            choices.append(ChatChoice(
                index=c.index, message=AssistantMessage(content=content, tool_calls=calls or None),
                finish_reason="tool_calls" if calls else c.finish_reason,
                logprobs=ChoiceLogprobs(content=chat_logprobs(c, 0, top_n, self.strings)) if body.logprobs else None,
                token_ids=c.ids if body.return_token_ids else None))
        result = ChatCompletion(id=new_id("chatcmpl"), created=int(time.time()), model=self.model_name,
                                choices=choices, usage=call.usage,
                                prompt_token_ids=prompt if body.return_token_ids else None).model_dump(mode="json")
        await notify(on_call, request, ServedCall("chat.completions", body, call.prompts, call.rollouts, result))
        return JSONResponse(result)

    async def _chat_stream(self, call: Call, body: ChatCompletionRequest, tools, top_n: int,
                           request: Request, on_call: CallHook | None) -> AsyncIterator[str]:
        cid, created = new_id("chatcmpl"), int(time.time())

        def chunk(choices, **extra) -> str:
            return sse_event(ChatCompletionChunk(id=cid, created=created, model=self.model_name, choices=choices,
                                              **extra).model_dump(mode="json"))

        yield chunk([ChatChunkChoice(index=c.index, delta=ChatDelta(role="assistant", content=""))
                     for c in call.choices], prompt_token_ids=call.prompts[0] if body.return_token_ids else None)
        async for c, start, text, done in self._progress(call):
            delta = ChatDelta(content=text if text and not tools else None)
            logprobs = ChoiceLogprobs(content=chat_logprobs(c, start, top_n, self.strings)) if body.logprobs else None
            ids = c.ids[start:] if body.return_token_ids else None
            if delta.content is not None or start < len(c.ids):
                yield chunk([ChatChunkChoice(index=c.index, delta=delta, logprobs=logprobs, token_ids=ids)])
            if not done:
                continue
            reason = c.finish_reason
            if tools:
                content, calls = parse_output(c.text.released, tools, body.tool_format)
                deltas = [ToolCallDelta(index=k, id=t.id, type="function",
                                        function=FunctionCallDelta(name=t.function.name, arguments=t.function.arguments))
                          for k, t in enumerate(calls)]
                reason = "tool_calls" if calls else reason
                if content or deltas:
                    yield chunk([ChatChunkChoice(index=c.index, delta=ChatDelta(content=content or None,
                                                                                tool_calls=deltas or None))])
            yield chunk([ChatChunkChoice(index=c.index, delta=ChatDelta(), finish_reason=reason)])
        if body.stream_options is not None and body.stream_options.include_usage:
            yield chunk([], usage=call.usage)
        await notify(on_call, request, ServedCall("chat.completions", body, call.prompts, call.rollouts, None))

    # -- completions --------------------------------------------------------------------------

    async def completions(self, body: CompletionRequest, request: Request, on_call: CallHook | None = None):
        self._check_open()
        self._check_model(body.model)
        refuse_unsupported(body)
        if body.stream and (body.echo or body.max_tokens == 0):
            raise bad_request("echo and max_tokens 0 are not supported with stream", "echo" if body.echo else "max_tokens")
        if body.suffix:
            raise bad_request("suffix is not supported", "suffix")
        if body.best_of is not None and body.best_of != body.n:
            raise bad_request("best_of is not supported (other than best_of == n)", "best_of")
        text = isinstance(body.prompt, str) or (bool(body.prompt) and isinstance(body.prompt[0], str))
        prompts = await self._off_loop(self._prompt_ids, body.prompt) if text else self._prompt_ids(body.prompt)
        self._check_context(prompts, "prompt")
        top_n = body.logprobs or 0
        # max_tokens 0: one token is generated (and dropped) by the prefill that scores the prompt.
        limit = 1 if body.max_tokens == 0 else body.max_tokens or 1 << 62
        stop_ids = tuple(getattr(body, "stop_token_ids", ()))  # token-in routes (tokenflow.serve.token_routes)
        params = [self._params(body, p, limit, stop_ids, top_n) for p in prompts]
        for sp in params:
            sp.prompt_logprobs = top_n if body.echo and body.logprobs is not None else None
        params = [self.sampling(body, request, sp) for sp in params]
        call = await self._start(prompts, params, body.stream, "prompt")
        if body.stream:
            return self._sse(self._completion_stream(call, body, top_n, request, on_call), call)
        try:
            if not await self._wait(call, request):
                return Response(status_code=499)
        finally:
            self._end(call)
        await self.turns.take()
        echo = await self._off_loop(self._echo_texts, body.prompt, call.prompts) if body.echo else None
        choices = [completion_choice(c, call.prompts[c.index // call.n], body, top_n, self.strings,
                                     echo[c.index // call.n] if echo else None) for c in call.choices]
        result = Completion(id=new_id("cmpl"), created=int(time.time()), model=self.model_name, choices=choices,
                            usage=call.usage).model_dump(mode="json")
        await notify(on_call, request, ServedCall("completions", body, call.prompts, call.rollouts, result))
        return JSONResponse(result)

    async def _completion_stream(self, call: Call, body: CompletionRequest, top_n: int, request: Request,
                                 on_call: CallHook | None) -> AsyncIterator[str]:
        cid, created = new_id("cmpl"), int(time.time())

        def chunk(choices, usage=None) -> str:
            return sse_event(Completion(id=cid, created=created, model=self.model_name, choices=choices,
                                     usage=usage).model_dump(mode="json"))

        async for c, start, text, done in self._progress(call):
            if not text and start == len(c.ids) and not done:
                continue
            first = start == 0
            yield chunk([CompletionChoice(
                index=c.index, text=text, finish_reason=c.finish_reason if done else None,
                logprobs=completion_logprobs(c, start, top_n, self.strings) if body.logprobs is not None else None,
                prompt_token_ids=call.prompts[c.index // call.n] if body.return_token_ids and first else None,
                token_ids=c.ids[start:] if body.return_token_ids else None)])
        if body.stream_options is not None and body.stream_options.include_usage:
            yield chunk([], usage=call.usage)
        await notify(on_call, request, ServedCall("completions", body, call.prompts, call.rollouts, None))

    def _echo_texts(self, prompt, ids: list[list[int]]) -> list[str]:
        """Each prompt's text as ``echo`` returns it: as sent, or its token ids decoded."""
        if isinstance(prompt, str) or isinstance(prompt[0], str):
            return [prompt] if isinstance(prompt, str) else list(prompt)
        if self.tokenizer is None:
            return ["" for _ in ids]
        return [self.tokenizer.decode(p, skip_special_tokens=False) for p in ids]

    def _prompt_ids(self, prompt) -> list[list[int]]:
        if isinstance(prompt, str):
            prompt = [prompt]
        if not prompt:
            raise bad_request("prompt is empty", "prompt")
        if isinstance(prompt[0], int):
            return [list(prompt)]
        out = []
        for p in prompt:
            if isinstance(p, str):
                if self.tokenizer is None:
                    raise bad_request("this model has no tokenizer; send the prompt as token ids", "prompt")
                try:
                    p = self.tokenizer(p, add_special_tokens=True)["input_ids"]
                except Exception as e:  # noqa: BLE001 - tokenizers raise plain Exceptions
                    raise bad_request(f"the prompt cannot be encoded by this model's tokenizer ({e}); "
                                      "check its characters, or send token ids", "prompt") from None
            if not p:
                raise bad_request("a prompt has no tokens", "prompt")
            out.append(list(p))
        return out

    # -- what a subclass may change (training sessions do) -------------------------------------

    def chat_prompt(self, body: ChatCompletionRequest, request: Request) -> list[int]:
        """The prompt ids of a chat call: the conversation as the chat template renders it."""
        return self.chat_format.prompt_ids(body.messages, body.tools)

    def sampling(self, body, request: Request, params: SamplingParams) -> SamplingParams:
        """The engine's sampling parameters for one prompt of a call (as the body asks)."""
        return params

    # -- running a call -----------------------------------------------------------------------

    def _check_context(self, prompts: list[list[int]], param: str) -> None:
        longest = max(len(p) for p in prompts)
        if longest >= self.max_model_len:
            raise bad_request(
                f"This model's maximum context length is {self.max_model_len} tokens, and the {param} "
                f"{'is' if param == 'prompt' else 'are'} {longest} tokens, leaving no room for a completion. "
                f"Please shorten the {param}.", param, "context_length_exceeded")

    def _params(self, body, prompt: list[int], max_tokens: int, stop_ids: tuple[int, ...], top_n: int) -> SamplingParams:
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        if any(not s for s in stop):
            raise bad_request("stop strings must not be empty", "stop")
        return SamplingParams(
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p, top_k=body.top_k or 0,
            max_tokens=min(max_tokens, self.max_model_len - len(prompt)),
            stop_token_ids=stop_ids, stop=tuple(stop), n=body.n, seed=body.seed,
            ignore_eos=body.ignore_eos, logprobs=top_n)

    async def _start(self, prompts: list[list[int]], params: list[SamplingParams], stream: bool,
                     param: str) -> Call:
        n = params[0].n
        self._check_open()  # tokenizing took a while: the server may be stopping by now
        cost = sum(len(p) + q.max_tokens * q.n for p, q in zip(prompts, params))
        call = Call(prompts, n, asyncio.Queue(), [], [], self.admission.reserve(cost, param))
        try:
            call.subs = await self.driver.submit(list(zip(prompts, params)), stream=stream, events=call.queue)
        except InvalidRequest as e:
            self._end(call)
            raise bad_request(str(e)) from None
        except DriverClosed as e:
            self._end(call)
            raise unavailable(str(e)) from None
        except BaseException:
            self._end(call)
            raise
        # Built once the engine has accepted n (events wait in the queue meanwhile).
        call.choices = [ChoiceOutput(p * n + i, TextAssembler(self.tokenizer, params[p].stop))
                        for p in range(len(prompts)) for i in range(n)]
        return call

    async def _progress(self, call: Call) -> AsyncIterator[tuple[ChoiceOutput, int, str, bool]]:
        """(choice, first new token, newly released text, finished?) per engine event, until
        every sample has finished."""
        pending = len(call.choices)
        stream = bool(call.subs) and call.subs[0].stream
        while pending:
            event = await call.queue.get()
            if stream:
                await self.turns.take()  # one stream's event a loop turn, when many come at once
            if isinstance(event, TokenDelta):
                c = call.choice_of(event.request_id, event.sample_index)
                start, text = c.add(event.token_ids, event.logprobs, event.top_logprobs)
                yield c, start, text, False
            elif isinstance(event, Rollout):
                c = call.choice_of(event.request_id, event.sample_index)
                start, text = c.finish(event)
                pending -= 1
                yield c, start, text, True
            elif isinstance(event, DriverClosed):
                raise unavailable(str(event))
            elif isinstance(event, EngineFailed):
                logger.error("serve: a request failed because the engine failed: %s", event)
                raise internal_error()
            else:
                raise TypeError(f"unexpected engine event {event!r}")

    async def _drain(self, call: Call) -> None:
        async for _ in self._progress(call):
            pass

    async def _wait(self, call: Call, request: Request) -> bool:
        """Wait for every sample of a whole (non-streamed) call; False if its client went away
        first (the caller's `_end` then aborts what the engine still runs for it)."""
        done = asyncio.ensure_future(self._drain(call))
        gone = asyncio.ensure_future(disconnected(request))
        try:
            await asyncio.wait((done, gone), return_when=asyncio.FIRST_COMPLETED)
            if done.done():
                done.result()  # an error the call ended with
                return True
            return False
        finally:
            for task in (done, gone):
                task.cancel()

    def _end(self, call: Call) -> None:
        """The call is over: what it still runs in the engine stops, its tokens are free (idempotent)."""
        self.driver.cancel(call.subs)
        if call.tokens is not None:
            call.tokens.release()

    def _sse(self, events: AsyncIterator[str], call: Call) -> EventStream:
        return sse_stream(events, lambda: self._end(call), lambda: self.closing)
