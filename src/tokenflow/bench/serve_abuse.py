"""`tokenflow bench serve --abuse`: a real `tokenflow serve` under abuse, on loopback.

The server runs as a subprocess with its default limits (`ServeConfig`) on the shipped model.
For ``--duration`` seconds, all at once:

* ``--clients`` (500) clients, one connection each, send completions one after another
  (half streamed; a 429 waits its ``Retry-After``), at most ``--per-client`` requests each;
* ``--oversized`` (50) bodies over the server's limit: half announce their length
  (``Content-Length``, twice the limit, then send it), half are chunked and never end;
* ``--disconnects`` (50) long calls whose client goes away mid-request (half whole calls,
  closed after 20-200 ms, half streams, closed after their first event);
* ``--slow-headers`` (500) connections that send a request head a byte every ``--drip-s`` (1 s),
  opened again whenever the server closes one (its header deadline), and ``--slow-bodies`` (500)
  that send a whole head and then their body a byte every ``--drip-s``;

while a separate process asks ``/health`` every 20 ms, from before the abuse starts until it has
settled. The clients use raw asyncio streams (one small HTTP/1.1 client each), and the process
raises its soft ``RLIMIT_NOFILE`` to what they need.

Reported: ``/health`` latency p50/p99/max (goal: p99 < 100 ms), what became of the clients'
requests (``legit``: every one answered, 200 or 429, none failed; goal), the slow clients'
408s, the server's peak RSS (the
kernel's high-water mark, VmHWM) against the bound its limits give (`memory_bound`; goal:
within it), the 5xx count (goal: 0), every status seen, what is still in flight once it settled
(goal: nothing), the time to stop the server and the tracebacks in its log (goal: none).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from tokenflow.bench.serve_process import (
    PROBER, Conn, free_port, mib, ms, pct, proc_status, raise_nofile, read_body, read_head, request_head,
    wait_healthy,
)

REQUEST_TIMEOUT_S = 60.0


class _Abuse:
    def __init__(self, args, host: str, port: int, body_limit: int) -> None:
        self.args, self.host, self.port, self.body_limit = args, host, port, body_limit
        self.statuses: Counter = Counter()
        self.legit: Counter = Counter()
        """What became of the clients' requests: 200, 429, or how they failed."""
        self.events: Counter = Counter()
        self.latencies: list[float] = []
        self.rng = random.Random(args.seed)
        self.deadline = 0.0

    def _count(self, status: int) -> None:
        self.statuses[str(status)] += 1

    async def run(self) -> float:
        loop = asyncio.get_running_loop()
        start = loop.time()
        self.deadline = start + self.args.duration
        tasks = [self.client(k) for k in range(self.args.clients)]
        tasks += [self.oversized(k) for k in range(self.args.oversized)]
        tasks += [self.disconnect(k) for k in range(self.args.disconnects)]
        tasks += [self.slow(k, body=False) for k in range(self.args.slow_headers)]
        tasks += [self.slow(k, body=True) for k in range(self.args.slow_bodies)]
        await asyncio.gather(*tasks)
        return loop.time() - start

    def _later(self) -> float:
        return self.rng.uniform(0.0, 0.8 * self.args.duration)

    async def client(self, k: int) -> None:
        loop = asyncio.get_running_loop()
        conn = None
        await asyncio.sleep(self.rng.uniform(0.0, 0.5))  # 500 connections, not all in one instant
        for i in range(self.args.per_client):
            if loop.time() >= self.deadline:
                break
            stream = (k + i) % 2 == 0
            a, b = self.rng.randrange(10, 100), self.rng.randrange(10, 100)
            body = json.dumps({"prompt": f"{a}+{b}=", "max_tokens": self.args.max_tokens, "temperature": 1.0,
                               "ignore_eos": True, "stream": stream}).encode()
            t = time.perf_counter()
            try:
                conn = conn or await Conn.open(self.host, self.port)
                status, headers, data = await asyncio.wait_for(conn.request("/v1/completions", body),
                                                               REQUEST_TIMEOUT_S)
            except (OSError, ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError) as e:
                self.events[f"client_error:{type(e).__name__}"] += 1
                self.legit[f"failed:{type(e).__name__}"] += 1
                if conn is not None:
                    conn.close()
                conn = None
                continue
            self._count(status)
            self.legit[str(status) if status in (200, 429) else f"failed:{status}"] += 1
            if status == 200:
                if stream and (not data.rstrip().endswith(b"data: [DONE]") or b'"error"' in data):
                    self.events["stream_error"] += 1
                    self.legit["failed:stream_error"] += 1
                else:
                    self.latencies.append(time.perf_counter() - t)
            elif status == 429:
                await asyncio.sleep(float(headers.get("retry-after", 1)) * self.rng.uniform(0.5, 1.5))
            if headers.get("connection", "").lower() == "close":
                conn.close()
                conn = None
        if conn is not None:
            conn.close()

    async def oversized(self, k: int) -> None:
        """A body over the limit: announced (Content-Length, then sent) or chunked without end.
        A 429 (every request slot taken) is retried after its Retry-After."""
        await asyncio.sleep(self._later())
        chunked = k % 2 == 1
        kind = "chunked" if chunked else "declared"
        loop = asyncio.get_running_loop()
        while loop.time() < self.deadline + 5.0:
            try:
                reader, writer = await asyncio.open_connection(self.host, self.port)
            except OSError as e:
                self.events[f"oversized_{kind}_error:{type(e).__name__}"] += 1
                return
            total = (8 if chunked else 2) * self.body_limit
            headers = {"Transfer-Encoding": "chunked"} if chunked else {"Content-Length": str(total)}

            async def send() -> None:
                piece = b" " * 65536
                frame = b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece
                writer.write(request_head("/v1/completions", headers))
                sent = 0
                while sent < total:
                    writer.write(frame)
                    await writer.drain()
                    sent += len(piece)

            sender = asyncio.ensure_future(send())
            try:
                status, answer = await asyncio.wait_for(read_head(reader), REQUEST_TIMEOUT_S)
            except (OSError, ConnectionError, asyncio.TimeoutError, ValueError) as e:
                # chunked: the server closed the connection at the limit, and the reset came first
                self.events[f"oversized_{kind}_error:{type(e).__name__}"] += 1
                status, answer = None, {}
            finally:
                sender.cancel()
                writer.close()
            if status is None:
                return
            self._count(status)
            if status == 413:
                self.events[f"oversized_{kind}_413"] += 1
                return
            if status != 429:
                self.events[f"oversized_{kind}_answered_{status}"] += 1
                return
            await asyncio.sleep(float(answer.get("retry-after", 1)))
        self.events[f"oversized_{kind}_429_only"] += 1  # every try until the end found the slots taken

    async def disconnect(self, k: int) -> None:
        """A long call whose client goes away mid-request (a whole call after 20-200 ms, a
        stream after its first event); retried while it gets a 429."""
        await asyncio.sleep(self._later())
        stream = k % 2 == 1
        body = json.dumps({"prompt": "12+34=", "max_tokens": self.args.disconnect_tokens, "ignore_eos": True,
                           "stream": stream}).encode()
        loop = asyncio.get_running_loop()
        while loop.time() < self.deadline + 5.0:
            try:
                reader, writer = await asyncio.open_connection(self.host, self.port)
            except OSError as e:
                self.events[f"disconnect_error:{type(e).__name__}"] += 1
                return
            try:
                writer.write(request_head("/v1/completions", {"Content-Length": str(len(body))}) + body)
                await writer.drain()
                wait = REQUEST_TIMEOUT_S if stream else self.rng.uniform(0.02, 0.2)
                try:
                    status, headers = await asyncio.wait_for(read_head(reader), wait)
                except asyncio.TimeoutError:
                    self.events["disconnected_mid_request"] += 1  # a whole call, still running
                    return
                self._count(status)
                if status == 429:
                    await read_body(reader, headers)
                    await asyncio.sleep(float(headers.get("retry-after", 1)))
                    continue
                if status == 200 and stream:
                    line = await asyncio.wait_for(reader.readline(), REQUEST_TIMEOUT_S)  # the first chunk's size
                    self.events["disconnected_mid_request" if line.strip() not in (b"", b"0") else "disconnect_late"] += 1
                else:
                    self.events[f"disconnect_answered_{status}"] += 1
                return
            except (OSError, ConnectionError, asyncio.TimeoutError, ValueError) as e:
                self.events[f"disconnect_error:{type(e).__name__}"] += 1
                return
            finally:
                writer.close()
        self.events["disconnect_refused_429_only"] += 1  # every try found the request slots taken


    async def slow(self, k: int, *, body: bool) -> None:
        """A slow client: a request head (or, ``body``, a whole head and then its body) sent a
        byte every ``--drip-s``, until the server answers and closes the connection (its header or
        body deadline: a 408) — then again on a new connection — or the abuse ends."""
        kind = "slow_body" if body else "slow_head"
        loop = asyncio.get_running_loop()
        await asyncio.sleep(self.rng.uniform(0.0, 1.0))
        head = request_head("/v1/completions", {"Content-Length": "4096"})
        first, drip = (head, b" " * 4096) if body else (b"", head)
        while loop.time() < self.deadline:
            try:
                reader, writer = await asyncio.open_connection(self.host, self.port)
            except OSError as e:
                self.events[f"{kind}_error:{type(e).__name__}"] += 1
                return
            answer = asyncio.ensure_future(reader.read(65536))
            try:
                writer.write(first)
                for i in range(len(drip)):
                    if loop.time() >= self.deadline:
                        self.events[f"{kind}_open_at_end"] += 1
                        return
                    writer.write(drip[i:i + 1])
                    await asyncio.wait([answer], timeout=self.args.drip_s)
                    if answer.done():
                        break
                else:
                    self.events[f"{kind}_sent_whole"] += 1  # no deadline stopped it
                    return
                data = answer.result()
                status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else None
                if status is not None:
                    self._count(status)
                self.events[f"{kind}_{status or 'closed'}"] += 1
            except (OSError, ConnectionError, ValueError, IndexError) as e:
                self.events[f"{kind}_error:{type(e).__name__}"] += 1
            finally:
                answer.cancel()
                writer.close()


