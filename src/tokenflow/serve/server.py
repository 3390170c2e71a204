"""Running the app under uvicorn: in the foreground (`run`, the `tokenflow serve` command) or in
a background thread on a free loopback port (`BackgroundServer`: tests, benchmarks, a training
runtime's sessions).

A stop (SIGINT/SIGTERM in the foreground, leaving the ``with`` block in the background) first
marks the service closing, so new calls get a 503 at once; calls in flight may finish until 80%
of ``graceful_s`` (``serve.shutdown_timeout_s``) has passed, then get a 503 (a stream: an error
event) and their engine work is aborted (`OpenAIService.drain`), so that every connection has
closed before uvicorn's deadline and nothing is cancelled mid-call; the engine thread stops in
the rest of the time.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time

import uvicorn

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


def _config(app, *, log_level: str, access_log: bool, graceful_s: float, **kw) -> uvicorn.Config:
    # log_config=None: uvicorn's records go through the host's logging setup, not a second one.
    return uvicorn.Config(app, log_config=None, log_level=log_level, access_log=access_log,
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
