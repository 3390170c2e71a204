"""`Engine`: the built-in rollout engine. Each `step` is schedule -> run -> post-process.

::

    add_request ──► Scheduler.waiting ──admit (slots free, token budget)──► prefill (shared by n)
                                                                            │
    step() returns finished Rollouts ◄── postprocess (stop? free slot) ◄── decode (all running)
                                                                            ▲
    update_weights ── inflight: swap now ─── abort: running → partials ─── drain: stop admitting,
                                                                           swap when batch empty

A multi-turn continuation (``resume=`` a rollout ending in environment tokens) whose previous
turn parked its KV cache (``park_kv``) is admitted as an extend: the parked rows go back into a
slot and only the new tokens are prefilled (`tokenflow.engine.builtin.cache.parked`).

Calls are serialised by one lock, so a weight-sync thread may call `update_weights` while a
generation loop calls `step`: the swap then lands between two steps.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

import torch

from tokenflow.config.engine import EngineConfig
from tokenflow.engine.backends import BUILTIN
from tokenflow.engine.base import TokenDelta, collect_samples
from tokenflow.engine.errors import InvalidRequest
from tokenflow.host_memory import keep_freed_memory, limit_onednn_cache
from tokenflow.engine.loading.loader import (
    as_hf_config,
    as_id_list,
    context_length,
    read_model_folder,
)
from tokenflow.engine.builtin.model_runner import ModelRunner
from tokenflow.engine.builtin.models import model_class
from tokenflow.engine.builtin.kernels import use_engine_kernels
from tokenflow.engine.request import RequestLimits
from tokenflow.engine.builtin.models.packed import can_pack, packing_note
from tokenflow.engine.builtin.sampler import Sampler, SamplingBatch
from tokenflow.engine.sampling_params import SamplingParams
from tokenflow.engine.builtin.scheduler import Scheduler
from tokenflow.engine.builtin.sequence import Sequence, SequenceGroup, make_group
from tokenflow.engine.stats import EngineStats
from tokenflow.engine.builtin.weight_update import apply_pending, apply_update
from tokenflow.engine.loading.weights import NamedTensors, as_dict, check_weights, weights_checksum
from tokenflow.metrics.trace import record
from tokenflow.rollout import Rollout

logger = logging.getLogger(__name__)


class Engine:
    """Continuous-batching generation with behaviour log-probs, policy versions and live weight
    updates. Implements `tokenflow.engine.base.RolloutEngine`.

    ``model`` is a Hugging Face model folder (``config.json`` + ``model.safetensors``, and
    tokenizer files if stop strings or ``Rollout.text`` are wanted); `from_config` builds one from
    an in-memory config. Per generated token the returned `Rollout` holds the token, its
    behaviour log-prob (see `tokenflow.engine.builtin.sampler`), the policy version of the weights that
    computed it, and the sampling support when top-k/top-p cut the vocabulary.
    """

    capabilities = BUILTIN

    logits_hook: Callable[[str, list[Sequence], torch.Tensor], None] | None = None
    """Debug/test hook: (step kind, row sequences, logits) before sampling; a decode step's in the model's dtype."""

    def __init__(self, model: str | Path, config: EngineConfig | None = None, *, tokenizer=None) -> None:
        folder = read_model_folder(model, tokenizer)
        self._setup(folder.hf_config, folder.state_dict, config, folder.tokenizer, folder.eos_token_ids)

    @classmethod
    def from_config(cls, hf_config, state_dict: NamedTensors | None = None,
                    config: EngineConfig | None = None, *, tokenizer=None) -> Engine:
        """An engine for a transformers config (or its dict); random weights if no state dict."""
        engine = cls.__new__(cls)
        engine._setup(hf_config, state_dict, config, tokenizer, [])
        return engine

    def _setup(self, hf_config, state_dict, config, tokenizer, extra_eos: list[int]) -> None:
        self.config = config = config or EngineConfig()
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        cuda = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
        self.device = torch.device("cuda" if cuda else "cpu")
        limit_onednn_cache(config.onednn_cache_capacity, self.device.type)  # before any kernel is built
        if self.device.type == "cpu" and config.keep_host_memory_mb:
            keep_freed_memory(config.keep_host_memory_mb << 20)
        self.dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                      "auto": torch.bfloat16 if cuda else torch.float32}[config.dtype]
        hf_config = as_hf_config(hf_config)
        cls = model_class(hf_config)
        self.hf_config = hf_config
        self.max_model_len = context_length(cls, hf_config, config.max_model_len)
        self.tokenizer = tokenizer
        self.vocab_size = hf_config.vocab_size
        self.model = cls(hf_config, self.max_model_len, self.dtype).to(self.device)
        self.model.packs_weights = config.pack_weights and can_pack(self.device, self.dtype)
        views = self.model.hf_views()
        self.expected_weights = {name: view.shape for name, view in views.items()}
        self.optional_weights = {"lm_head.weight": views["model.embed_tokens.weight"].shape} if self.model.tied else {}
        if state_dict is None:
            self.model.init_random(config.seed)
        else:
            state_dict = self.model.canonical_weights(as_dict(state_dict))
            check_weights(state_dict, self.expected_weights, self.optional_weights)
            self.model.load_weights(state_dict.items())
        eos = set(as_id_list(getattr(hf_config, "eos_token_id", None))) | set(extra_eos)
        if tokenizer is not None and getattr(tokenizer, "eos_token_id", None) is not None:
            eos.add(tokenizer.eos_token_id)
        self.eos_token_ids = frozenset(t for t in eos if 0 <= t < self.vocab_size)
        self.version = config.version
        self._limits = RequestLimits(self.vocab_size, self.max_model_len, config.max_num_seqs,
                                     tokenizer is not None, self.eos_token_ids, config.seed)
        self.stats = EngineStats()
        max_parked = 2 * config.max_num_seqs if config.max_parked is None else config.max_parked
        self.runner = ModelRunner(self.model, config.max_num_seqs, self.max_model_len,
                                  self.device, self.dtype, config.kv_growth, config.record_routing,
                                  max_parked)
        detok = self._decode if tokenizer is not None else None
        self.scheduler = Scheduler(config.max_num_seqs, config.max_num_batched_tokens,
                                   self.max_model_len, detok, self._reusable)
        self.runner.attention_kernel = use_engine_kernels(config.cpu_kernels, self.model, self.device, hf_config)
        self.sampler = Sampler()
        self.lock = threading.RLock()
        self.paused = False
        self.pending_update: tuple[dict[str, torch.Tensor], int, bool] | None = None
        """A drain's staged update: (tensors, version, recompute_kv)."""
        self.outbox: list[Rollout] = []
        self._live: dict[str, set[int]] = {}
        """Sample indices still unfinished, per request id."""
        self._counter = 0
        logger.info("engine: %s on %s/%s, %.1fM parameters, context %d, %d slots%s%s",
                    cls.__name__, self.device, str(self.dtype).removeprefix("torch."),
                    sum(v.numel() for v in views.values()) / 1e6, self.max_model_len, config.max_num_seqs,
                    packing_note(self.model),
                    ", compiled CPU kernels (engine.cpu_kernels)" if self.runner.attention_kernel else "")

    # -- requests -----------------------------------------------------------------------------

    def add_request(self, prompt_ids: list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, *, resume: Rollout | None = None,
                    group_id: int = 0, prompt_id: int = -1) -> str:
        """Queue one prompt for ``params.n`` samples; returns its request id.

        Raises `InvalidRequest` (and changes nothing) if the request is bad. ``resume`` (with
        n = 1) is a rollout of this prompt to continue: a partial one (finish reason "abort"),
        or one whose last token is an environment token (`Rollout.append_environment`), which
        starts the next model turn. The engine continues prompt + ``resume.completion_ids``
        exactly (from parked KV if the previous turn parked it, else prefilling it), keeps the
        rollout's ids and seed, and returns ``resume`` extended by the new tokens."""
        with self.lock:
            group = self._make_group(prompt_ids, params or SamplingParams(), request_id,
                                     resume, group_id, prompt_id)
            self._enqueue(group)
            return group.request_id

    def _make_group(self, prompt_ids, params: SamplingParams, request_id: str | None,
                    resume: Rollout | None, group_id: int, prompt_id: int) -> SequenceGroup:
        group = make_group(self._limits, self._counter, prompt_ids, params, request_id, resume,
                           group_id, prompt_id)
        # Samples of one request may be resumed separately under the same id; only a
        # (request id, sample index) pair that is still unfinished is a clash.
        clash = self._live.get(group.request_id, set()) & {s.sample_index for s in group.seqs}
        if clash:
            raise InvalidRequest(f"request_id {group.request_id!r} sample(s) {sorted(clash)} "
                                 "are already running or waiting")
        self._counter += 1
        return group

    def _enqueue(self, group: SequenceGroup) -> None:
        self.scheduler.add(group)
        self._live.setdefault(group.request_id, set()).update(s.sample_index for s in group.seqs)

    def generate(self, prompts: list[list[int]],
                 params: SamplingParams | list[SamplingParams] | None = None) -> list[list[Rollout]]:
        """Blocking: result[i] holds prompt i's n samples ordered by sample_index. Every request
        is validated before any is queued. Rollouts of other callers' requests that finish
        meanwhile are kept for the next `step`."""
        plist = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        if len(plist) != len(prompts):
            raise InvalidRequest(f"{len(prompts)} prompts but {len(plist)} SamplingParams")
        with self.lock:
            if self.paused:
                raise RuntimeError("engine is paused; resume() before generate()")
            groups = [self._make_group(prompt, p, None, None, 0, -1) for prompt, p in zip(prompts, plist)]
            for group in groups:
                self._enqueue(group)
        # The lock is taken per step, not for the whole loop, so a weight update from another
        # thread still lands between two steps.
        index = {g.request_id: i for i, g in enumerate(groups)}
        results, others = collect_samples(self, index, sum(g.n for g in groups))
        with self.lock:
            self.outbox = others + self.outbox
        return results

    def stream(self) -> Iterator[Rollout]:
        """Step until nothing is left, yielding rollouts as they finish."""
        while self.has_unfinished():
            yield from self.step()

    # -- the step -----------------------------------------------------------------------------

    def step(self) -> list[Rollout]:
        """One prefill of newly admitted requests or one decode step of the running batch;
        returns the rollouts that finished (aborted partials included)."""
        with self.lock:
            out, self.outbox = self.outbox, []
            if self.paused:
                return out
            if self.pending_update is not None and not self.scheduler.running:
                apply_pending(self)
            self.runner.apply_moves(self.scheduler.take_moves())
            batch = self.scheduler.schedule()
            if batch is None:
                return out
            wall, start = time.time(), time.perf_counter()
            # Counted before the step appends a token to each row.
            reused = sum(g.reused for g in batch.groups)
            forwarded = sum(g.num_prefill_tokens for g in batch.groups) - reused
            with torch.inference_mode():
                if batch.kind == "prefill":
                    logits = self._prefill(batch.groups)
                    if len(batch.seqs) != len(batch.groups):  # n > 1: one prefill, n samples
                        rows = [i for i, g in enumerate(batch.groups) for _ in g.seqs]
                        logits = logits[torch.tensor(rows, device=logits.device)]
                else:
                    logits = self.runner.decode(batch.seqs)
                if self.runner.recorder is not None:
                    self._keep_routing(batch)
                if self.logits_hook is not None:
                    self.logits_hook(batch.kind, batch.seqs, logits)
                sampled = self.sampler(logits, SamplingBatch.from_seqs(batch.seqs, self.device))
            finished = self.scheduler.postprocess(batch.seqs, sampled.tokens, sampled.logprobs,
                                                  sampled.logmass, sampled.support, self.version,
                                                  sampled.top)
            self.runner.apply_moves(self.scheduler.take_moves())
            if self.pending_update is not None and not self.scheduler.running:
                apply_pending(self)  # the drain is over: swap now, not at some later step
            seconds = time.perf_counter() - start
            self._count(batch, seconds, forwarded, reused)
            record(f"engine/{batch.kind}", wall, seconds, seqs=len(batch.seqs),
                   finished=len(finished), version=self.version)
            return out + [self.finish_sequence(s) for s in finished]

    def _prefill(self, groups: list[SequenceGroup]) -> torch.Tensor:
        """Prefill newly admitted groups: whole, or (continuations whose prefix KV is parked;
        the scheduler never mixes the two) from the parked rows on."""
        slots = [[s.slot for s in g.seqs] for g in groups]
        for g in groups:
            seq = g.seqs[0]
            if not seq.continues:
                continue
            key = (seq.prefix.request_id, seq.prefix.sample_index)
            if g.reused:
                self.runner.unpark(key, seq.slot)
                self.stats.parked_hits += 1
            else:
                self.runner.parked.take(key)  # stale (other tokens) if there at all
                self.stats.parked_misses += 1
        if not groups[0].reused:
            scored = [g for g in groups if g.seqs[0].params.prompt_logprobs is not None]
            logits = self.runner.prefill([g.prefill_ids for g in groups], slots, keep_hidden=bool(scored))
            for row, g in enumerate(groups):
                if g in scored:
                    scores = self.runner.prompt_scores(row, g.seqs[0].prompt_ids, g.seqs[0].params.prompt_logprobs)
                    for s in g.seqs:
                        s.prompt_scores = scores
            self.runner.last_hidden = None
            return logits
        return self.runner.extend([g.prefill_ids[g.reused:] for g in groups],
                                  [g.reused for g in groups], slots)

    def _reusable(self, group: SequenceGroup) -> int:
        """Leading positions of a waiting continuation that its parked KV cache covers."""
        seq = group.seqs[0]
        # Prompt log-probs need logits at every prompt position, which parked rows do not keep:
        # such a request prefills its whole sequence again.
        if not seq.continues or seq.params.prompt_logprobs is not None:
            return 0
        return self.runner.parked.match((seq.prefix.request_id, seq.prefix.sample_index), seq.token_ids)

    def _keep_routing(self, batch) -> None:
        """Hand each row's recorded experts to its sequence(s) (MoE models recording routing)."""
        routing = self.runner.last_routing
        if batch.kind == "prefill":
            for g, rows in zip(batch.groups, routing):
                for s in g.seqs:  # the n samples share the prompt's routing
                    s.routing.append(rows[:g.num_prefill_tokens])
        else:
            for s, rows in zip(batch.seqs, routing):
                s.routing.append(rows)

    def _count(self, batch, seconds: float, forwarded: int, reused: int) -> None:
        st = self.stats
        st.tokens_generated += len(batch.seqs)
        st.last_step_seconds, st.last_step_kind, st.last_step_num_seqs = seconds, batch.kind, len(batch.seqs)
        if batch.kind == "prefill":
            st.prefill_steps += 1
            st.prefill_seconds += seconds
            st.prefill_tokens += forwarded
            st.reused_prefix_tokens += reused
        else:
            st.decode_steps += 1
            st.decode_seconds += seconds

    def finish_sequence(self, seq: Sequence) -> Rollout:
        live = self._live.get(seq.request_id)
        if live is not None:
            live.discard(seq.sample_index)
            if not live:
                del self._live[seq.request_id]
        text = None
        if self.tokenizer is not None:
            text = self._decode(seq.token_ids[seq.num_prompt_tokens:])
        return seq.to_rollout(text)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def new_tokens(self, request_ids: Collection[str]) -> list[TokenDelta]:
        """Tokens generated since the last call by the running samples of ``request_ids``
        (see `RolloutEngine.new_tokens`)."""
        out = []
        with self.lock:
            for seq in self.scheduler.running:
                if seq.request_id not in request_ids or seq.reported == seq.num_new_tokens:
                    continue
                start, seq.reported = seq.reported, seq.num_new_tokens
                ids = seq.token_ids[len(seq.token_ids) - seq.num_new_tokens + start:]
                out.append(TokenDelta(seq.request_id, seq.sample_index, ids, seq.logprobs[start:],
                                      seq.top[start:] if seq.params.logprobs else None))
        return out

    def partial_rollouts(self, request_ids: Collection[str]) -> list[Rollout]:
        """The unfinished samples of ``request_ids`` as they stand, as partial rollouts (finish
        reason "abort": tokens so far, behaviour log-probs, versions), changing nothing: the
        running ones, the waiting ones that resume a prefix, the aborted ones not yet handed
        out. A sample that has no token yet is left out. A checkpoint keeps these."""
        with self.lock:
            seqs = [s for s in self.scheduler.running if s.request_id in request_ids]
            seqs += [s for g in self.scheduler.waiting if g.request_id in request_ids for s in g.seqs
                     if s.prefix is not None]
            out = [s.to_rollout() for s in seqs]
            out += [r for r in self.outbox if r.request_id in request_ids and r.finish_reason == "abort"]
            return [r for r in out if r.num_tokens > 0]

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self.outbox) or self.pending_update is not None

    @property
    def num_running(self) -> int:
        return self.scheduler.num_running

    @property
    def num_waiting(self) -> int:
        return self.scheduler.num_waiting

    # -- control --------------------------------------------------------------------------------

    def pause(self) -> None:
        """`step` runs no forward pass until `resume` (it still hands out aborted rollouts)."""
        with self.lock:
            self.paused = True

    def resume(self) -> None:
        with self.lock:
            self.paused = False

    def abort(self, request_id: str) -> int:
        """Stop every sample of ``request_id``; they come back from the next `step` as partial
        rollouts with finish reason "abort". Its parked KV caches are dropped too (call it when
        a multi-turn episode ends early). Returns how many samples were stopped."""
        with self.lock:
            self.runner.parked.drop_request(request_id)
            seqs = self.scheduler.abort_request(request_id)
            self.outbox.extend(self.finish_sequence(s) for s in seqs)
            return len(seqs)

    # -- weights ----------------------------------------------------------------------------------

    def update_weights(self, named_tensors: NamedTensors, version: int, *, mode: str | None = None,
                       recompute_kv: bool | None = None, checksum: str | None = None) -> dict:
        """Load new weights (Hugging Face names) as policy ``version``; see `RolloutEngine`."""
        return apply_update(self, named_tensors, version, mode=mode, recompute_kv=recompute_kv,
                            checksum=checksum)

    def weights_checksum(self) -> str:
        """`weights_checksum` of the weights in use, under their Hugging Face names."""
        return weights_checksum(self.model.hf_views())

    def close(self) -> None:
        """Nothing to release: the engine holds only tensors, which go with it."""
