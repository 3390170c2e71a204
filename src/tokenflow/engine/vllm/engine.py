"""`VLLMEngine`: vLLM behind the `RolloutEngine` seam, in the engine worker's own process.

::

    add_request ─► validate (the seam's rules, `plan_request`) ─► one vLLM request per sample
    step() ─► LLMEngine.step() ─► new tokens (+ processed log-probs) tagged with `version`
    update_weights ─ inflight: load now ─ abort: running → partials, reload ─ drain: hold new
                                                                    requests until vLLM is empty

What vLLM gives and what this adapter adds:

* Behaviour log-probs: vLLM's ``processed_logprobs`` mode, i.e. after temperature (and
  truncation), as the trainer recomputes them. vLLM returns no sampling mask, so requests that
  truncate the vocabulary (top-k / top-p) are refused: their log-probs would be over a support
  the trainer cannot rebuild (no Keep Sampling Mask). ``Rollout.support_logmass`` is 0.
* Top alternatives (``SamplingParams.logprobs = N``): vLLM's ``logprobs = N``, in the same
  processed mode, as `Rollout.top_logprobs` (vLLM allows at most its ``max_logprobs``, 20); and
  vLLM's ``prompt_logprobs`` as `Rollout.prompt_logprobs` (`Sample.take_prompt_scores`).
* Per-token versions: vLLM reports none, so the adapter tags each token with the version loaded
  when the step that produced it ran (updates land between steps, under one lock).
* n samples: one vLLM request each, with seeds derived from the request seed and the sample
  index (vLLM gives every child of an ``n > 1`` request the same seeded stream).
* Prefix caching is off: a cached prompt block computed under old weights would otherwise be
  reused by requests admitted after an update. (Recording routing needs it on; each request's
  cache key is then salted with its own id, which has the same effect.) A multi-turn
  continuation therefore prefills its whole prefix again (``SamplingParams.park_kv`` is the
  built-in engine's and is ignored).
* Routing (mixture-of-experts models, ``record_routing``): vLLM's routed-experts return where
  the installed vLLM and platform serve it, as `Rollout.routed_experts` in tokenflow's layout;
  see `tokenflow.engine.vllm.routing`.

The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so weights reach it
by reference; see `tokenflow.engine.vllm.weight_load`.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
import time
from collections.abc import Collection
from pathlib import Path

from tokenflow.config.engine import EngineConfig
from tokenflow.engine.backends import VLLM
from tokenflow.engine.base import TokenDelta, collect_samples
from tokenflow.engine.errors import InvalidRequest, WeightUpdateError
from tokenflow.engine.request import RequestLimits, derive_seed, plan_request
from tokenflow.engine.sampling_params import SamplingParams
from tokenflow.engine.stats import EngineStats
from tokenflow.engine.vllm import routing
from tokenflow.engine.vllm.engine_args import INSTALL_HINT, engine_args
from tokenflow.engine.vllm.sample import Sample, checkpoint_shapes, top_alternatives
from tokenflow.engine.loading.weights import IGNORED_SUFFIXES, NamedTensors, as_dict, check_weights, weights_checksum
from tokenflow.metrics.trace import record
from tokenflow.rollout import Rollout

logger = logging.getLogger(__name__)

_SEED_MASK = (1 << 63) - 1
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


class VLLMEngine:
    """A `RolloutEngine` backed by vLLM (``engine.backend = "vllm"``)."""

    capabilities = VLLM

    def __init__(self, model: str | Path, config: EngineConfig | None = None, *, tokenizer=None) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core runs here
        # vLLM's own handler writes to stdout, where `--json` output goes; its records go
        # through the host's logging instead (stderr, the run's level and live view).
        os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
        if importlib.util.find_spec("vllm") is None:
            raise ImportError(f"{INSTALL_HINT} (no module named 'vllm')")
        import torch
        from transformers import AutoConfig, AutoTokenizer, GenerationConfig

        from tokenflow.engine.loading.loader import as_id_list
        from tokenflow.engine.vllm import weight_load

        self.config = config = config or EngineConfig()
        folder = Path(model)
        hf_config = AutoConfig.from_pretrained(folder)
        cuda = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
        self.device = "cuda" if cuda else "cpu"
        dtype = {"auto": "bfloat16" if cuda else "float32"}.get(config.dtype, config.dtype)
        self.vocab_size = hf_config.vocab_size
        self.max_model_len = config.max_model_len or hf_config.max_position_embeddings
        has_tokenizer = tokenizer is not None or any((folder / f).exists() for f in _TOKENIZER_FILES)
        self.tokenizer = tokenizer if tokenizer is not None else (
            AutoTokenizer.from_pretrained(folder) if has_tokenizer else None)
        eos = set(as_id_list(getattr(hf_config, "eos_token_id", None)))
        if (folder / "generation_config.json").exists():
            eos |= set(as_id_list(GenerationConfig.from_pretrained(folder).eos_token_id))
        if getattr(self.tokenizer, "eos_token_id", None) is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = frozenset(t for t in eos if 0 <= t < self.vocab_size)
        self._expected, self._optional = checkpoint_shapes(folder, hf_config)
        layout = routing.layout(hf_config) if config.record_routing else None
        if isinstance(layout, str):
            logger.warning("engine: routing not recorded: %s", layout)
            layout = None
        self._weight_path = "reload"
        kwargs = engine_args(folder, config, cuda, dtype, self.max_model_len, skip_tokenizer=self.tokenizer is None)
        native = weight_load.native_config()
        if native is not None:
            kwargs["weight_transfer_config"] = native
            self._weight_path = "native"
        kwargs.update(config.vllm_options)
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        from vllm import LLM

        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(weight_load.RotaryReloadNotice())
        self.llm, self.routing_layout = routing.start(LLM, kwargs, layout)
        if self._weight_path == "native":
            self.llm.init_weight_transfer_engine({"init_info": {}})
        self._core = self.llm.llm_engine
        self.version = config.version
        self._limits = RequestLimits(self.vocab_size, self.max_model_len, config.max_num_seqs, has_tokenizer,
                                     self.eos_token_ids, config.seed)
        self.stats = EngineStats()
        self._lock = threading.RLock()
        self.paused = False
        self._counter = 0
        self._live: dict[str, Sample] = {}  # vLLM request id -> sample, submitted to vLLM
        self._held: list[Sample] = []  # not yet submitted (a drain is pending)
        self._outbox: list[Rollout] = []
        self._pending: tuple[dict, int] | None = None  # a drain's staged update
        self._folder = folder
        self._named: dict | None = None  # the tensors of the last update (for weights_checksum)
        self._checksum: str | None = None
        logger.info("engine: vLLM %s on %s/%s, context %d, %d sequences, weights by %s%s",
                    routing.vllm_version(), self.device, dtype, self.max_model_len, config.max_num_seqs,
                    self._weight_path, ", routing recorded" if self.routing_layout else "")

    # -- requests -----------------------------------------------------------------------------

    def add_request(self, prompt_ids: list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, *, resume: Rollout | None = None,
                    group_id: int = 0, prompt_id: int = -1) -> str:
        """Queue one prompt for ``params.n`` samples (or continue ``resume``); see `RolloutEngine`."""
        params = params or SamplingParams()
        if params.truncates:
            raise InvalidRequest(
                f"the vLLM backend cannot sample with top_k={params.top_k} / top_p={params.top_p}: "
                "vLLM returns no sampling mask, so the trainer could not rebuild the support "
                "(Keep Sampling Mask). Use top_k=0, top_p=1, or engine.backend='builtin'")
        with self._lock:
            plan = plan_request(self._limits, self._counter, prompt_ids, params, request_id, resume,
                                group_id, prompt_id)
            busy = {(s.request_id, s.sample_index) for s in [*self._live.values(), *self._held]}
            clash = sorted(i for i in plan.sample_indices if (plan.request_id, i) in busy)
            if clash:
                raise InvalidRequest(f"request_id {plan.request_id!r} sample(s) {clash} are already "
                                     "running or waiting")
            self._counter += 1
            for i in plan.sample_indices:
                sample = Sample(plan.request_id, i, plan.group_id, plan.prompt_id, plan.prompt_ids,
                                params, plan.seed, plan.resume, plan.turn)
                if self._pending is not None:
                    self._held.append(sample)  # drain: nothing new starts before the swap
                else:
                    self._submit(sample)
            return plan.request_id

    def _submit(self, sample: Sample) -> None:
        from vllm import SamplingParams as VParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        p = sample.params
        done = sample.prefix.num_tokens if sample.prefix is not None else 0
        # Each sample its own stream; a resumed one a fresh stream for its continuation.
        seed = derive_seed(sample.seed, sample.sample_index * 1_000_003 + done) & _SEED_MASK
        vp = VParams(temperature=p.temperature, top_p=1.0, top_k=0, max_tokens=p.max_tokens - done,
                     stop_token_ids=list(p.stop_token_ids), stop=list(p.stop) or None, seed=seed,
                     ignore_eos=p.ignore_eos, logprobs=p.logprobs, prompt_logprobs=p.prompt_logprobs, n=1,
                     skip_special_tokens=True, detokenize=self.tokenizer is not None, output_kind=RequestOutputKind.DELTA)
        prompt = list(sample.prompt_ids) + (sample.prefix.completion_ids.tolist() if done else [])
        sample.vllm_id = f"{sample.request_id}/{sample.sample_index}/{self._counter}-{len(self._live)}-{time.perf_counter_ns()}"
        sample.tokens, sample.logprobs, sample.versions, sample.routing = [], [], [], None
        sample.top, sample.reported = [], 0
        inputs = TokensPrompt(prompt_token_ids=prompt)
        if self.routing_layout:
            inputs["cache_salt"] = sample.vllm_id  # prefix caching is on for routing: share no blocks
        sample.internal_id = self._core.add_request(sample.vllm_id, inputs, vp)
        self._live[sample.vllm_id] = sample
        self.stats.prefill_tokens += len(prompt)

    def generate(self, prompts: list[list[int]],
                 params: SamplingParams | list[SamplingParams] | None = None) -> list[list[Rollout]]:
        plist = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        if len(plist) != len(prompts):
            raise InvalidRequest(f"{len(prompts)} prompts but {len(plist)} SamplingParams")
        with self._lock:
            ids = [f"gen-{self._counter}-{i}" for i in range(len(prompts))]
            for i, (prompt, p) in enumerate(zip(prompts, plist)):
                self.add_request(prompt, p, request_id=ids[i])
        results, others = collect_samples(self, {rid: i for i, rid in enumerate(ids)}, sum(p.n for p in plist))
        with self._lock:
            self._outbox = others + self._outbox
        return results

    # -- the step -----------------------------------------------------------------------------

    def step(self) -> list[Rollout]:
        """One vLLM engine step; returns the rollouts that finished (aborted partials included)."""
        with self._lock:
            out, self._outbox = self._outbox, []
            if self.paused:
                return out
            self._maybe_finish_drain()
            if not self._live:
                return out
            wall, start = time.time(), time.perf_counter()
            outputs = self._core.step()
            finished = []
            new_tokens = 0
            for ro in outputs:
                sample = self._live.get(ro.request_id)
                if sample is None:
                    continue
                c = ro.outputs[0]
                ids = list(c.token_ids)
                new_tokens += len(ids)
                sample.tokens += ids
                sample.logprobs += [entry[t].logprob for entry, t in zip(c.logprobs or [], ids)]
                if sample.params.logprobs:
                    sample.top += [top_alternatives(entry, sample.params.logprobs) for entry in c.logprobs or []]
                sample.versions += [self.version] * len(ids)
                sample.take_prompt_scores(ro.prompt_logprobs)
                if ro.finished:
                    del self._live[ro.request_id]
                    if self.routing_layout:
                        sample.routing = self.routing_layout.rows(c.routed_experts)
                    reason = c.finish_reason if c.finish_reason in ("stop", "length", "abort") else "length"
                    finished.append(self._finish(sample, reason))
            seconds = time.perf_counter() - start
            st = self.stats
            st.tokens_generated += new_tokens
            st.decode_steps += 1
            st.decode_seconds += seconds
            st.last_step_seconds, st.last_step_kind, st.last_step_num_seqs = seconds, "decode", len(outputs)
            record("engine/decode", wall, seconds, seqs=len(outputs), finished=len(finished),
                   version=self.version)
            self._maybe_finish_drain()
            return out + finished

    def _finish(self, sample: Sample, reason: str) -> Rollout:
        routed = (routing.join(len(sample.prompt_ids), sample.prefix, len(sample.tokens), sample.routing)
                  if self.routing_layout else None)
        if self.tokenizer is None:
            return sample.rollout(reason, None, routed)
        full = (sample.prefix.completion_ids.tolist() if sample.prefix is not None else []) + sample.tokens
        return sample.rollout(reason, self.tokenizer.decode(full, skip_special_tokens=True), routed)

    def new_tokens(self, request_ids: Collection[str]) -> list[TokenDelta]:
        """Tokens vLLM produced since the last call for the running samples of ``request_ids``."""
        out = []
        with self._lock:
            for s in self._live.values():
                if s.request_id not in request_ids or s.reported == len(s.tokens):
                    continue
                start, s.reported = s.reported, len(s.tokens)
                out.append(TokenDelta(s.request_id, s.sample_index, s.tokens[start:], s.logprobs[start:],
                                      s.top[start:] if s.params.logprobs else None))
        return out

    def has_unfinished(self) -> bool:
        return bool(self._live or self._held or self._outbox or self._pending is not None)

    @property
    def num_running(self) -> int:
        return len(self._live)

    @property
    def num_waiting(self) -> int:
        return len(self._held)

    # -- control ------------------------------------------------------------------------------

    def pause(self) -> None:
        with self._lock:
            self.paused = True

    def resume(self) -> None:
        with self._lock:
            self.paused = False

    def abort(self, request_id: str) -> int:
        with self._lock:
            return len(self._abort(lambda s: s.request_id == request_id))

    def _abort(self, which, requeue_unstarted: bool = False) -> list[Sample]:
        """Stop the matching samples: they come back from the next `step` as partials. With
        ``requeue_unstarted`` (an abort-mode update), samples that have produced no token yet
        are the built-in engine's "waiting" requests: they stay queued and start under the new
        weights instead."""
        live = [s for s in self._live.values() if which(s)]
        if self.routing_layout:  # vLLM drops an aborted request's routing: take it first
            for s in live:
                s.routing = self.routing_layout.rows(routing.live_rows(self._core, s.internal_id))
        if live:
            self._core.abort_request([s.vllm_id for s in live])
        for s in live:
            del self._live[s.vllm_id]
        held = [s for s in self._held if which(s)]
        self._held = [s for s in self._held if not which(s)]
        stopped = []
        for s in live + held:
            if requeue_unstarted and not s.tokens:
                self._held.append(s)
            else:
                self._outbox.append(self._finish(s, "abort"))
                stopped.append(s)
        return stopped

    # -- weights ------------------------------------------------------------------------------

    def update_weights(self, named_tensors: NamedTensors, version: int, *, mode: str | None = None,
                       recompute_kv: bool | None = None, checksum: str | None = None) -> dict:
        """Load new weights (Hugging Face names) as policy ``version``; see `RolloutEngine`."""
        mode = mode or self.config.update_mode
        if mode not in VLLM.update_modes:
            raise ValueError(f"update mode must be one of {VLLM.update_modes}, got {mode!r}")
        mode = "drain" if mode == "blocking" else mode
        if recompute_kv or (recompute_kv is None and self.config.recompute_kv_after_update):
            raise WeightUpdateError("recompute_kv is not supported by the vLLM backend; use "
                                    "update_mode 'abort' to restart running samples under new weights")
        start = time.perf_counter()
        named = {k: v for k, v in as_dict(named_tensors).items() if not k.endswith(IGNORED_SUFFIXES)}
        with self._lock:
            check_weights(named, self._expected, self._optional)
            got = None
            if checksum is not None:
                got = weights_checksum(named)
                if got != checksum:
                    raise WeightUpdateError(
                        f"weight update refused: checksum {got} does not match the expected {checksum}")
            report = {"mode": mode, "version": version, "applied": False, "pending": False,
                      "aborted": 0, "recomputed": 0, "swap_seconds": 0.0}
            if mode == "drain" and self._live:
                # Staged as copies: a trainer may keep updating its own tensors in place.
                self._pending = ({k: v.detach().clone() for k, v in named.items()}, version)
                report["pending"] = True
            else:
                if mode == "abort":
                    report["aborted"] = len(self._abort(lambda s: True, requeue_unstarted=True))
                report["swap_seconds"] = self._load(named, version)
                self._checksum = got
                report["applied"] = True
                self._release_held()
        report["seconds"] = time.perf_counter() - start
        return report

    def _load(self, named: dict, version: int) -> float:
        from tokenflow.engine.vllm.weight_load import load_into

        t0 = time.perf_counter()
        load_into(self.llm, named, version, self._weight_path)
        self.version = version
        self._named, self._checksum = named, None
        seconds = time.perf_counter() - t0
        self.stats.weight_swaps += 1
        self.stats.last_weight_swap_seconds = seconds
        record("engine/weight_swap", time.time() - seconds, seconds, version=version)
        return seconds

    def _maybe_finish_drain(self) -> None:
        if self._pending is not None and not self._live:
            named, version = self._pending
            self._pending = None
            self._load(named, version)
            self._release_held()

    def _release_held(self) -> None:
        held, self._held = self._held, []
        for sample in held:
            self._submit(sample)

    def weights_checksum(self) -> str:
        """Checksum of the weights last handed to vLLM (the checkpoint's before any update).
        vLLM keeps its weights in a kernel layout (on the CPU, packed, with the checkpoint-shaped
        parameters emptied), so they are hashed as they went in, not read back."""
        if self._checksum is None:
            from tokenflow.engine.loading.weights import load_checkpoint

            self._checksum = weights_checksum(self._named if self._named is not None
                                              else load_checkpoint(self._folder))
        return self._checksum

    def close(self) -> None:
        with self._lock:
            if self._live:
                self._core.abort_request(list(self._live))
            self._live.clear()
