"""Sampling through the official SDK on the tiny default model: a snapshot saved after a step
samples tokens whose log-probs are the updated model's (teacher-forced in transformers, within
the derived float32 bound), every token carries the snapshot's policy version, prompt log-probs
are the model's, and a named snapshot survives on disk for a new sampling client."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.tinker.tinker_testlib import datums, logprob_bound, saved_state, sdk_datum, token_logprobs


def _trained(client):
    from tinker import types

    tc = client.create_lora_training_client(base_model="default", rank=4, seed=5).result()
    data = [sdk_datum(t, i) for t, i in datums(20, [12, 9], seed=41, rl=False)]
    for _ in range(2):
        tc.forward_backward(data, "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=0.05)).result()
    return tc


def _merged_reference(service, tc):
    from tests.tinker.tinker_testlib import reference_model
    from tokenflow.model_store.paths import resolve_model_path

    weights = saved_state(service[1], tc.save_state("ref").result().path)["weights"]
    return reference_model(resolve_model_path("default"), 4, weights).merge_and_unload().eval()


def test_a_snapshot_samples_with_the_updated_models_logprobs_and_its_version(service, client):
    from tinker import types

    tc = _trained(client)
    sampler = tc.save_weights_and_get_sampling_client().result()
    prompt = [3, 7, 11, 5, 9]
    res = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=4,
                         sampling_params=types.SamplingParams(max_tokens=8, temperature=1.0, seed=1)).result()
    ref = _merged_reference(service, tc)
    base = _base_reference()
    for seq in res.sequences:
        assert 1 <= len(seq.tokens) <= 8 and len(seq.logprobs) == len(seq.tokens)
        ids = prompt + list(seq.tokens)
        with torch.no_grad():
            lp, logits = token_logprobs(ref, ids[:-1], ids[1:])
            base_lp, _ = token_logprobs(base, ids[:-1], ids[1:])
        got = np.asarray(seq.logprobs)
        want = lp[len(prompt) - 1:].numpy()
        assert np.abs(got - want).max() <= logprob_bound(ref, logits)
        # ... and not the base model's: the snapshot holds the trained weights.
        assert np.abs(got - base_lp[len(prompt) - 1:].numpy()).max() > 10 * logprob_bound(ref, logits)

    # Every token carries the snapshot's policy version (the service's own record of the call).
    svc = service[1]
    model = svc.models[tc.model_id]
    snap = next(reversed(model.snapshots.values()))
    rid = svc.sample({"sampling_session_id": next(k for k, v in svc.sampling_sessions.items() if v[2] == snap.key),
                      "prompt": {"chunks": [{"type": "encoded_text", "tokens": prompt}]},
                      "num_samples": 2, "sampling_params": {"max_tokens": 4}})
    drawn = svc.futures.get(rid).result(timeout=60)
    assert snap.version >= 1
    assert all((v == snap.version).all() and v.size == len(s.tokens) for v, s in zip(drawn.versions, drawn.sequences))


def _base_reference():
    from transformers import AutoModelForCausalLM

    from tokenflow.model_store.paths import resolve_model_path

    return AutoModelForCausalLM.from_pretrained(resolve_model_path("default"), dtype=torch.float32).eval()


def test_compute_logprobs_and_top_k_are_the_models(client):
    from tinker import types

    sampler = client.create_sampling_client(base_model="default").result()
    ids = [4, 9, 2, 13, 6, 8, 17, 3, 10]
    lps = sampler.compute_logprobs(types.ModelInput.from_ints(ids)).result()
    base = _base_reference()
    with torch.no_grad():
        want, logits = token_logprobs(base, ids[:-1], ids[1:])
    assert lps[0] is None and len(lps) == len(ids)
    assert np.abs(np.asarray(lps[1:], dtype=np.float64) - want.numpy()).max() <= logprob_bound(base, logits)

    res = sampler.sample(types.ModelInput.from_ints(ids), num_samples=1, include_prompt_logprobs=True,
                         topk_prompt_logprobs=3, sampling_params=types.SamplingParams(max_tokens=1)).result()
    top = res.topk_prompt_logprobs
    full = torch.log_softmax(logits, -1)
    for t in range(1, len(ids)):
        order = full[t - 1].argsort(descending=True)[:3].tolist()
        assert [tok for tok, _ in top[t]][:1] == order[:1]
        assert abs(top[t][0][1] - full[t - 1, order[0]].item()) <= logprob_bound(base, logits)


def test_a_named_snapshot_is_on_disk_and_samples_in_a_new_client(service, client):
    from safetensors.torch import load_file
    from tinker import types

    from tokenflow.tinker import store

    tc = _trained(client)
    path = tc.save_weights_for_sampler("named-1").result().path
    assert path.endswith("/sampler_weights/named-1")
    folder = service[1].store.folder(store.parse(path))
    weights = load_file(str(folder / "model.safetensors"))
    assert "model.embed_tokens.weight" in weights and not any("lora" in k for k in weights)
    fresh = client.create_sampling_client(model_path=path).result()
    res = fresh.sample(types.ModelInput.from_ints([5, 6, 7]), num_samples=2,
                       sampling_params=types.SamplingParams(max_tokens=3)).result()
    assert [len(s.tokens) for s in res.sequences] == [3, 3] or all(s.stop_reason == "stop" for s in res.sequences)
    listed = service[1].checkpoints(tc.model_id)
    assert any(c["tinker_path"] == path and c["checkpoint_type"] == "sampler" for c in listed)


def test_at_most_three_snapshots_a_model_are_held_and_older_ones_say_so_or_come_back_from_disk(service, client):
    import tinker
    from tinker import types

    tc = _trained(client)
    named = tc.save_weights_for_sampler("kept-on-disk").result().path
    first = tc.save_weights_and_get_sampling_client().result()
    for _ in range(3):
        last = tc.save_weights_and_get_sampling_client().result()
    model = service[1].models[tc.model_id]
    assert len(model.snapshots) == 3 and named not in model.snapshots
    prompt, params = types.ModelInput.from_ints([5, 6, 7]), types.SamplingParams(max_tokens=2)
    assert len(last.sample(prompt, num_samples=1, sampling_params=params).result().sequences) == 1
    with pytest.raises(tinker.RequestFailedError) as info:
        first.sample(prompt, num_samples=1, sampling_params=params).result()
    assert "no longer held" in str(info.value) and "save the weights again" in str(info.value)
    again = client.create_sampling_client(model_path=named).result()  # read back from its checkpoint
    assert len(again.sample(prompt, num_samples=2, sampling_params=params).result().sequences) == 2
