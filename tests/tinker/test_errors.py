"""Bad input through the official SDK (and, where the SDK cannot send it, as a hostile client
would over HTTP): each gets the SDK's user-error category with a message naming the field, the
model it was aimed at is unchanged, and the service keeps serving."""

from __future__ import annotations

import socket

import numpy as np
import pytest
import torch

from tests.tinker.tinker_testlib import datums, saved_state, sdk_datum


def _user_error(call, *words: str):
    import tinker

    with pytest.raises(tinker.RequestFailedError) as info:
        call()
    err = info.value
    assert str(getattr(err, "category", "")).lower().endswith("user"), err
    for w in words:
        assert w in str(err), (w, str(err))
    return err


@pytest.fixture(scope="module")
def tc(client):
    return client.create_lora_training_client(base_model="default", rank=4, seed=2).result()


def test_malformed_datums_and_unknown_losses_are_user_errors_and_change_nothing(service, tc):
    from tinker import types

    before = saved_state(service[1], tc.save_state("before").result().path)["weights"]
    (tokens, inputs), = datums(20, [8], seed=1, rl=False)
    past = dict(inputs, target_tokens=np.where(np.arange(8) == 4, 20, inputs["target_tokens"]))
    _user_error(lambda: tc.forward_backward([sdk_datum(tokens, past)], "cross_entropy").result(),
                "target_tokens", "token id 20", "vocabulary")
    short = dict(inputs, weights=inputs["weights"][:5])
    _user_error(lambda: tc.forward_backward([sdk_datum(tokens, short)], "cross_entropy").result(),
                "weights", "shape")
    _user_error(lambda: tc.forward_backward([sdk_datum(tokens, inputs)], "ppo").result(),
                "lacks", "advantages")
    (rl_tokens, rl_inputs), = datums(20, [8], seed=2, rl=True)
    rl_inputs["logprobs"] = np.zeros(8, np.float32)
    _user_error(lambda: tc.forward_backward([sdk_datum(rl_tokens, rl_inputs)], "gspo").result(),
                "gspo", "not supported")
    _user_error(lambda: tc.forward_backward([sdk_datum(rl_tokens, rl_inputs)], "ppo",
                                            loss_fn_config={"clip_epsilon": 0.2}).result(), "clip_epsilon")
    rl_inputs["advantages"][2] = np.nan
    _user_error(lambda: tc.forward_backward([sdk_datum(rl_tokens, rl_inputs)], "importance_sampling").result(),
                "advantages", "NaN")
    _user_error(lambda: tc.optim_step(types.AdamParams(learning_rate=-1.0)).result(), "learning_rate")
    after = saved_state(service[1], tc.save_state("after").result().path)["weights"]
    assert all(torch.equal(before[k], after[k]) for k in before)  # nothing reached the model
    good = tc.forward_backward([sdk_datum(tokens, inputs)], "cross_entropy").result()  # still serving
    assert np.isfinite(good.metrics["loss:sum"])


def test_unknown_models_paths_and_names_are_user_errors(service, client, tc):
    _user_error(lambda: client.create_lora_training_client(base_model="no-such-model", rank=4).result(),
                "base_model", "no-such-model")
    _user_error(lambda: client.create_lora_training_client(base_model="default", rank=0).result(), "rank")
    _user_error(lambda: tc.save_state("../../escape").result(), "not allowed")
    _user_error(lambda: tc.save_weights_for_sampler(".hidden").result(), "not allowed")
    for path in ("tinker://../weights/x", "file:///etc/passwd", f"tinker://{tc.model_id}/weights/../../x",
                 f"tinker://{tc.model_id}/weights/never-saved"):
        with pytest.raises(Exception) as info:
            client.create_sampling_client(model_path=path).result()
        assert "tinker://" in str(info.value) or "not allowed" in str(info.value) or "no checkpoint" in str(info.value)
    root = service[1].store.root
    assert not (root.parent / "escape").exists() and [p for p in root.rglob("*") if p.is_symlink()] == []


def test_out_of_order_and_repeated_sequence_ids_from_a_raw_client(service, tc):
    import httpx

    url = service[0]
    headers = {"X-API-Key": "tml-test"}
    model = service[1].models[tc.model_id]
    with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
        ahead = model.last_seq + 10
        body = {"model_id": tc.model_id, "seq_id": ahead, "adam_params": {"learning_rate": 0.0}}
        first = http.post("/api/v1/optim_step", json=body).json()["request_id"]
        again = http.post("/api/v1/optim_step", json=body).json()["request_id"]
        assert again == first  # a retried call is the same call
        late = http.post("/api/v1/optim_step", json=dict(body, seq_id=ahead - 1)).json()["request_id"]
        answer = http.post("/api/v1/retrieve_future", json={"request_id": late}).json()
        assert answer["category"] == "user" and "out of order" in answer["error"], answer
        assert "error" not in http.post("/api/v1/retrieve_future", json={"request_id": first}).json()

        bad = http.post("/api/v1/forward_backward", content=b"\xff\x00garbage",
                        headers={"Content-Type": "application/x-protobuf"})
        assert bad.status_code == 400 and bad.json()["category"] == "user"
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as raw:  # a head that promises 1 TB
            raw.sendall(b"POST /api/v1/create_session HTTP/1.1\r\nHost: x\r\nX-API-Key: tml-test\r\n"
                        b"Content-Type: application/json\r\nContent-Length: 1099511627776\r\n\r\n{}")
            assert raw.recv(4096).split(b"\r\n", 1)[0].endswith(b"413 Request Entity Too Large")
        missing = http.post("/api/v1/retrieve_future", json={"request_id": "req-999999"})
        assert missing.status_code == 404 and missing.json()["category"] == "user"
        other = http.post("/api/v1/get_info", json={"model_id": "session-x:train:0"})
        assert other.status_code == 400 and "unknown model_id" in other.json()["error"]
        assert http.get("/api/v1/healthz").json() == {"status": "ok"}


