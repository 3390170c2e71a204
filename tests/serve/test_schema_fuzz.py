"""A schema fuzz of the server (schemathesis against its own OpenAPI document, loopback only):
positive and negative requests for every operation, at most 50 of each and 120 s in all, with
0 server errors and every answer as the document declares it. `python -m
tokenflow.bench.serve_fuzz` runs the same fuzz with other bounds."""

from __future__ import annotations

import pytest
# Imported here, at collection, while this process runs no other thread: pytest rewrites
# schemathesis's modules as it imports them, and on CPython 3.11 a parse that another thread's
# parse interleaves with can fail (see tokenflow.envs.tool_calls._parse_expression).
import schemathesis.specs.openapi.schemas  # noqa: F401

from tokenflow.bench.serve_fuzz import fuzz
from tokenflow.engine import EngineConfig
from tokenflow.engine.factory import make_engine
from tokenflow.model_store import resolve_model_path
from tokenflow.serve.app import create_app
from tokenflow.serve.server import BackgroundServer

pytestmark = pytest.mark.timeout(180)
# Seconds of fuzzing at most (it takes ~6 s on an idle 2-core machine), leaving the rest of the
# 180 s timeout to the engine's start. Cases past the budget are skipped and counted.
FUZZ_BUDGET_S = 120
MIN_CHECKED = 10  # per generation endpoint and mode, however slow the machine


@pytest.mark.slow
def test_the_openapi_document_survives_a_bounded_fuzz():
    engine = make_engine(resolve_model_path("default-tool"),
                         EngineConfig(device="cpu", threads=1, max_num_seqs=8, max_model_len=96, seed=0))
    try:
        with BackgroundServer(create_app(engine, "default-tool")) as server:
            result = fuzz(server.url, max_examples=50, max_time_s=FUZZ_BUDGET_S, seed=0)
    finally:
        engine.close()
    figures = {k: v for k, v in result.items() if k != "runs"}
    print(figures)
    # The figures go in the message: a failure under load must say which check, case and status.
    assert result["failure_details"] == [] and result["server_errors"] == 0, figures
    assert result["operations"] == 10, figures  # 5 OpenAI, 2 token-in, 3 tokenizer routes
    # The budget bounds the test's time, not its verdict: a loaded machine that runs out of it
    # skips the rest (counted), and what ran is checked in full. Enough must still run.
    ran = {(r["operation"], r["mode"]): r["examples"] + r["skipped"] for r in result["runs"]}
    checked = {(r["operation"], r["mode"]): r["examples"] for r in result["runs"]}
    for op in ("POST /v1/chat/completions", "POST /v1/completions"):
        assert ran[(op, "positive")] == ran[(op, "negative")] == 50, figures  # every case was generated
        assert min(checked[(op, "positive")], checked[(op, "negative")]) >= MIN_CHECKED, figures
    assert result["statuses"].get("200", 0) > 20  # requests got through to the engine, not only refusals
