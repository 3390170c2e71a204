"""Both encodings the SDKs use: ``forward_backward`` as JSON (older SDKs) gives the same answer
as the SDK 0.38's protobuf, in JSON when protobuf is not asked for; and two clients on one base
model sample each from its own snapshot, whatever the other loaded into the shared engine."""

from __future__ import annotations

import numpy as np

from tests.tinker.tinker_testlib import datums, sdk_datum


def test_json_forward_backward_matches_the_sdks_protobuf(service, client):
    import httpx

    tc = client.create_lora_training_client(base_model="default", rank=4, seed=9).result()
    data = datums(20, [7, 10], seed=51, rl=False)
    via_sdk = tc.forward([sdk_datum(t, i) for t, i in data], "cross_entropy").result()

    def td(a: np.ndarray) -> dict:
        return {"data": a.tolist(), "dtype": "int64" if a.dtype.kind == "i" else "float32", "shape": list(a.shape)}

    body = {"model_id": tc.model_id, "forward_backward_input": {"loss_fn": "cross_entropy", "data": [
        {"model_input": {"chunks": [{"type": "encoded_text", "tokens": t.tolist()}]},
         "loss_fn_inputs": {k: td(v) for k, v in i.items()}} for t, i in data]}}
    with httpx.Client(base_url=service[0], headers={"X-API-Key": "tml-test"}, timeout=60) as http:
        rid = http.post("/api/v1/forward", json=body).json()["request_id"]
        answer = http.post("/api/v1/retrieve_future", json={"request_id": rid})
    assert answer.headers["content-type"].startswith("application/json")
    out = answer.json()
    assert out["loss_fn_output_type"] == "ArrayRecord"
    assert abs(out["metrics"]["loss:sum"] - via_sdk.metrics["loss:sum"]) <= 1e-6 * abs(via_sdk.metrics["loss:sum"])
    for got, want in zip(out["loss_fn_outputs"], via_sdk.loss_fn_outputs):
        assert got["logprobs"]["shape"] == list(want["logprobs"].shape)
        assert np.array_equal(np.asarray(got["logprobs"]["data"], np.float32), want["logprobs"].to_numpy())


def test_two_clients_on_one_base_each_sample_their_own_snapshot(client):
    from tinker import types

    prompt = types.ModelInput.from_ints([3, 4, 5, 6])
    params = types.SamplingParams(max_tokens=1, temperature=1.0)
    answers = {}
    samplers = {}
    for name, target in (("a", 7), ("b", 12)):  # each learns to follow the prompt with its own token
        tc = client.create_lora_training_client(base_model="default", rank=4, seed=1).result()
        datum = sdk_datum(np.array([3, 4, 5, 6]), {"target_tokens": np.array([4, 5, 6, target]),
                                                   "weights": np.array([0, 0, 0, 1], np.float32)})
        for _ in range(15):
            tc.forward_backward([datum], "cross_entropy").result()
            tc.optim_step(types.AdamParams(learning_rate=0.05)).result()
        samplers[name] = tc.save_weights_and_get_sampling_client().result()
    for name in ("a", "b", "a", "b"):  # the engine swaps between the two snapshots
        lps = samplers[name].compute_logprobs(types.ModelInput.from_ints([3, 4, 5, 6, 7])).result()
        res = samplers[name].sample(prompt, num_samples=8, sampling_params=params).result()
        answers.setdefault(name, []).append(([s.tokens[0] for s in res.sequences], lps[-1]))
    for (tokens_a, lp_a), (tokens_b, lp_b) in zip(answers["a"], answers["b"]):
        assert tokens_a.count(7) >= 6 and tokens_b.count(12) >= 6
        assert lp_a > -0.5 > lp_b  # token 7 after the prompt: a's, not b's
    assert answers["a"][0][1] == answers["a"][1][1]  # the same snapshot, the same weights
