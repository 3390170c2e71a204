"""The commands: `tokenflow serve` in its own process (API key from the environment, SIGTERM
stops it cleanly), `tokenflow bench serve --json`, and a model that is not there."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tokenflow.bench.serve_process import free_port

pytestmark = pytest.mark.timeout(180)


def _tokenflow(*args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, **kw.pop("env", {})}
    return subprocess.Popen([sys.executable, "-m", "tokenflow.cli.main", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


@pytest.mark.slow
def test_serve_takes_its_key_from_the_environment_and_stops_on_sigterm():
    port = free_port()
    proc = _tokenflow("serve", "default", "--port", str(port), "--threads", "1", "--model-name", "tiny",
                      env={"TOKENFLOW_API_KEY": "sk-env"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)
        body = {"model": "tiny", "prompt": "1+1=", "max_tokens": 3}
        assert httpx.post(url + "/v1/completions", json=body, timeout=30).status_code == 401
        r = httpx.post(url + "/v1/completions", json=body, headers={"Authorization": "Bearer sk-env"}, timeout=30)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        assert httpx.get(url + "/v1/models", headers={"Authorization": "Bearer sk-env"},
                         timeout=10).json()["data"][0]["id"] == "tiny"
        proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal: the exit status says SIGTERM.
        assert proc.wait(30) in (0, -signal.SIGTERM)
        log = proc.stdout.read()
        assert "Application shutdown complete" in log and "Traceback" not in log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_serve_stops_within_its_timeout_with_calls_in_flight_and_logs_no_error():
    """SIGTERM with 40 long calls in flight (whole and streamed, 8 samples of 250 tokens each):
    the server is gone within --serve.shutdown_timeout_s (3 s, plus a second for the process to
    exit), every call got an answer (a 503, or a stream that ends with an error event), and the
    log has no traceback and no error (no task cancelled by uvicorn's deadline)."""
    import asyncio

    port = free_port()
    proc = _tokenflow("serve", "default", "--port", str(port), "--threads", "1", "--engine.device", "cpu",
                      "--serve.shutdown_timeout_s", "3")
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)

        async def calls() -> tuple[list, float]:
            async with httpx.AsyncClient(timeout=30) as client:
                async def one(k: int):
                    body = {"prompt": [4, 5, 6], "max_tokens": 250, "ignore_eos": True, "n": 8, "stream": k % 2 == 0}
                    r = await client.post(url + "/v1/completions", json=body)
                    return r.status_code, r.text

                tasks = [asyncio.ensure_future(one(k)) for k in range(40)]
                while (await client.get(url + "/health")).json()["engine_requests"] < 40:
                    await asyncio.sleep(0.05)
                start = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                answers = await asyncio.gather(*tasks)
                await asyncio.to_thread(proc.wait, 30)
                return answers, time.monotonic() - start

        answers, took = asyncio.run(calls())
        assert took < 3 + 1.0, took
        for status, text in answers:
            assert status == 503 or (status == 200 and "service_unavailable" in text and text.rstrip().endswith("[DONE]"))
        log = proc.stdout.read()
        assert "Traceback" not in log and " ERROR " not in log and "Application shutdown complete" in log, log[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_bench_serve_prints_one_json_object():
    proc = _tokenflow("bench", "serve", "--in-process", "--clients", "2", "--requests", "6", "--max-tokens", "4",
                      "--json")
    out, _ = proc.communicate(timeout=150)
    assert proc.returncode == 0, out
    result = json.loads(out.strip().splitlines()[-1])
    assert result["errors"] == 0 and result["requests"] == 6 and result["completion_tokens_per_s"] > 0
    assert 0 < result["ttft_p50_s"] <= result["latency_p50_s"] <= result["latency_p99_s"]


@pytest.mark.slow
def test_bench_serve_abuse_prints_one_json_object():
    """A small abuse run: the report's shape and the goals that do not depend on the machine's
    speed (no 5xx, every oversized body refused, nothing left in flight, a clean stop, the peak
    memory within its bound); the /health latency goal is the full benchmark's."""
    proc = _tokenflow("bench", "serve", "--abuse", "--clients", "20", "--oversized", "4", "--disconnects", "4",
                      "--slow-headers", "10", "--slow-bodies", "10", "--duration", "3", "--json")
    out, _ = proc.communicate(timeout=150)
    assert proc.returncode in (0, 1), out
    result = json.loads(out.strip().splitlines()[-1])
    goals = result["goals"]
    assert goals["no_5xx"] and goals["nothing_left_in_flight"] and goals["clean_stop"] and goals["rss_within_bound"], result
    oversized = sum(n for k, n in result["events"].items() if k.startswith("oversized_"))
    assert result["five_xx"] == 0 and oversized == 4 and result["events"].get("oversized_declared_413") == 2
    assert result["health_probes"] > 0 and result["health_p99_ms"] is not None
    assert result["rss_base_mib"] <= result["rss_peak_mib"] <= result["rss_bound_mib"]
    # the slow clients (3 s: within the server's deadlines) held no request of the clients back
    slow = sum(n for k, n in result["events"].items() if k.startswith(("slow_head_", "slow_body_")))
    assert slow >= 20 and result["legit_failed"] == 0 and result["legit_served"] > 0, result


def test_serve_names_a_model_that_is_not_there(tmp_path):
    proc = _tokenflow("serve", str(tmp_path / "nothing"))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "not a model folder" in out and "Traceback" not in out


def test_engine_settings_come_from_the_run_then_the_overrides(tmp_path):
    from tokenflow.cli.serve import engine_config
    from tokenflow.config.loading import ConfigError

    dry = subprocess.run([sys.executable, "-m", "tokenflow.cli.main", "train", "--dry-run", "--engine.max_num_seqs",
                          "48"], capture_output=True, text=True, timeout=120, check=True)
    (tmp_path / "config.toml").write_text(dry.stdout)
    cfg = engine_config(tmp_path, ["--engine.threads", "2"])
    assert (cfg.max_num_seqs, cfg.threads, cfg.device) == (48, 2, "cpu")  # the run's, then the override
    assert engine_config(None, []).device == "auto"  # a model folder: the engine's defaults
    with pytest.raises(ConfigError, match="only --engine"):
        engine_config(None, ["--sampling.temperature", "0.5"])