def test_a_key_is_required_when_the_service_has_one(tmp_path, monkeypatch):
    import httpx
    import tinker

    from tokenflow.serve.server import BackgroundServer
    from tokenflow.tinker.app import create_app
    from tokenflow.tinker.service import Settings, TinkerService

    svc = TinkerService(Settings(root=str(tmp_path)))
    with BackgroundServer(create_app(svc, api_key="tml-secret")) as server:
        assert httpx.post(f"{server.url}/api/v1/create_session", json={}).status_code == 401
        wrong = httpx.post(f"{server.url}/api/v1/create_session", json={}, headers={"X-API-Key": "tml-guess"})
        assert wrong.status_code == 401
        assert httpx.get(f"{server.url}/api/v1/healthz").status_code == 200
        monkeypatch.setenv("TINKER_API_KEY", "tml-secret")
        with tinker.ServiceClient(base_url=server.url) as sc:
            caps = sc.get_server_capabilities()
            assert any(m.model_name == "default" for m in caps.supported_models)
    svc.close()


def test_a_session_that_stops_beating_is_finished_and_its_models_unloaded(tmp_path):
    import httpx

    from tokenflow.serve.server import BackgroundServer
    from tokenflow.tinker.app import create_app
    from tokenflow.tinker.service import Settings, TinkerService

    # The dead client's silence is made by moving its last heartbeat back past the timeout, not by
    # sleeping past a short one: with a 1 s timeout, a model load on a loaded machine (CI) took
    # longer than that and the live session expired too.
    svc = TinkerService(Settings(root=str(tmp_path), session_timeout_s=600.0, max_models=1))
    with BackgroundServer(create_app(svc)) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        gone = http.post("/api/v1/create_session", json={}).json()["session_id"]  # a client that dies
        rid = http.post("/api/v1/create_model", json={"session_id": gone, "base_model": "default",
                                                      "lora_config": {"rank": 2}}).json()["request_id"]
        model_id = http.post("/api/v1/retrieve_future", json={"request_id": rid}).json()["model_id"]
        assert http.post("/api/v1/session_heartbeat", json={"session_id": gone}).status_code == 200
        svc.sessions[gone]["seen"] -= 601.0  # its last word, 601 s ago
        alive = http.post("/api/v1/create_session", json={}).json()["session_id"]  # sweeps the dead one
        rid = http.post("/api/v1/create_model", json={"session_id": alive, "base_model": "default",
                                                      "lora_config": {"rank": 2}}).json()["request_id"]
        assert "model_id" in http.post("/api/v1/retrieve_future", json={"request_id": rid}).json()  # the slot is free
        assert model_id not in svc.models
        assert http.post("/api/v1/session_heartbeat", json={"session_id": gone}).status_code == 410
        assert http.post("/api/v1/session_heartbeat", json={"session_id": alive}).status_code == 200
    svc.close()


def test_a_model_that_would_not_fit_is_refused_before_it_loads(service, client, monkeypatch):
    monkeypatch.setenv("TOKENFLOW_MEMORY_AVAILABLE_GB", "0.05")  # the figure available_bytes() reads first
    held = set(service[1].models)
    err = _user_error(lambda: client.create_lora_training_client(base_model="default", rank=4).result(),
                      "needs about", "--micro-batch-tokens", "0.05 GB is available")
    assert set(service[1].models) == held, err  # nothing was loaded
    monkeypatch.setenv("TOKENFLOW_MEMORY_AVAILABLE_GB", "64")
    assert client.create_lora_training_client(base_model="default", rank=4).result().model_id


def test_a_finished_sessions_slot_is_free_at_once_though_its_unload_waits_for_the_training_thread(tmp_path):
    """With --max-models 1, a model of a session that has finished no longer counts, even while
    its unload still waits behind other work on the training thread (CI's loaded machine once
    refused the next client here)."""
    import threading

    from tokenflow.tinker.service import Settings, TinkerService

    svc = TinkerService(Settings(root=str(tmp_path), max_models=1))
    try:
        gone, alive = svc.create_session(None), svc.create_session(None)
        svc.futures.get(svc.create_model(gone, "default", None)).result(timeout=120)
        release = threading.Event()
        svc._train.submit(release.wait, 60)  # the training thread is busy: the unload must queue
        svc.finish_session(gone)
        rid = svc.create_model(alive, "default", None)  # refused while the old model still counted
        release.set()
        assert svc.futures.get(rid).result(timeout=120)
        assert list(svc.models) == [f"{alive}:train:0"]
    finally:
        release.set()
        svc.close()
