"""The limits that keep the server answering under abuse (`ServeConfig`), each against a real
server on loopback with the shipped model: a body over the limit is a 413 before it is read, a
prompt over the character bound a 400 before it is tokenized, admission past its limits a 429
with ``Retry-After``, a whole call whose client goes away stops in the engine, a stop ends what
runs within its time without a traceback, and training sessions are bounded.

Timings here are generous bounds derived from the limits (the speed goals are
`tokenflow bench serve --abuse`'s); every request is bounded in time and count."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

import httpx
import pytest

from tests.serve.serve_testlib import served, slow_steps
from tokenflow.config.serve import ServeConfig

pytestmark = pytest.mark.timeout(120)

BODY_LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def server():
    config = ServeConfig(max_body_bytes=BODY_LIMIT, max_requests=2, max_tokens_in_flight=600)
    with served("default", config=config, reference=False) as s:
        yield s


def _shape(body: dict) -> dict:
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


def _wait_until(condition, timeout_s: float, what: str) -> float:
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout_s, f"{what} did not happen within {timeout_s} s"
        time.sleep(0.01)
    return time.monotonic() - start


def _idle(s) -> bool:
    admission = s.app.state.service.admission
    return (s.app.state.driver.in_flight == 0 and not s.engine.has_unfinished()
            and admission.requests == 0 and admission.tokens == 0)


def _port(s) -> int:
    return int(s.url.rsplit(":", 1)[1])


def _response_head(sock: socket.socket, timeout_s: float) -> bytes:
    """What the server answered on ``sock`` until its body's end (or the connection's)."""
    sock.settimeout(timeout_s)
    data = b""
    while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def _health_latencies(s, stop: threading.Event, out: list[float]) -> None:
    with httpx.Client(timeout=10) as client:
        while not stop.is_set():
            t = time.perf_counter()
            assert client.get(s.url + "/health").status_code == 200
            out.append(time.perf_counter() - t)
            time.sleep(0.01)


# ---- body size ------------------------------------------------------------------------------

def test_a_declared_body_over_the_limit_is_a_413_before_any_of_it_is_read(server):
    with socket.create_connection(("127.0.0.1", _port(server)), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000000000\r\n\r\n{\"prompt\": ")  # a GB announced, 11 bytes sent
        answer = _response_head(sock, timeout_s=10)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), answer[:300]
    assert b"connection: close" in head.lower()
    assert _shape(json.loads(body))["code"] == "request_too_large"
    # a body of twice the limit is read to its end and dropped: its client reads the 413, and
    # the connection stays open
    with httpx.Client(timeout=30) as client:
        r = client.post(server.base_url + "/completions", json={"prompt": "1" * (2 * BODY_LIMIT)})
        assert r.status_code == 413 and str(BODY_LIMIT) in _shape(r.json())["message"]
        assert "close" not in r.headers.get("connection", "")
        assert client.post(server.base_url + "/completions", json={"prompt": "1+1=", "max_tokens": 2}).status_code == 200


def test_a_chunked_body_is_cut_at_the_limit_while_health_stays_responsive(server):
    """A chunked body that never ends: the 413 comes once the limit is passed, the connection
    closes (the sender is stopped long before its 32 MiB), and /health answers throughout."""
    cap = 32 * 1024 * 1024
    sent = [0]
    stop = threading.Event()
    latencies: list[float] = []
    health = threading.Thread(target=_health_latencies, args=(server, stop, latencies), daemon=True)
    health.start()
    sock = socket.create_connection(("127.0.0.1", _port(server)), timeout=10)

    def send() -> None:
        chunk = b"%x\r\n%s\r\n" % (16384, b" " * 16384)
        try:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n")
            while sent[0] < cap:
                sock.sendall(chunk)
                sent[0] += 16384
        except OSError:
            pass  # the server closed the connection

    sender = threading.Thread(target=send, daemon=True)
    try:
        sender.start()
        answer = _response_head(sock, timeout_s=20)
        sender.join(20)
    finally:
        sock.close()
        time.sleep(0.2)
        stop.set()
        health.join(10)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
    assert sent[0] < cap, "the server read the whole body"
    assert latencies and max(latencies) < 2.0, max(latencies)


def test_body_bytes_past_their_budget_are_a_429_and_given_back_when_a_client_goes():
    """Two requests announce 60 KiB each and send nothing: a third does not fit the 128 KiB
    budget (a 429); once the two go away, their bytes are free."""
    config = ServeConfig(max_body_bytes=BODY_LIMIT, max_body_bytes_in_flight=2 * BODY_LIMIT)
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 61440\r\n\r\n{")
    with served("default", config=config, reference=False) as s:
        admission = s.app.state.service.admission
        holders = [socket.create_connection(("127.0.0.1", _port(s)), timeout=10) for _ in range(2)]
        try:
            for sock in holders:
                sock.sendall(head)
            _wait_until(lambda: admission.body == 2 * 61440, 10, "two bodies reserved")
            with socket.create_connection(("127.0.0.1", _port(s)), timeout=10) as sock:
                sock.sendall(head)
                answer = _response_head(sock, timeout_s=10)
            assert answer.startswith(b"HTTP/1.1 429"), answer[:300]
            assert b"retry-after: 1" in answer.lower()
            error = _shape(json.loads(answer.partition(b"\r\n\r\n")[2]))
            assert error["code"] == "rate_limit_exceeded" and "max_body_bytes_in_flight" in error["message"]
        finally:
            for sock in holders:
                sock.close()
        _wait_until(lambda: _idle(s) and admission.body == 0, 5, "the bodies' bytes given back")
        health = httpx.get(s.url + "/health", timeout=10).json()
        assert health["body_bytes_in_flight"] == 0 and health["requests_in_flight"] == 0
        assert httpx.post(s.base_url + "/completions", json={"prompt": "1+1=", "max_tokens": 2},
                          timeout=30).status_code == 200


# ---- prompts ----------------------------------------------------------------------------------

class _CountingTokenizer:
    def __init__(self, tokenizer, delay_s: float = 0.0) -> None:
        self.tokenizer, self.calls, self.delay_s = tokenizer, 0, delay_s

    def __call__(self, *args, **kw):
        self.calls += 1
        time.sleep(self.delay_s)
        return self.tokenizer(*args, **kw)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


def test_a_prompt_over_the_character_bound_is_a_400_without_tokenizing(server, monkeypatch):
    service = server.app.state.service
    spy = _CountingTokenizer(service.tokenizer)
    monkeypatch.setattr(service, "tokenizer", spy)
    bound = service.prompt_bound.max_chars
    assert bound == server.engine.max_model_len * 16
    url = server.base_url + "/completions"
    for prompt in ("1" * (bound + 1), ["1+1=", "2" * (bound + 1)]):
        r = httpx.post(url, json={"prompt": prompt, "max_tokens": 2}, timeout=30)
        error = _shape(r.json())
        assert r.status_code == 400 and error["code"] == "context_length_exceeded", r.text
        assert "characters" in error["message"] and str(bound) in error["message"]
    assert spy.calls == 0, "a prompt over the bound was tokenized"
    # at the bound it is tokenized, and refused for its tokens
    r = httpx.post(url, json={"prompt": "1" * bound, "max_tokens": 2}, timeout=30)
    assert r.status_code == 400 and _shape(r.json())["code"] == "context_length_exceeded"
    assert spy.calls == 1 and "tokens" in r.json()["error"]["message"]
    # token ids over the context: refused before validation walks them
    r = httpx.post(url, json={"prompt": [4] * 20_000, "max_tokens": 2}, timeout=30)
    assert r.status_code == 400 and _shape(r.json())["code"] == "context_length_exceeded"


def test_a_chat_over_the_character_bound_is_a_400_without_rendering():
    with served("default-tool", reference=False) as s:
        service = s.app.state.service
        rendered = []
        render = service.chat_prompt
        service.chat_prompt = lambda body, request: rendered.append(1) or render(body, request)
        bound = service.prompt_bound.max_chars
        url = s.base_url + "/chat/completions"
        half = "x" * (bound // 2 + 1)
        r = httpx.post(url, json={"messages": [{"role": "system", "content": half},
                                               {"role": "user", "content": [{"type": "text", "text": half}]}]},
                       timeout=30)
        assert r.status_code == 400 and _shape(r.json())["code"] == "context_length_exceeded", r.text
        assert _shape(r.json())["param"] == "messages" and not rendered
        r = httpx.post(url, json={"messages": [{"role": "user", "content": "1+1"}], "max_tokens": 2}, timeout=30)
        assert r.status_code == 200 and rendered == [1]


def test_prompts_times_n_over_the_cap_is_a_400_without_tokenizing(server, monkeypatch):
    service = server.app.state.service
    spy = _CountingTokenizer(service.tokenizer)
    monkeypatch.setattr(service, "tokenizer", spy)
    assert service.config.max_choices == 256
    r = httpx.post(server.base_url + "/completions", json={"prompt": ["1+1="] * 6, "n": 50, "max_tokens": 1},
                   timeout=30)
    error = _shape(r.json())
    assert r.status_code == 400 and error["code"] == "too_many_choices" and "300" in error["message"], r.text
    assert spy.calls == 0


@pytest.mark.slow
def test_prompts_are_tokenized_off_the_event_loop(server, monkeypatch):
    """A tokenizer that takes a second: /health answers meanwhile."""
    service = server.app.state.service
    spy = _CountingTokenizer(service.tokenizer, delay_s=1.0)
    monkeypatch.setattr(service, "tokenizer", spy)
    out: list = []
    call = _call_in_thread(server.base_url + "/completions", {"prompt": "1+1=", "max_tokens": 2}, 30, out)
    _wait_until(lambda: spy.calls == 1, 10, "the tokenizer called")
    t = time.perf_counter()
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    assert time.perf_counter() - t < 0.5
    call.join(30)
    assert out == [200]


# ---- admission --------------------------------------------------------------------------------

def _call_in_thread(url: str, body: dict, read_timeout_s: float, out: list) -> threading.Thread:
    def call() -> None:
        try:
            out.append(httpx.post(url, json=body, timeout=httpx.Timeout(30, read=read_timeout_s)).status_code)
        except httpx.ReadTimeout:
            out.append("gone")  # the client gave up and closed its connection

    t = threading.Thread(target=call, daemon=True)
    t.start()
    return t


@pytest.mark.slow
def test_past_the_admission_limits_a_request_is_a_429_with_retry_after(server):
    """max_requests = 2 and 600 tokens in flight: a third request, and a request whose tokens
    do not fit beside the ones admitted, are 429s in OpenAI's shape with Retry-After; a request
    that could never fit is a 400. Everything given back once the calls end."""
    service = server.app.state.service
    url = server.base_url + "/completions"
    long = {"prompt": [4, 5, 6, 7], "max_tokens": 100, "ignore_eos": True}  # 104 tokens in flight
    restore = slow_steps(server.engine, 0.05)  # 100 steps: 5 s
    out: list = []
    try:
        threads = [_call_in_thread(url, long, 2.0, out) for _ in range(2)]
        _wait_until(lambda: service.admission.requests == 2 and server.app.state.driver.in_flight == 2, 10,
                    "two calls in flight")
        r = httpx.post(url, json={"prompt": "1+1=", "max_tokens": 2}, timeout=30)
        assert r.status_code == 429 and r.headers["retry-after"] == "1", r.text
        error = _shape(r.json())
        assert error["type"] == "requests" and error["code"] == "rate_limit_exceeded"
        for t in threads:
            t.join(30)
        _wait_until(lambda: _idle(server), 5, "the calls' end")
        # tokens: 4 + 252 (max_tokens capped by the context) admitted, 4 + 2 x 252 more do not fit
        threads = [_call_in_thread(url, {**long, "max_tokens": 500}, 2.0, out)]
        _wait_until(lambda: service.admission.tokens == 256, 10, "a call in flight")
        r = httpx.post(url, json={"prompt": [4, 5, 6, 7], "max_tokens": 500, "n": 2}, timeout=30)
        assert r.status_code == 429 and r.headers["retry-after"] == "1", r.text
        assert _shape(r.json())["type"] == "tokens"
        r = httpx.post(url, json={"prompt": [4, 5, 6, 7], "max_tokens": 500, "n": 3}, timeout=30)
        assert r.status_code == 400 and _shape(r.json())["code"] == "tokens_exceed_limit", r.text
        threads[0].join(30)
    finally:
        restore()
    assert out == ["gone"] * 3
    _wait_until(lambda: _idle(server), 5, "the calls' end")
    r = httpx.post(url, json={"prompt": "1+1=", "max_tokens": 2, "stream": True}, timeout=30)
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
    _wait_until(lambda: _idle(server), 5, "a stream giving its slot back")


# ---- disconnects ------------------------------------------------------------------------------

def test_a_whole_call_whose_client_disconnects_stops_in_the_engine(server):
    driver = server.app.state.driver
    restore = slow_steps(server.engine, 0.05)  # 200 steps: 10 s if it ran to the end
    out: list = []
    try:
        body = {"prompt": [4, 5, 6, 7], "max_tokens": 200, "ignore_eos": True}
        _call_in_thread(server.base_url + "/completions", body, 0.5, out).join(30)
        assert out == ["gone"]
        took = _wait_until(lambda: _idle(server), 3.0, "the engine freeing a disconnected call")
    finally:
        restore()
    assert driver.in_flight == 0 and took < 3.0
    t = time.perf_counter()
    r = httpx.post(server.base_url + "/completions", json={"prompt": "1+1=", "max_tokens": 4}, timeout=30)
    assert r.status_code == 200 and time.perf_counter() - t < 5.0


# ---- stopping ---------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_stop_ends_calls_in_flight_within_its_time_and_logs_no_traceback(caplog):
    """Two long calls (a whole one and a stream, 12 s each) when the stop comes: they get a 503
    (the stream: an error event, then [DONE]) before the stop's 2 s are up, nothing is cancelled
    by uvicorn's deadline, and nothing is logged at ERROR."""
    config = ServeConfig(shutdown_timeout_s=2.0)
    answers: dict = {}
    body = {"prompt": [4, 5, 6, 7], "max_tokens": 240, "ignore_eos": True}

    def whole(url: str) -> None:
        r = httpx.post(url, json=body, timeout=30)
        answers["whole"] = (r.status_code, r.json())

    def streamed(url: str) -> None:
        with httpx.stream("POST", url, json={**body, "stream": True}, timeout=30) as r:
            answers["stream"] = [line for line in r.iter_lines() if line.startswith("data: ")]

    with caplog.at_level(logging.WARNING):
        server = served("default", config=config, reference=False)
        s = server.__enter__()
        try:
            slow_steps(s.engine, 0.05)
            url = s.base_url + "/completions"
            threads = [threading.Thread(target=f, args=(url,), daemon=True) for f in (whole, streamed)]
            for t in threads:
                t.start()
            _wait_until(lambda: s.app.state.driver.in_flight == 2, 10, "two calls in flight")
            time.sleep(0.3)
            start = time.monotonic()
        finally:
            server.__exit__(None, None, None)
        took = time.monotonic() - start
        for t in threads:
            t.join(10)
    assert took < config.shutdown_timeout_s + 1.0, took
    status, error = answers["whole"]
    assert status == 503 and _shape(error)["type"] == "service_unavailable"
    events = answers["stream"]
    assert events[-1] == "data: [DONE]" and json.loads(events[-2][6:])["error"]["type"] == "service_unavailable"
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
    assert "Traceback" not in caplog.text and "CancelledError" not in caplog.text


