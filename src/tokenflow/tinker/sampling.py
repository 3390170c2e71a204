"""Sampling for Tinker clients: one tokenflow engine per base model, snapshots as policy versions.

``save_weights_for_sampler`` takes a `Snapshot` of a training client's weights (LoRA merged in)
and gives it a policy version. A sampling client pins one snapshot (or the base model). Sample
requests queue here; one thread takes every waiting request, groups them by snapshot, loads the
group's weights into the engine (`RolloutEngine.update_weights`, the same call weight sync
makes during training) and generates the whole group in one batched ``engine.generate``. Each
token the engine samples carries the snapshot's version, which ``Sampled.versions`` reports.
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from tokenflow.tinker.errors import TinkerError, user_error
from tokenflow.tinker.wire import Sampled, Sequence

log = logging.getLogger(__name__)

BATCH_WINDOW_S = 0.02
"""How long the sampler waits after a request for more to batch with it (until none comes)."""


@dataclass
class Snapshot:
    """Weights a sampling client can pin: full ``tensors`` (Hugging Face names), or LoRA
    ``adapters`` (peft's names, a few MB) merged into the base weights when loaded, or neither:
    the base model as loaded."""

    key: str
    version: int
    tensors: dict | None = None
    adapters: dict | None = None
    scale: float = 1.0


BASE = Snapshot("base", 0, None)


@dataclass
class SampleCall:
    snapshot: Snapshot
    prompt: list[int]
    num_samples: int
    max_tokens: int
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    seed: int | None = None
    stop: object = None  # None | list[str] | list[int]
    prompt_logprobs: bool = False
    topk_prompt_logprobs: int = 0
    topk_sample_logprobs: int = 0
    prompt_logprobs_last_n: int | None = None
    future: Future = field(default_factory=Future)


class Sampler:
    """The engine of one base model and the thread that feeds it."""

    def __init__(self, folder: str, *, threads: int | None = None, max_num_seqs: int = 256, seed: int = 0,
                 dtype: str = "float32") -> None:
        from tokenflow.config.engine import EngineConfig
        from tokenflow.engine.factory import make_engine

        # float32 (the default): the sampler's log-probs are then the training model's (same
        # weights, same dtype) up to kernel order, so importance ratios start at 1.
        config = EngineConfig(dtype=dtype, device="cpu", threads=threads, max_num_seqs=max_num_seqs, seed=seed)
        self.engine = make_engine(folder, config)
        self.current = BASE.key
        self._base: dict | None = None
        self._queue: queue.Queue[SampleCall | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="tinker-sampler", daemon=True)
        self._thread.start()

    @property
    def vocab_size(self) -> int:
        return self.engine.vocab_size

    def submit(self, call: SampleCall) -> Future:
        self._check(call)
        self._queue.put(call)
        return call.future

    def _check(self, call: SampleCall) -> None:
        v = self.engine.vocab_size
        if not call.prompt:
            raise user_error("prompt is empty")
        bad = [t for t in call.prompt if not 0 <= t < v]
        if bad:
            raise user_error(f"prompt holds token id {bad[0]}, outside the vocabulary [0, {v})")
        if not 1 <= call.num_samples <= 1024:
            raise user_error(f"num_samples must be between 1 and 1024, got {call.num_samples}")
        room = self.engine.max_model_len - len(call.prompt)
        if call.max_tokens < 0 or call.max_tokens > room:
            raise user_error(f"sampling_params.max_tokens {call.max_tokens} does not fit: the prompt has "
                             f"{len(call.prompt)} tokens and the model takes {self.engine.max_model_len}")
        if not (call.temperature >= 0 and 0 < call.top_p <= 1):
            raise user_error("sampling_params: temperature must be ≥ 0 and top_p in (0, 1]")
        for name in ("topk_prompt_logprobs", "topk_sample_logprobs"):
            if not 0 <= getattr(call, name) <= 100:
                raise user_error(f"{name} must be between 0 and 100")

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)
        self.engine.close()

    # -- the thread ------------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            calls = [first]
            while True:
                # A client sends a step's requests one after another: wait a moment for the rest,
                # so that they share one batch instead of the first running alone.
                try:
                    nxt = self._queue.get(timeout=BATCH_WINDOW_S)
                except queue.Empty:
                    break
                if nxt is None:
                    self._queue.put(None)
                    break
                calls.append(nxt)
            groups: dict[str, list[SampleCall]] = {}
            for c in calls:
                groups.setdefault(c.snapshot.key, []).append(c)
            for group in groups.values():
                try:
                    self._run(group)
                except Exception as e:  # the engine failed: fail these calls, keep serving
                    log.exception("tinker sampler: a batch of %d requests failed", len(group))
                    err = e if isinstance(e, TinkerError) else TinkerError(f"sampling failed: {e}", category="server")
                    for c in group:
                        if not c.future.done():
                            c.future.set_exception(err)

    def _load(self, snap: Snapshot) -> None:
        if snap.key == self.current:
            return
        if self._base is None:  # keep the base weights once, to come back to them
            self._base = {k: v.clone() for k, v in self.engine.model.hf_views().items()}
        if snap.adapters is not None:
            tensors = merge_adapters(self._base, snap.adapters, snap.scale)
        else:
            tensors = self._base if snap.tensors is None else snap.tensors
        self.engine.update_weights(list(tensors.items()), snap.version)
        self.current = snap.key

    def _run(self, group: list[SampleCall]) -> None:
        self._load(group[0].snapshot)
        params = [self._params(c) for c in group]
        results = self.engine.generate([c.prompt for c in group], params)
        for c, rollouts in zip(group, results):
            if c.future.done():  # cancelled
                continue
            seqs = []
            for r in rollouts:
                top = None
                if c.topk_sample_logprobs and r.top_logprobs is not None:
                    top = (np.stack([t[0] for t in r.top_logprobs]) if r.top_logprobs else np.zeros((0, c.topk_sample_logprobs), np.int32),
                           np.stack([t[1] for t in r.top_logprobs]) if r.top_logprobs else np.zeros((0, c.topk_sample_logprobs), np.float32))
                seqs.append(Sequence(r.completion_ids.astype(np.int64), r.logprobs.astype(np.float32),
                                     "stop" if r.finish_reason == "stop" else "length", top))
            first = rollouts[0]
            out = Sampled(seqs, versions=[r.versions for r in rollouts])
            if c.prompt_logprobs and first.prompt_logprobs is not None:
                out.prompt_logprobs = first.prompt_logprobs.astype(np.float32)
                if c.topk_prompt_logprobs and first.prompt_top_ids is not None:
                    out.prompt_top = (first.prompt_top_ids, first.prompt_top_logprobs)
            c.future.set_result(out)

    def _params(self, c: SampleCall):
        from tokenflow.engine.sampling_params import SamplingParams

        stop, stop_ids, ignore_eos = (), (), False
        if c.stop is not None:
            items = [c.stop] if isinstance(c.stop, str) else list(c.stop)
            if not items:
                ignore_eos = True  # the SDK: [] disables every stop, EOS included
            elif all(isinstance(s, str) for s in items):
                stop = tuple(items)
            elif all(isinstance(s, int) for s in items):
                stop_ids = tuple(items)
            else:
                raise user_error("sampling_params.stop must be strings or token ids, not both")
        want_prompt = c.prompt_logprobs or c.topk_prompt_logprobs > 0
        return SamplingParams(
            temperature=c.temperature, top_p=c.top_p, top_k=max(c.top_k, 0), max_tokens=c.max_tokens,
            stop=stop, stop_token_ids=stop_ids, ignore_eos=ignore_eos, n=c.num_samples, seed=c.seed,
            logprobs=c.topk_sample_logprobs,
            prompt_logprobs=(c.topk_prompt_logprobs if want_prompt else None))


def sample_call(req: dict, snap: Snapshot) -> SampleCall:
    params = req.get("sampling_params") or {}
    chunks = (req.get("prompt") or {}).get("chunks") or []
    prompt: list[int] = []
    for j, c in enumerate(chunks):
        if not isinstance(c, dict) or c.get("type", "encoded_text") != "encoded_text":
            raise user_error(f"prompt.chunks[{j}]: only encoded_text chunks are supported")
        toks = c.get("tokens")
        if not isinstance(toks, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in toks):
            raise user_error(f"prompt.chunks[{j}].tokens must be a list of integer token ids")
        prompt.extend(toks)
    max_tokens = params.get("max_tokens")
    call = SampleCall(
        snapshot=snap, prompt=prompt, num_samples=int(req.get("num_samples", 1)),
        max_tokens=int(max_tokens) if max_tokens is not None else 128,
        temperature=float(params.get("temperature", 1.0)), top_k=int(params.get("top_k", -1)),
        top_p=float(params.get("top_p", 1.0)), seed=params.get("seed"), stop=params.get("stop"),
        prompt_logprobs=bool(req.get("prompt_logprobs")), topk_prompt_logprobs=int(req.get("topk_prompt_logprobs") or 0),
        topk_sample_logprobs=int(req.get("topk_sample_logprobs") or 0))
    last_n = req.get("prompt_logprobs_last_n")
    if last_n is not None and not (isinstance(last_n, int) and 1 <= last_n <= max(1, len(prompt) - 1)):
        raise user_error(f"prompt_logprobs_last_n must be between 1 and len(prompt) - 1, got {last_n}")
    call.prompt_logprobs_last_n = last_n
    for name in ("target_prompt_logprobs", "prompt_alt_tokens_k"):
        if req.get(name):
            raise user_error(f"{name} is not supported by tokenflow tinker")
    return call


def keep_last(fut: Future, n: int) -> Future:
    """Blank out prompt log-probs before the last ``n`` (the SDK's ``prompt_logprobs_last_n``)."""
    import numpy as np

    out: Future = Future()

    def done(f: Future) -> None:
        if f.exception() is not None:
            out.set_exception(f.exception())
            return
        r = f.result()
        if r.prompt_logprobs is not None:
            r.prompt_logprobs = r.prompt_logprobs.copy()
            r.prompt_logprobs[: len(r.prompt_logprobs) - n] = np.nan
        out.set_result(r)

    fut.add_done_callback(done)
    return out


def merge_adapters(base: dict, adapters: dict, scale: float) -> dict:
    """The base weights with each LoRA pair folded in: W + scale·B·A, under Hugging Face names
    (peft's ``base_model.model.X.lora_A.weight`` adapts ``X.weight``). Unadapted tensors are the
    base's own (not copied)."""
    out = dict(base)
    for key, a in adapters.items():
        if ".lora_A." not in key:
            continue
        b = adapters[key.replace(".lora_A.", ".lora_B.")]
        name = key.split(".lora_A.")[0].removeprefix("base_model.model.") + ".weight"
        if name not in base:
            raise KeyError(f"adapter {key} adapts {name}, which the engine's model does not have")
        w = base[name]
        out[name] = w + (scale * (b.to(w.dtype) @ a.to(w.dtype)))
    return out