def _get_json(url: str) -> dict:
    import httpx

    return httpx.get(url, timeout=10).json()


def run(args) -> int:
    from tokenflow.config.engine import EngineConfig
    from tokenflow.config.serve import ServeConfig
    from tokenflow.model_store import resolve_model_path
    from tokenflow.serve.memory import memory_bound

    clients = 500 if args.clients is None else args.clients
    args.clients = clients
    if min(clients, args.per_client, args.duration) <= 0 or min(args.oversized, args.disconnects, args.slow_headers, args.slow_bodies) < 0:
        print("error: --clients, --per-client and --duration must be > 0", file=sys.stderr)
        return 2
    slow = args.slow_headers + args.slow_bodies
    nofile = raise_nofile(clients + args.oversized + args.disconnects + slow + 256)
    host, port = "127.0.0.1", free_port()
    url = f"http://{host}:{port}"
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"tokenflow-bench-abuse-{os.getpid()}.log"
    log = open(log_path, "w+")
    cmd = [sys.executable, "-m", "tokenflow.cli.main", "serve", args.model, "--host", host, "--port", str(port),
           "--threads", str(args.threads), "--engine.device", "cpu"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    result: dict = {}
    try:
        wait_healthy(url, proc, log)
        card = _get_json(url + "/v1/models")["data"][0]
        max_model_len = card["max_model_len"]
        config = ServeConfig()  # the server's: its defaults
        body_limit = config.body_bytes(max_model_len)
        import httpx

        for _ in range(4):  # warm-up: lazy initialisation on both paths
            httpx.post(url + "/v1/completions", json={"prompt": "1+1=", "max_tokens": 4}, timeout=60)
            httpx.post(url + "/v1/completions", json={"prompt": "1+1=", "max_tokens": 4, "stream": True}, timeout=60)
        base = proc_status(proc.pid).get("VmRSS", 0)
        settle_s = 10.0
        prober = subprocess.Popen([sys.executable, "-c", PROBER, host, str(port), "0.02",
                                   str(args.duration + settle_s + 1.0)], stdout=subprocess.PIPE, text=True)
        time.sleep(0.5)  # the prober is measuring before the abuse starts
        abuse = _Abuse(args, host, port, body_limit)
        rss_samples: list[int] = []

        async def main() -> float:
            async def sample() -> None:
                while True:
                    rss_samples.append(proc_status(proc.pid).get("VmRSS", 0))
                    await asyncio.sleep(0.1)

            sampler = asyncio.ensure_future(sample())
            try:
                return await abuse.run()
            finally:
                sampler.cancel()

        abuse_start = time.time()
        abuse_s = asyncio.run(main())
        # settle: everything given back, the engine empty
        settled, health = None, {}
        start = time.monotonic()
        while time.monotonic() - start < settle_s:
            health = _get_json(url + "/health")
            if not (health["requests_in_flight"] or health["engine_requests"] or health["tokens_in_flight"]
                    or health["body_bytes_in_flight"]):
                settled = round(time.monotonic() - start, 3)
                break
            time.sleep(0.1)
        t = time.perf_counter()
        after = httpx.post(url + "/v1/completions", json={"prompt": "1+1=", "max_tokens": 16}, timeout=60)
        after_s = time.perf_counter() - t
        probe = json.loads(prober.communicate(timeout=args.duration + settle_s + 60)[0])
        status = proc_status(proc.pid)
        peak = max([status.get("VmHWM", 0), *rss_samples])
        t = time.monotonic()
        proc.terminate()
        proc.wait(60)
        shutdown_s = time.monotonic() - t
        log.seek(0)
        server_log = log.read()
        hf_config = json.loads((Path(resolve_model_path(args.model)) / "config.json").read_text())
        connections = clients + args.oversized + args.disconnects + slow + 1
        engine = EngineConfig()  # the server's engine settings: the defaults (on the CPU: float32)
        bound = memory_bound(config, base_bytes=base, connections=connections, max_model_len=max_model_len,
                             max_num_seqs=engine.max_num_seqs, max_num_batched_tokens=engine.max_num_batched_tokens,
                             hf_config=hf_config, dtype_bytes=4)
        lat = probe["latencies"]
        five_xx = sum(n for s, n in abuse.statuses.items() if s.startswith("5"))
        legit_failed = sum(n for s, n in abuse.legit.items() if s.startswith("failed"))
        result = {
            "mode": "abuse", "model": args.model, "duration_s": args.duration, "abuse_s": round(abuse_s, 2),
            "clients": clients, "per_client": args.per_client, "oversized": args.oversized,
            "disconnects": args.disconnects, "slow_headers": args.slow_headers, "slow_bodies": args.slow_bodies,
            "drip_s": args.drip_s, "max_tokens": args.max_tokens,
            "limits": {"max_body_bytes": body_limit, "max_body_bytes_in_flight": config.body_bytes_in_flight(max_model_len),
                       "max_requests": config.max_requests,
                       "max_tokens_in_flight": config.tokens_in_flight(EngineConfig().max_num_seqs, max_model_len),
                       "prompt_chars": config.prompt_chars(max_model_len), "max_choices": config.max_choices},
            "requests": sum(abuse.statuses.values()), "statuses": dict(sorted(abuse.statuses.items())),
            "events": dict(sorted(abuse.events.items())),
            "legit": dict(sorted(abuse.legit.items())), "legit_requests": sum(abuse.legit.values()),
            "legit_served": abuse.legit["200"], "legit_failed": legit_failed,
            "ok_latency_p50_s": pct(abuse.latencies, 50), "ok_latency_p99_s": pct(abuse.latencies, 99),
            "five_xx": five_xx,
            "health_probes": len(lat), "health_failures": probe["failures"],
            "health_p50_ms": ms(pct(lat, 50)), "health_p99_ms": ms(pct(lat, 99)), "health_max_ms": ms(max(lat)),
            "health_worst_ms_at_s": [[ms(x), round(a - abuse_start, 2)]
                                     for x, a in sorted(zip(lat, probe["at"]), reverse=True)[:8]],
            "rss_base_mib": mib(base), "rss_peak_mib": mib(peak), "rss_bound_mib": mib(bound["total"]),
            "rss_bound_terms_mib": {k: mib(v) for k, v in bound.items() if k != "total"},
            "settled_s": settled, "in_flight_after": {k: v for k, v in health.items() if k != "status"},
            "after_request_status": after.status_code, "after_request_s": round(after_s, 3),
            "shutdown_s": round(shutdown_s, 2), "log_tracebacks": server_log.count("Traceback"),
            **nofile,
            "load_average": round(os.getloadavg()[0], 2),
        }
        result["goals"] = {
            "health_p99_under_100ms": result["health_p99_ms"] is not None and result["health_p99_ms"] < 100,
            "rss_within_bound": bound["total"] is None or peak <= bound["total"],
            "no_5xx": five_xx == 0 and probe["failures"] == 0,
            "legit_all_answered": legit_failed == 0 and abuse.legit["200"] > 0,
            "nothing_left_in_flight": settled is not None,
            "clean_stop": result["log_tracebacks"] == 0 and shutdown_s < config.shutdown_timeout_s + 5,
        }
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
        log_path.unlink(missing_ok=True)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>24}: {value}")
    return 0 if all(result["goals"].values()) else 1