# ---- sessions ---------------------------------------------------------------------------------

@pytest.mark.slow
def test_sessions_are_bounded_in_number_calls_and_idle_time(monkeypatch):
    import asyncio
    import types
    from contextlib import asynccontextmanager

    from fastapi import FastAPI

    from tokenflow.engine import EngineConfig, SamplingParams
    from tokenflow.engine.factory import make_engine
    from tokenflow.model_store import resolve_model_path
    from tokenflow.serve import errors
    from tokenflow.serve.app import openai_router
    from tokenflow.serve.driver import EngineDriver
    from tokenflow.serve.server import BackgroundServer
    from tokenflow.serve import sessions as sessions_module
    from tokenflow.serve.sessions import SessionLimitError, SessionService

    engine = make_engine(resolve_model_path("default"), EngineConfig(device="cpu", threads=1, max_num_seqs=8))
    driver = EngineDriver(engine)
    service = SessionService(driver, config=ServeConfig(max_sessions=2, max_calls_per_session=2,
                                                         session_idle_s=60.0))
    # idle time runs on a clock the test moves: a loaded machine's real pauses between opening
    # a session and calling it must not close it (CI once saw 404s with a 0.5 s idle time)
    skipped = [0.0]
    monkeypatch.setattr(sessions_module, "time",
                        types.SimpleNamespace(monotonic=lambda: time.monotonic() + skipped[0]))

    @asynccontextmanager
    async def lifespan(app):
        driver.start(asyncio.get_running_loop())
        yield
        await asyncio.to_thread(driver.close)

    app = FastAPI(lifespan=lifespan)
    app.state.service = service
    errors.install(app)
    app.include_router(openai_router(service, prefix="/sessions/{session_id}/v1"))
    params = SamplingParams(temperature=1.0, max_tokens=4)
    try:
        with BackgroundServer(app) as server:
            def call(sid: str, **extra) -> httpx.Response:
                return httpx.post(f"{server.url}/sessions/{sid}/v1/completions",
                                  json={"prompt": [4, 5, 6], **extra}, timeout=30)

            service.open("a", params, 1)
            service.open("b", params, 2)
            with pytest.raises(SessionLimitError, match="max_sessions"):
                service.open("c", params, 3)
            assert [call("a").status_code for _ in range(2)] == [200, 200]
            r = call("a")
            assert r.status_code == 400 and _shape(r.json())["code"] == "session_call_limit_exceeded"
            assert len(service.sessions["a"].calls) == 2
            skipped[0] += 61  # both idle past 60 s: closed, and room for new ones
            r = call("b")
            assert r.status_code == 404 and _shape(r.json())["code"] == "session_not_found"
            assert not service.sessions
            service.open("c", SamplingParams(temperature=1.0, max_tokens=30), 3)
            service.open("d", params, 4)
            # a call running longer than the idle time keeps its session open, and is recorded;
            # the idle session beside it is closed meanwhile
            restore = slow_steps(engine, 0.05)
            out = []
            try:
                running = threading.Thread(target=lambda: out.append(call("c", ignore_eos=True).status_code))
                running.start()  # 30 steps: 1.5 s
                time.sleep(0.5)
                skipped[0] += 61  # "d" idle past 60 s while "c" runs
                assert call("d").status_code == 404
                running.join(30)
            finally:
                restore()
            assert out == [200] and "c" in service.sessions and len(service.sessions["c"].calls) == 1
    finally:
        engine.close()


# ---- turns --------------------------------------------------------------------------------------

def test_turns_spread_a_burst_over_loop_iterations():
    """Five stretches ready at once run in five loop iterations, in order: something else the
    loop has to do (here a task that marks every iteration) runs between any two of them."""
    import asyncio

    from tokenflow.serve.limits import Turns

    async def main() -> list:
        turns, seen = Turns(), []

        async def stretch(k: int) -> None:
            await turns.take()
            seen.append(k)

        async def iterations() -> None:
            while True:
                seen.append("|")
                await asyncio.sleep(0)

        marker = asyncio.ensure_future(iterations())
        await asyncio.sleep(0)
        await asyncio.gather(*(stretch(k) for k in range(5)))
        marker.cancel()
        return seen

    seen = asyncio.run(main())
    work = [i for i, x in enumerate(seen) if x != "|"]
    assert [seen[i] for i in work] == [0, 1, 2, 3, 4]
    assert all("|" in seen[a:b] for a, b in zip(work, work[1:])), seen
