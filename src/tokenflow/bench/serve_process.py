"""What the serve benches share: a `tokenflow serve` subprocess on a free loopback port, up once
``/health`` answers, and a bare HTTP/1.1 client (``Conn``) for abuse a library client would not
send (bodies cut short, connections dropped mid-request)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def subprocess_server(args):
    port = free_port()
    log = tempfile.TemporaryFile(mode="w+")
    cmd = [sys.executable, "-m", "tokenflow.cli.main", "serve", args.model, "--port", str(port),
           "--threads", str(args.threads), "--engine.device", "cpu"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def wait_healthy(url: str, proc, log, timeout_s: float = 180.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise SystemExit(f"error: the server exited with {proc.returncode}:\n{log.read()[-3000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"error: the server did not answer /health within {timeout_s:.0f} s")


class Conn:
    """One keep-alive HTTP/1.1 connection: requests with a JSON body, whole answers."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, host: str, port: int) -> Conn:
        return cls(*await asyncio.open_connection(host, port))

    def close(self) -> None:
        self.writer.close()

    async def request(self, path: str, body: bytes) -> tuple[int, dict, bytes]:
        self.writer.write(request_head(path, {"Content-Length": str(len(body))}) + body)
        await self.writer.drain()
        return await read_response(self.reader)


def request_head(path: str, headers: dict) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json",
             *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def read_head(reader: asyncio.StreamReader) -> tuple[int, dict]:
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("the server closed the connection")
    status = int(status_line.split()[1])
    headers = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            return status, headers
        key, _, value = line.decode("latin-1").partition(":")
        headers[key.strip().lower()] = value.strip()


async def read_body(reader: asyncio.StreamReader, headers: dict) -> bytes:
    if "content-length" in headers:
        return await reader.readexactly(int(headers["content-length"]))
    if headers.get("transfer-encoding", "").lower() == "chunked":
        parts = []
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                await reader.readline()
                return b"".join(parts)
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
    return await reader.read()


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict, bytes]:
    status, headers = await read_head(reader)
    return status, headers, await read_body(reader, headers)


# ---- measuring (the abuse bench) --------------------------------------------------------------

PROBER = r"""
import http.client, json, sys, time

host, port, interval, duration = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
lat, at, failures, conn = [], [], 0, None
end = time.monotonic() + duration
while time.monotonic() < end:
    t = time.perf_counter()
    at.append(time.time())
    try:
        if conn is None:
            conn = http.client.HTTPConnection(host, port, timeout=10)
        conn.request("GET", "/health")
        r = conn.getresponse()
        r.read()
        failures += r.status != 200
    except Exception:
        failures += 1
        conn = None
    lat.append(time.perf_counter() - t)
    time.sleep(max(0.0, interval - (time.perf_counter() - t)))
print(json.dumps({"latencies": lat, "at": at, "failures": failures}))
"""



def raise_nofile(needed: int) -> dict:
    try:
        import resource
    except ImportError:  # not POSIX
        return {}
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        new = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        soft = new
    return {"nofile_soft": soft}


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of ``pid``, in bytes (Linux)."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def ms(x: float | None) -> float | None:
    return None if x is None else round(1000 * x, 2)


def mib(x: int | None) -> float | None:
    return None if x is None else round(x / 2**20, 1)
