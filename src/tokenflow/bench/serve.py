"""`tokenflow bench serve`: N concurrent loopback clients against `tokenflow serve`.

The server runs as a subprocess (``tokenflow serve`` on a free loopback port; its own Python
process, as in production) or, with ``--in-process``, in a thread of this one (the clients then
share its interpreter). Each of ``--clients`` workers sends requests one after another until
``--requests`` have been sent: arithmetic prompts, temperature 1, ``ignore_eos`` so that every
request generates exactly ``--max-tokens`` tokens and the work is well defined. Streamed
requests (the default) also measure the time to the first token.

Printed: requests/s, completion tokens/s (from each response's usage), latency p50/p99, time to
first token p50/p99, and the error count (non-200 answers, broken streams, timeouts).

``--abuse`` runs the server under abuse instead (`tokenflow.bench.serve_abuse`): 500 clients,
oversized bodies, mid-request disconnects and a thousand slow clients (heads and bodies a byte a
second) at once, reporting ``/health`` latency, what became of the clients' requests, the
server's peak memory against the bound its limits give, and the 5xx count.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time

from tokenflow.bench.serve_process import subprocess_server

logger = logging.getLogger(__name__)


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="concurrent OpenAI-API clients against tokenflow serve")
    p.add_argument("--model", default="default", help='model to serve (default: "default")')
    p.add_argument("--endpoint", choices=["completions", "chat"], default="completions",
                   help="chat needs a model with a chat template (default-tool)")
    p.add_argument("--clients", type=int, default=None, help="concurrent clients (default 8; --abuse: 500)")
    p.add_argument("--requests", type=int, default=64, help="requests in all")
    p.add_argument("--max-tokens", type=int, default=32, help="completion tokens per request")
    p.add_argument("--no-stream", action="store_true", help="whole responses (no time to first token)")
    p.add_argument("--in-process", action="store_true", help="run the server in a thread of this process")
    p.add_argument("--threads", type=int, default=1, help="CPU threads for the server's engine")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds a request may take")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    abuse = p.add_argument_group("abuse mode (--abuse)")
    abuse.add_argument("--abuse", action="store_true",
                       help="500 clients, oversized bodies and disconnects at once against a subprocess server")
    abuse.add_argument("--duration", type=float, default=20.0, help="seconds of abuse")
    abuse.add_argument("--per-client", type=int, default=20, help="most requests each client sends")
    abuse.add_argument("--oversized", type=int, default=50, help="bodies over the server's limit")
    abuse.add_argument("--disconnects", type=int, default=50, help="clients that go away mid-request")
    abuse.add_argument("--disconnect-tokens", type=int, default=240, help="max_tokens of a call that is left")
    abuse.add_argument("--slow-headers", type=int, default=500, help="connections sending their head a byte at a time")
    abuse.add_argument("--slow-bodies", type=int, default=500, help="requests sending their body a byte at a time")
    abuse.add_argument("--drip-s", type=float, default=1.0, help="seconds between a slow client's bytes")
    p.set_defaults(func=run)


@contextlib.contextmanager
def _in_process_server(args):
    from tokenflow.engine import EngineConfig
    from tokenflow.engine.factory import make_engine
    from tokenflow.model_store import resolve_model_path
    from tokenflow.serve.app import create_app
    from tokenflow.serve.server import BackgroundServer

    engine = make_engine(resolve_model_path(args.model), EngineConfig(device="cpu", threads=args.threads))
    try:
        with BackgroundServer(create_app(engine, args.model)) as server:
            yield server.url
    finally:
        engine.close()


def _body(args, k: int, rng) -> dict:
    a, b = (int(x) for x in rng.integers(10, 100, size=2))
    body = {"model": args.model, "max_tokens": args.max_tokens, "temperature": 1.0, "seed": args.seed + k,
            "ignore_eos": True, "stream": not args.no_stream}
    if not args.no_stream:
        body["stream_options"] = {"include_usage": True}
    if args.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": f"{a}*{b}"}]
    else:
        body["prompt"] = f"{a}+{b}="
    return body


async def _one(client, url: str, body: dict) -> dict:
    """One request: its latency, time to first token and completion tokens (or its error)."""
    start = time.perf_counter()
    if not body["stream"]:
        r = await client.post(url, json=body)
        if r.status_code != 200:
            return {"error": f"HTTP {r.status_code}"}
        return {"latency": time.perf_counter() - start, "tokens": r.json()["usage"]["completion_tokens"]}
    first, tokens = None, None
    async with client.stream("POST", url, json=body) as r:
        if r.status_code != 200:
            return {"error": f"HTTP {r.status_code}"}
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if "error" in data:
                return {"error": data["error"].get("type", "stream error")}
            if first is None and any(c.get("text") or (c.get("delta") or {}).get("content") for c in data["choices"]):
                first = time.perf_counter() - start
            if data.get("usage"):
                tokens = data["usage"]["completion_tokens"]
    if tokens is None:
        return {"error": "stream ended without usage"}
    return {"latency": time.perf_counter() - start, "ttft": first, "tokens": tokens}


async def _drive(args, base: str) -> tuple[list[dict], float]:
    import asyncio

    import httpx
    import numpy as np

    url = f"{base}/v1/{'chat/completions' if args.endpoint == 'chat' else 'completions'}"
    rng = np.random.default_rng(args.seed)
    bodies = [_body(args, k, rng) for k in range(args.requests)]
    results: list[dict] = []
    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    async with httpx.AsyncClient(timeout=args.timeout, limits=limits) as client:
        for body in bodies[:2]:  # warm-up: first requests pay for lazy initialisation
            await _one(client, url, {**body, "max_tokens": 2})
        queue = list(reversed(bodies))

        async def worker() -> None:
            while queue:
                body = queue.pop()
                try:
                    results.append(await _one(client, url, body))
                except (httpx.HTTPError, ValueError, KeyError) as e:
                    results.append({"error": type(e).__name__})

        start = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(args.clients)])
        return results, time.perf_counter() - start


def _pct(values: list[float], q: float) -> float | None:
    import numpy as np

    return round(float(np.percentile(values, q)), 4) if values else None


def run(args: argparse.Namespace) -> int:
    import asyncio

    if args.abuse:
        from tokenflow.bench.serve_abuse import run as run_abuse

        logging.getLogger("httpx").setLevel(logging.WARNING)
        return run_abuse(args)
    if args.clients is None:
        args.clients = 8
    if args.clients < 1 or args.requests < 1 or args.max_tokens < 1:
        print("error: --clients, --requests and --max-tokens must be >= 1", file=sys.stderr)
        return 2
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request would bury the result
    server = _in_process_server(args) if args.in_process else subprocess_server(args)
    with server as base:
        logger.info("bench serve: %d requests from %d clients against %s", args.requests, args.clients, base)
        results, seconds = asyncio.run(_drive(args, base))
    ok = [r for r in results if "error" not in r]
    errors = [r["error"] for r in results if "error" in r]
    latencies = [r["latency"] for r in ok]
    ttfts = [r["ttft"] for r in ok if r.get("ttft") is not None]
    tokens = sum(r["tokens"] for r in ok)
    result = {
        "model": args.model, "endpoint": args.endpoint, "server": "in-process" if args.in_process else "subprocess",
        "stream": not args.no_stream, "clients": args.clients, "requests": args.requests,
        "max_tokens": args.max_tokens, "engine_threads": args.threads,
        "seconds": round(seconds, 3),
        "requests_per_s": round(len(ok) / seconds, 2),
        "completion_tokens_per_s": round(tokens / seconds, 1),
        "latency_p50_s": _pct(latencies, 50), "latency_p99_s": _pct(latencies, 99),
        "ttft_p50_s": _pct(ttfts, 50), "ttft_p99_s": _pct(ttfts, 99),
        "errors": len(errors), "error_kinds": sorted(set(errors)),
        "load_average": round(os.getloadavg()[0], 2),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>24}: {value}")
    return 0 if not errors else 1
