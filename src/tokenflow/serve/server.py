"""Running the app under uvicorn: in the foreground (`run`, the `tokenflow serve` command) or in
a background thread on a free loopback port (`BackgroundServer`: tests, benchmarks, a training
runtime's sessions).

A stop (SIGINT/SIGTERM in the foreground, leaving the ``with`` block in the background) first
marks the service closing, so new calls get a 503 at once; calls in flight may finish until 80%
of ``graceful_s`` (``serve.shutdown_timeout_s``) has passed, then get a 503 (a stream: an error
event) and their engine work is aborted (`OpenAIService.drain`), so that every connection has
closed before uvicorn's deadline and nothing is cancelled mid-call; the engine thread stops in
the rest of the time.

Slow clients cannot hold it (`serve.header_timeout_s`, `serve.max_connections`): a connection
that has not sent a whole request head within the header deadline gets a 408 and is closed
(`DeadlineProtocol`, uvicorn's h11 protocol with a timer from the connection's start, or from
the first byte of its next request); connections past the cap get a 503 in OpenAI's shape (their
request head still read, so the client sees it); the process's soft open-file limit is raised to
what the cap needs; and the event loop's accept errors and uvicorn's warnings reach the log at
most once a second each (`OncePerSecond`), a count of those left out with the next. The body's
deadline is the app's (`tokenflow.serve.limits`).
"""

from __future__ import annotations

import asyncio
import logging
import json
import resource
import socket
import threading
import time

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    """uvicorn's server, telling the app it is closing as soon as a stop is asked."""

    def handle_exit(self, sig, frame) -> None:
        mark_closing(self.config.app)
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets=None) -> None:
        mark_closing(self.config.app)
        service = _service(self.config.app)
        timeout = self.config.timeout_graceful_shutdown
        drain = None
        if service is not None and timeout and hasattr(service, "drain"):
            drain = asyncio.get_running_loop().call_later(0.8 * timeout, service.drain)
        try:
            await super().shutdown(sockets)
        finally:
            if drain is not None:
                drain.cancel()


def _service(app):
    return getattr(getattr(app, "state", None), "service", None)


def mark_closing(app) -> None:
    service = _service(app)
    if service is not None:
        service.closing = True


def _error_response(status: int, reason: str, message: str, code: str) -> bytes:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error" if status < 500 else
                                 "service_unavailable", "param": None, "code": code}}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\nconnection: close\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


class DeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with a header deadline and a connection cap (the class attributes,
    set by `_config` from the service's `ServeConfig`). The deadline runs from the connection's
    start, or, on a kept-alive connection, from the first byte of its next request, until the
    request head is complete; past it the client gets a 408 and the connection closes."""

    header_timeout_s: float | None = None
    max_connections: int = 0
    late_heads = 0
    """Connections closed at the header deadline (all servers of this process)."""
    over_cap = 0
    """Connections past the cap (answered 503, or closed at once past its slack)."""

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.head_timer = None
        cap, open_now = self.max_connections, len(self.connections)
        if cap and open_now > cap:
            DeadlineProtocol.over_cap += 1
            if open_now > cap + over_cap_slack(cap):  # a flood: no answer, the descriptor back at once
                transport.close()
                return
            self.app = _over_cap_app(cap)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self.head_timer is None and self.conn.their_state is h11.IDLE:
            self._arm()  # the next request on a kept-alive connection begins
        super().data_received(data)
        if self.head_timer is not None and self.conn.their_state is not h11.IDLE:
            self.head_timer.cancel()  # its head is complete
            self.head_timer = None

    def connection_lost(self, exc) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self.header_timeout_s:
            self.head_timer = self.loop.call_later(self.header_timeout_s, self._head_late)

    def _head_late(self) -> None:
        self.head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        DeadlineProtocol.late_heads += 1
        self.transport.write(_error_response(
            408, "Request Timeout", f"The request head did not arrive within {self.header_timeout_s:g} s "
            "(serve.header_timeout_s).", "request_timeout"))
        self.transport.close()


def over_cap_slack(cap: int) -> int:
    """Connections past the cap that still get their 503 (each holds a descriptor until its
    head arrives or its deadline passes); past them a connection is closed unanswered."""
    return max(64, cap // 16)


def _over_cap_app(cap: int):
    async def over_cap(scope, receive, send) -> None:
        body = json.dumps({"error": {
            "message": f"This server has {cap} connections open, its limit (serve.max_connections); "
                       "try again later.", "type": "service_unavailable", "param": None,
            "code": "service_unavailable"}}).encode()
        await send({"type": "http.response.start", "status": 503, "headers": [
            (b"content-type", b"application/json"), (b"connection", b"close"), (b"retry-after", b"1"),
            (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
    return over_cap


class OncePerSecond(logging.Filter):
    """Lets one record a second through for each (logger, message), the traceback only on the
    first; the next one let through says how many were left out (an accept that fails for want
    of file descriptors is retried, and logged, every second, by every listening socket)."""

    def __init__(self, interval_s: float = 1.0) -> None:
        super().__init__()
        self.interval_s = interval_s
        self.seen: dict[tuple, list] = {}  # key -> [last time let through, left out since]
        self.lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg).split("\n", 1)[0][:120])
        now = time.monotonic()
        with self.lock:
            entry = self.seen.get(key)
            if entry is not None and now - entry[0] < self.interval_s:
                entry[1] += 1
                return False
            if len(self.seen) > 1024:
                self.seen.clear()
            left_out, first = (entry[1], False) if entry is not None else (0, True)
            self.seen[key] = [now, 0]
        if not first:
            record.exc_info, record.exc_text, record.stack_info = None, None, None
            if left_out:
                record.msg = f"{record.msg} ({left_out} more like this left out of the log)"
        return True


LOG_FILTER = OncePerSecond()
RATE_LIMITED_LOGGERS = ("asyncio", "uvicorn.error")


def _limit_logs() -> None:
    for name in RATE_LIMITED_LOGGERS:
        log = logging.getLogger(name)
        if LOG_FILTER not in log.filters:
            log.addFilter(LOG_FILTER)


def raise_open_files(connections: int) -> int:
    """Raise the soft limit on open files towards what ``connections`` need (the hard limit
    bounds it); returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = connections + over_cap_slack(connections) + 256  # the model's files, the engine's, the probes'
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        if new > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
    if soft != resource.RLIM_INFINITY and soft < want:
        logger.warning("serve: the open-file limit is %d, below the %d that serve.max_connections = %d needs; "
                       "past it, connections wait in the kernel's queue", soft, want, connections)
    return soft


def _config(app, *, log_level: str, access_log: bool, graceful_s: float, **kw) -> uvicorn.Config:
    config = getattr(_service(app), "config", None)
    protocol = type("DeadlineProtocol", (DeadlineProtocol,), {
        "header_timeout_s": getattr(config, "header_timeout_s", None),
        "max_connections": getattr(config, "max_connections", 0) or 0})
    if protocol.max_connections:
        raise_open_files(protocol.max_connections)
    _limit_logs()
    # log_config=None: uvicorn's records go through the host's logging setup, not a second one.
    return uvicorn.Config(app, log_config=None, log_level=log_level, access_log=access_log, http=protocol,
                          timeout_graceful_shutdown=graceful_s, lifespan="on", **kw)


def run(app, host: str = "127.0.0.1", port: int = 8000, *, log_level: str = "info", access_log: bool = False,
        graceful_s: float = 10.0) -> None:
    """Serve ``app`` until SIGINT or SIGTERM; the stop takes at most about ``graceful_s``."""
    _Server(_config(app, host=host, port=port, log_level=log_level, access_log=access_log,
                    graceful_s=graceful_s)).run()


def loopback_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening TCP socket on ``host`` (port 0: a free one, chosen by the kernel)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class BackgroundServer:
    """``with BackgroundServer(app) as server: ... server.url ...``: the app served from a
    thread on a free loopback port, started within ``startup_timeout_s`` and stopped on exit
    (within ``graceful_s``; None: the service's ``shutdown_timeout_s``)."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, *, startup_timeout_s: float = 60.0,
                 graceful_s: float | None = None, log_level: str = "warning") -> None:
        if graceful_s is None:
            config = getattr(_service(app), "config", None)
            graceful_s = config.shutdown_timeout_s if config is not None else 5.0
        self.app = app
        self.host = host
        self.sock = loopback_socket(host, port)
        self.port = self.sock.getsockname()[1]
        self.startup_timeout_s = startup_timeout_s
        self.server = _Server(_config(app, log_level=log_level, access_log=False, graceful_s=graceful_s))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="tokenflow-serve-http", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + self.startup_timeout_s
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the server stopped while starting; its log says why")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the server did not start within {self.startup_timeout_s:.0f} s")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self, timeout_s: float = 30.0) -> None:
        mark_closing(self.app)
        self.server.should_exit = True
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            logger.warning("serve: the background server did not stop within %.0f s", timeout_s)
        self.sock.close()
