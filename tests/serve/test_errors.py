"""Errors come back with OpenAI's status codes and shape, ``{"error": {"message", "type",
"param", "code"}}``, as the official client's exception types; nothing answers a 500 with a
traceback."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.serve.serve_testlib import served, sync_client

pytestmark = pytest.mark.timeout(120)

USER = [{"role": "user", "content": "1+1="}]


@pytest.fixture(scope="module")
def server():
    with served("default") as s:
        yield s


@pytest.fixture(scope="module")
def keyed():
    with served("default-tool", api_key="sk-test-key", model_name="tool") as s:
        yield s


def _shape(body: dict) -> dict:
    """The error object, after checking it has exactly OpenAI's four keys."""
    error = body["error"] if "error" in body else body  # the client hands over the inner object
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert "Traceback" not in error["message"]
    return error


def test_an_unknown_model_is_a_404(server):
    with pytest.raises(openai.NotFoundError) as e:
        sync_client(server).completions.create(model="gpt-4o", prompt="1+1=", max_tokens=2)
    error = _shape(e.value.body)
    assert e.value.status_code == 404 and error["code"] == "model_not_found" and error["param"] == "model"
    with pytest.raises(openai.NotFoundError):
        sync_client(server).models.retrieve("gpt-4o")


@pytest.mark.parametrize("body,param,code", [
    ({"model": "default"}, "prompt", "missing_required_parameter"),
    ({"prompt": "1", "temperature": "hot"}, "temperature", "invalid_type"),
    ({"prompt": "1", "n": 0}, "n", "invalid_value"),
    ({"prompt": "1", "top_p": 0}, "top_p", "invalid_value"),
    ({"prompt": "1", "logprobs": 99}, "logprobs", "invalid_value"),
    ({"prompt": "1", "max_tokens": -3}, "max_tokens", "invalid_value"),
    ({"prompt": [1, "x"]}, "prompt", None),
    ({"prompt": "1", "presence_penalty": 1.0}, "presence_penalty", None),
    ({"prompt": "1", "stop": [""]}, "stop", None),
    ({"prompt": [[1, 2], []]}, "prompt", None),
])
def test_a_malformed_completion_body_is_a_400(server, body, param, code):
    with pytest.raises(openai.BadRequestError) as e:  # sent as it is: the client checks some fields itself
        sync_client(server).post("/completions", body={"model": "default", **body}, cast_to=object)
    error = _shape(e.value.body)
    assert e.value.status_code == 400 and error["type"] == "invalid_request_error"
    assert error["param"] == param or (error["param"] or "").startswith(param), error
    if code:
        assert error["code"] == code, error


@pytest.mark.parametrize("messages,param", [
    ([], "messages"), ([{"role": "wizard", "content": "x"}], "messages[0].role"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "messages[0].content"),
])
def test_a_malformed_chat_body_is_a_400(keyed, messages, param):
    with pytest.raises(openai.BadRequestError) as e:
        sync_client(keyed, "sk-test-key").chat.completions.create(model="tool", messages=messages)
    assert _shape(e.value.body)["param"].startswith(param)


def test_bodies_that_are_not_json_objects_are_a_400(server):
    for content in (b"{not json", b"[1, 2]", b"", b'"text"'):
        r = httpx.post(server.base_url + "/completions", content=content,
                       headers={"Content-Type": "application/json"}, timeout=10)
        assert r.status_code == 400, (content, r.text)
        assert _shape(r.json())["type"] == "invalid_request_error"


def test_unknown_routes_and_methods_answer_in_the_error_shape(server):
    r = httpx.get(server.base_url + "/engines", timeout=10)
    assert r.status_code == 404 and _shape(r.json())["code"] == "unknown_url"
    r = httpx.get(server.base_url + "/completions", timeout=10)
    assert r.status_code == 405 and _shape(r.json())["code"] == "method_not_allowed"


def test_chat_on_a_model_without_a_chat_template_is_a_400(server):
    with pytest.raises(openai.BadRequestError) as e:
        sync_client(server).chat.completions.create(model="default", messages=USER)
    assert "chat template" in _shape(e.value.body)["message"]


def test_a_prompt_longer_than_the_context_is_a_400(server):
    with pytest.raises(openai.BadRequestError) as e:
        sync_client(server).completions.create(model="default", prompt=[4] * server.engine.max_model_len)
    error = _shape(e.value.body)
    assert error["code"] == "context_length_exceeded" and str(server.engine.max_model_len) in error["message"]
    # max_tokens past the context is cut to what is left, not refused
    r = sync_client(server).completions.create(model="default", prompt=[4] * 250, max_tokens=100,
                                               extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == server.engine.max_model_len - 250


def test_the_api_key_is_enforced(keyed):
    with pytest.raises(openai.AuthenticationError) as e:
        sync_client(keyed, "sk-wrong").chat.completions.create(model="tool", messages=USER, max_tokens=2)
    assert e.value.status_code == 401 and _shape(e.value.body)["code"] == "invalid_api_key"
    r = httpx.post(keyed.base_url + "/chat/completions", content=b"{not json", timeout=10)  # no key at all
    assert r.status_code == 401 and _shape(r.json())["code"] == "invalid_api_key"  # before the body is read
    assert sync_client(keyed, "sk-test-key").chat.completions.create(model="tool", messages=USER, max_tokens=2).choices
    assert httpx.get(keyed.url + "/health", timeout=10).status_code == 200  # open paths stay open


def test_a_closing_server_answers_503(server):
    service = server.app.state.service
    service.closing = True
    try:
        with pytest.raises(openai.InternalServerError) as e:
            sync_client(server).completions.create(model="default", prompt="1+1=", max_tokens=2)
        assert e.value.status_code == 503 and _shape(e.value.body)["type"] == "service_unavailable"
        assert httpx.get(server.url + "/health", timeout=10).status_code == 503
    finally:
        service.closing = False


def test_a_bug_is_a_500_without_internals(server, monkeypatch):
    def broken():
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(server.app.state.service, "models", broken)
    r = httpx.get(server.base_url + "/models", timeout=10)
    assert r.status_code == 500
    error = _shape(r.json())
    assert error["type"] == "server_error" and "secret" not in r.text and "RuntimeError" not in r.text
