"""A schema fuzz of `tokenflow serve`: schemathesis against the server's own OpenAPI document.

    python -m tokenflow.bench.serve_fuzz [--model default-tool] [--max-examples 50] [--max-time 240] [--json]

The server runs in this process on a free loopback port (nothing else is reached). For every
operation in ``/openapi.json``, schemathesis generates requests that fit the document
(positive) and requests that do not (negative), at most ``--max-examples`` of each, and every
answer is checked: no 5xx, a status code, content type, headers and body the document declares
for it, and negative requests refused with a 4xx. ``--max-time`` bounds the whole run (cases
left when it runs out are counted as skipped). Needs the ``test`` extra (schemathesis).

Prints the operations, the examples sent, the status codes seen and every failure, or one JSON
object with ``--json``; the exit status is 1 if anything failed.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import sys
import time

logger = logging.getLogger(__name__)

CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_headers_conformance", "response_schema_conformance", "negative_data_rejection")
"""schemathesis's response checks that apply to any API. Left out: ``positive_data_acceptance``
(a request that fits the schema may still be refused: a prompt longer than the context, ``n``
above the engine's slots, a penalty the server does not support) and the stateful checks (the
API creates no resources)."""


def fuzz(base_url: str, *, max_examples: int = 50, max_time_s: float = 240.0, seed: int = 0,
         request_timeout_s: float = 60.0) -> dict:
    """Fuzz the server at ``base_url``; returns the figures (see the module docstring)."""
    import schemathesis
    from schemathesis import checks as st_checks
    from schemathesis.generation.modes import GenerationMode

    checks = [getattr(st_checks, name) for name in CHECKS]
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    deadline = time.monotonic() + max_time_s
    start = time.monotonic()
    operations, failures = [], []
    statuses: collections.Counter = collections.Counter()
    for result in schema.get_all_operations():
        op = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            counts = {"operation": op.label, "mode": mode.value, "examples": 0, "skipped": 0, "failures": 0}
            operations.append(counts)
            _run(op, mode, counts, failures, statuses, base_url=base_url, checks=checks, deadline=deadline,
                 max_examples=max_examples, seed=seed, request_timeout_s=request_timeout_s)
    return {
        "operations": len({o["operation"] for o in operations}),
        "runs": operations,
        "examples": sum(o["examples"] for o in operations),
        "skipped_for_time": sum(o["skipped"] for o in operations),
        "failures": len(failures),
        "server_errors": sum(n for code, n in statuses.items() if code >= 500),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "seconds": round(time.monotonic() - start, 1),
        "max_examples": max_examples,
        "checks": list(CHECKS),
        "failure_details": failures,
    }


def _run(op, mode, counts: dict, failures: list, statuses, *, base_url: str, checks, deadline: float,
         max_examples: int, seed: int, request_timeout_s: float) -> None:
    """Up to ``max_examples`` cases of one operation in one generation mode."""
    import hypothesis

    @hypothesis.settings(max_examples=max_examples, deadline=None, database=None, phases=[hypothesis.Phase.generate],
                         print_blob=False, suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.seed(seed)
    @hypothesis.given(case=op.as_strategy(generation_mode=mode))
    def one(case):
        if time.monotonic() > deadline:
            counts["skipped"] += 1
            return
        counts["examples"] += 1
        try:
            response = case.call(base_url=base_url, timeout=request_timeout_s)
        except (Exception, BaseExceptionGroup) as e:  # noqa: BLE001 - a dropped connection is a finding too
            counts["failures"] += 1
            failures.append({"operation": op.label, "mode": mode.value, "check": "request",
                             "detail": f"{type(e).__name__}: {e}"[:500]})
            return
        statuses[response.status_code] += 1
        try:
            case.validate_response(response, checks=checks)
        except (Exception, BaseExceptionGroup) as e:  # noqa: BLE001 - schemathesis's FailureGroup, check errors
            counts["failures"] += 1
            failures.append({"operation": op.label, "mode": mode.value, "status": response.status_code,
                             "detail": str(e)[:1500]})

    try:
        one()
    except hypothesis.errors.Unsatisfiable:  # nothing to negate (an operation without parameters)
        counts["unsatisfiable"] = True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tokenflow.bench.serve_fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="default-tool", help="the model to serve (default-tool has a chat template)")
    p.add_argument("--max-examples", type=int, default=50, help="per operation and generation mode")
    p.add_argument("--max-time", type=float, default=240.0, help="seconds for the whole fuzz")
    p.add_argument("--max-num-seqs", type=int, default=8, help="engine slots (bounds the n a request may ask)")
    p.add_argument("--max-model-len", type=int, default=96,
                   help="the engine's context (bounds each sample's tokens, so that a run stays short)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        import schemathesis  # noqa: F401
    except ImportError:
        print('error: the schema fuzz needs schemathesis: pip install "tokenflow-rl[test]"', file=sys.stderr)
        return 2
    from tokenflow.engine import EngineConfig
    from tokenflow.engine.factory import make_engine
    from tokenflow.model_store import resolve_model_path
    from tokenflow.serve.app import create_app
    from tokenflow.serve.server import BackgroundServer

    engine = make_engine(resolve_model_path(args.model),
                         EngineConfig(device="cpu", threads=1, max_num_seqs=args.max_num_seqs,
                                      max_model_len=args.max_model_len, seed=args.seed))
    try:
        with BackgroundServer(create_app(engine, args.model)) as server:
            result = fuzz(server.url, max_examples=args.max_examples, max_time_s=args.max_time, seed=args.seed)
    finally:
        engine.close()
    if args.json:
        print(json.dumps(result))
    else:
        for run in result["runs"]:
            print(f"{run['operation']:>28} {run['mode']:>8}: {run['examples']:4d} examples, "
                  f"{run['skipped']} skipped, {run['failures']} failures")
        print(f"operations {result['operations']}, examples {result['examples']}, failures {result['failures']}, "
              f"server errors {result['server_errors']}, statuses {result['statuses']}, {result['seconds']} s")
        for f in result["failure_details"]:
            print(f"\n--- {f['operation']} ({f['mode']}):\n{f['detail']}")
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
