"""The service's state: sessions, training models, snapshots, sampling sessions, and order.

Every call that changes a model runs on one training thread, in the order its client numbered
it (``seq_id``): a call whose number is not above the last one that model accepted is refused
with a user error (the official SDK sends them one at a time, in order), and a call repeated
with the same number (the SDK retrying a lost answer) gets the first call's request id back.
Sampling runs on each base model's engine thread (`tokenflow.tinker.sampling`), beside training.

What is isolated: each training client has its own copy of the model, adapters and optimizer,
and a client can only name its own model ids and sampling sessions as they were returned to it.
What is shared: the engine of a base model (snapshots of every client on that base take turns
on it) and the checkpoint root (a ``tinker://`` path is readable by anyone who holds it, as on
hosted Tinker).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tokenflow.tinker import losses, store
from tokenflow.tinker.errors import TinkerError, user_error
from tokenflow.tinker.futures import Futures
from tokenflow.tinker.runs import RunsMixin
from tokenflow.tinker.samplers import SamplingMixin
from tokenflow.tinker.sampling import Sampler, Snapshot
from tokenflow.tinker.training import Lora, TrainingModel
from tokenflow.tinker.wire import ForwardBackwardCall

log = logging.getLogger(__name__)


@dataclass
class ModelEntry:
    model_id: str
    session_id: str
    base_model: str  # as the client named it
    folder: str
    lora: Lora | None
    training: TrainingModel | None = None
    last_seq: int = 0
    by_seq: dict[int, str] = field(default_factory=dict)
    snapshots: OrderedDict[str, Snapshot] = field(default_factory=OrderedDict)
    saves: int = 0


@dataclass
class Settings:
    root: str
    threads: int | None = None
    micro_batch_tokens: int = 2048
    recompute: bool = True
    """Recompute each layer's activations in the backward pass (gradient checkpointing)."""
    dtype: str = "float32"
    """Training products and the engine: "float32" (sampler and trainer log-probs agree to
    rounding), "bfloat16" (faster on CPUs with bfloat16 units; ratios then start near, not at, 1)
    or "native" (bfloat16 where this CPU has those units, float32 elsewhere; resolved here)."""
    max_models: int = 8
    max_data_tokens: int = 1 << 20
    """Tokens in one forward_backward call (summed over datums); the SDK splits larger batches."""
    session_timeout_s: float = 300.0
    """A session not heard from for this long (the SDK heartbeats every 10 s) is finished: its
    models are unloaded, so a client that died does not hold them until the service stops."""
    snapshots_in_memory: int = 3
    """Sampler snapshots held in memory per model, the newest (and as many read back from disk for
    the whole service): an older unnamed one must be saved again, an older named one is read back
    from its checkpoint when sampled."""

    def __post_init__(self) -> None:
        if self.dtype == "native":
            from tokenflow.precision import native_dtype

            self.dtype = native_dtype("cpu")  # the service trains and samples on the CPU
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype {self.dtype!r}: use float32, bfloat16 or native")


class TinkerService(RunsMixin, SamplingMixin):
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.store = store.Store(settings.root)
        self.futures = Futures()
        self.sessions: dict[str, dict] = {}
        self.models: dict[str, ModelEntry] = {}
        # id -> (owner session, base model folder, snapshot key or None for the base model, path):
        # keys, not snapshots, so a session does not keep an evicted snapshot's weights alive.
        self.sampling_sessions: dict[str, tuple[str, str, str | None, str | None]] = {}
        self._from_disk: OrderedDict[str, tuple[Snapshot, str]] = OrderedDict()
        self.samplers: dict[str, Sampler] = {}
        self._lock = threading.RLock()
        self._train = ThreadPoolExecutor(1, thread_name_prefix="tinker-train")

    # -- sessions ------------------------------------------------------------------------------

    def create_session(self, metadata: dict | None) -> str:
        self.sweep()
        sid = f"session-{uuid.uuid4().hex[:16]}"
        with self._lock:
            self.sessions[sid] = {"metadata": metadata or {}, "models": [], "seen": time.monotonic()}
        return sid

    def session(self, sid: str) -> dict:
        s = self.sessions.get(sid)
        if s is None:
            raise user_error(f"unknown session_id {sid!r}: create a session first (the SDK's ServiceClient does)")
        s["seen"] = time.monotonic()
        return s

    def heartbeat(self, sid: str) -> bool:
        """False when the session is gone (finished or expired): the SDK then stops beating."""
        self.sweep()
        if sid not in self.sessions:
            return False
        self.session(sid)
        return True

    def sweep(self) -> None:
        """Finish every session not heard from within ``session_timeout_s``."""
        now = time.monotonic()
        with self._lock:
            stale = [k for k, v in self.sessions.items() if now - v["seen"] > self.settings.session_timeout_s]
        for sid in stale:
            log.warning("tinker: session %s sent nothing for %.0f s; finishing it (its models are unloaded)",
                        sid, now - self.sessions[sid]["seen"])
            self.finish_session(sid)

    def model(self, model_id: str) -> ModelEntry:
        m = self.models.get(model_id)
        if m is None:
            raise user_error(f"unknown model_id {model_id!r}")
        return m

    # -- models --------------------------------------------------------------------------------

    @staticmethod
    def resolve(base_model: str) -> str:
        from tokenflow.model_store.paths import resolve_model_path

        if not isinstance(base_model, str) or not base_model:
            raise user_error("base_model is required")
        try:
            return resolve_model_path(base_model)
        except (ValueError, FileNotFoundError) as e:
            from tokenflow.model_store.paths import MODEL_NAMES

            raise user_error(f"base_model {base_model!r}: {e}. Names this service knows: {', '.join(MODEL_NAMES)}, "
                             "or a local Hugging Face model folder") from None

    def create_model(self, session_id: str, base_model: str, lora: Lora | None, model_seq_id: int | None = None) -> str:
        return self.new_model(session_id, base_model, lora, model_seq_id)[0]

    def new_model(self, session_id: str, base_model: str, lora: Lora | None,
                  model_seq_id: int | None = None) -> tuple[str, str]:
        """(request id of the load, model id)."""
        self.sweep()
        self.session(session_id)
        with self._lock:
            if len(self.models) >= self.settings.max_models:
                raise user_error(f"the service holds {len(self.models)} models, its limit (--max-models); "
                                 "unload one or restart with a higher limit")
        folder = self.resolve(base_model)
        self._check_memory(folder, lora)
        with self._lock:  # the SDK's own naming: it derives the id of a model made from a state
            seq = model_seq_id if isinstance(model_seq_id, int) else len(self.sessions[session_id]["models"])
            model_id = f"{session_id}:train:{seq}"
            if model_id in self.models:
                raise user_error(f"model_seq_id {seq} was already used in session {session_id}")
        entry = ModelEntry(model_id, session_id, base_model, folder, lora)

        def load() -> dict:
            entry.training = TrainingModel(folder, lora, micro_batch_tokens=self.settings.micro_batch_tokens,
                                           recompute=self.settings.recompute, dtype=self.settings.dtype)
            return {"model_id": model_id, "type": "create_model"}

        with self._lock:
            self.models[model_id] = entry
            self.sessions[session_id]["models"].append(model_id)
        return self.futures.add(self._train.submit(self._guard(load))), model_id

    def _check_memory(self, folder: str, lora: Lora | None) -> None:
        """Refuse a model whose training would not fit the memory available now, before loading
        it: `tokenflow.runtime.run.memory_estimate`'s trainer estimate (the one `tokenflow train`
        checks) for a full micro-batch of ``micro_batch_tokens`` with this service's settings."""
        from types import SimpleNamespace

        from tokenflow.runtime.run.memory_estimate import GB, ModelShape, available_bytes, trainer_parts

        have, source = available_bytes()
        if have is None:
            return
        st = self.settings
        cfg = SimpleNamespace(
            trainer=SimpleNamespace(gradient_checkpointing=st.recompute, logprob_chunk_tokens=512, world_size=1,
                                    lora_rank=lora.rank if lora else None, dtype=st.dtype,
                                    lean_activations=False),  # TrainingModel keeps transformers' modules
            algorithm=SimpleNamespace(kl_coef=0.0, reference_model=None))
        need = sum(trainer_parts(cfg, ModelShape.read(folder), st.micro_batch_tokens).values())
        if need > have:
            raise user_error(
                f"training {folder} needs about {need / GB:.2f} GB with --micro-batch-tokens "
                f"{st.micro_batch_tokens} ({'LoRA' if lora else 'full fine-tuning'}), but {have / GB:.2f} GB is "
                f"available ({source}): unload another client's model, use LoRA, or restart the service with "
                "a smaller --micro-batch-tokens")

    def info(self, model_id: str) -> dict:
        m = self.model(model_id)
        return {"type": "get_info", "model_id": model_id, "model_name": m.base_model,
                "is_lora": m.lora is not None, "lora_rank": m.lora.rank if m.lora else None,
                "model_data": {"arch": "causal_lm", "model_name": m.base_model, "tokenizer_id": m.folder}}

    # -- ordered calls -------------------------------------------------------------------------

    def ordered(self, model_id: str, seq_id: int | None, fn) -> str:
        """Queue ``fn`` on the training thread as call ``seq_id`` of ``model_id``; its request id."""
        m = self.model(model_id)
        if m.session_id in self.sessions:
            self.sessions[m.session_id]["seen"] = time.monotonic()
        with self._lock:
            if seq_id is not None:
                if seq_id in m.by_seq:
                    return m.by_seq[seq_id]  # a retried call: the same future
                if seq_id <= m.last_seq:
                    raise user_error(f"seq_id {seq_id} for model {model_id} is out of order: the last call "
                                     f"accepted was {m.last_seq}; number each call above the previous one")
                m.last_seq = seq_id
            rid = self.futures.add(self._train.submit(self._guard(fn)))
            if seq_id is not None:
                m.by_seq[seq_id] = rid
                if len(m.by_seq) > 4096:
                    for k in sorted(m.by_seq)[:2048]:
                        del m.by_seq[k]
            return rid

    @staticmethod
    def _guard(fn):
        def run():
            try:
                return fn()
            except TinkerError:
                raise
            except (ValueError, IndexError) as e:  # bad shapes that got past the checks
                raise user_error(str(e)) from None
            except Exception as e:
                log.exception("tinker: a call failed")
                raise TinkerError(f"{type(e).__name__}: {e}", category="server") from None
        return run

    def _trained(self, m: ModelEntry) -> TrainingModel:
        if m.training is None:
            raise user_error(f"model {m.model_id} is still loading or failed to load")
        return m.training

    # -- training ------------------------------------------------------------------------------

    def forward_backward(self, call: ForwardBackwardCall) -> str:
        m = self.model(call.model_id)
        call.check()
        config = losses.check(call.loss_fn, call.loss_fn_config)
        if not call.data:
            raise user_error("data is empty: forward_backward needs at least one datum")
        tokens = sum(d.tokens.size for d in call.data)
        if tokens > self.settings.max_data_tokens:
            raise user_error(f"one call carries {tokens} tokens, above the service's {self.settings.max_data_tokens} "
                             "(--max-data-tokens); send smaller batches")

        def run() -> dict:
            outputs, metrics = self._trained(m).run(call.data, call.loss_fn, config, backward=not call.forward_only)
            return {"_outputs": outputs, "_metrics": metrics}

        return self.ordered(call.model_id, call.seq_id, run)

    def optim_step(self, model_id: str, seq_id: int | None, params: dict) -> str:
        m = self.model(model_id)
        kind = params.get("type", "adam")
        if kind not in ("adam", "adamw"):
            raise user_error(f"optimizer {kind!r} is not supported: this service steps AdamW (AdamParams)")
        args = {k: float(params.get(k, d)) for k, d in (("learning_rate", 1e-4), ("beta1", 0.9), ("beta2", 0.95),
                                                           ("eps", 1e-12), ("weight_decay", 0.0), ("grad_clip_norm", 0.0))}

        def run() -> dict:
            metrics = self._trained(m).optim_step(args["learning_rate"], args["beta1"], args["beta2"], args["eps"],
                                                  args["weight_decay"], args["grad_clip_norm"])
            return {"type": "optim_step", "metrics": metrics}

        return self.ordered(model_id, seq_id, run)

    # -- weights -------------------------------------------------------------------------------

    def save_state(self, model_id: str, seq_id: int | None, name: str | None, optimizer: bool = True) -> str:
        import torch

        m = self.model(model_id)
        loc = store.Location(model_id, "weights", store.check_name(name or f"state-{m.saves + 1:06d}"))

        def run() -> dict:
            t = self._trained(m)
            folder = self.store.folder(loc, create=True)
            torch.save(t.state(with_optimizer=optimizer), folder / "state.pt")
            self.store.write_meta(loc, self._meta(m, optimizer=optimizer, steps=t.steps))
            m.saves += 1
            return {"type": "save_weights", "path": loc.path}

        return self.ordered(model_id, seq_id, run)

    def _meta(self, m: ModelEntry, **extra) -> dict:
        lora = None if m.lora is None else {"rank": m.lora.rank, "train_unembed": m.lora.train_unembed,
                                             "train_mlp": m.lora.train_mlp, "train_attn": m.lora.train_attn}
        return {"base_model": m.base_model, "model_id": m.model_id, "lora": lora, **extra}

    def load_state(self, model_id: str, seq_id: int | None, path: str, optimizer: bool) -> str:
        import torch

        m = self.model(model_id)
        loc = store.parse(path)
        if loc.kind != "weights":
            raise user_error(f"{path} is a sampler checkpoint; load_state takes a training state "
                             "(tinker://MODEL_ID/weights/NAME, from save_state)")
        meta = self.store.meta(loc)
        if self.resolve(meta["base_model"]) != m.folder or (meta["lora"] is None) != (m.lora is None) \
                or (m.lora and meta["lora"]["rank"] != m.lora.rank):
            raise user_error(f"{path} was saved from {meta['base_model']} with lora {meta['lora']}; this model "
                             f"is {m.base_model} with lora rank {m.lora.rank if m.lora else None}")
        if optimizer and not meta.get("optimizer"):
            raise user_error(f"{path} was saved without optimizer state; load it without the optimizer")

        def run() -> dict:
            state = torch.load(self.store.folder(loc) / "state.pt", map_location="cpu", weights_only=True)
            self._trained(m).load_state(state, with_optimizer=optimizer)
            return {"type": "load_weights", "path": path, "model_id": model_id}

        return self.ordered(model_id, seq_id, run)

    def save_for_sampler(self, model_id: str, seq_id: int | None, name: str | None,
                         sampling_session_seq_id: int | None) -> str:
        m = self.model(model_id)
        loc = store.Location(model_id, "sampler_weights", store.check_name(name)) if name else None

        def run() -> dict:
            from safetensors.torch import save_file

            t = self._trained(m)
            m.saves += 1
            key = loc.path if loc else f"tinker://{model_id}/sampler_weights/ephemeral-{m.saves:06d}"
            full, adapters, scale = t.sampler_snapshot()
            snap = Snapshot(key, t.steps, full, adapters, scale)  # its policy version: the steps taken
            with self._lock:
                m.snapshots[key] = snap
                while len(m.snapshots) > self.settings.snapshots_in_memory:
                    m.snapshots.popitem(last=False)
            if loc is not None:
                folder = self.store.folder(loc, create=True)
                merged = snap.tensors if snap.tensors is not None else t.sampler_weights()
                save_file({k: v.contiguous() for k, v in merged.items()}, str(folder / "model.safetensors"))
                self.store.write_meta(loc, self._meta(m, version=snap.version, steps=t.steps))
                return {"type": "save_weights_for_sampler", "path": loc.path}
            sid = self._new_sampling_session(m.session_id, m.folder, key, None)
            # No path for an unnamed snapshot: SDKs up to 0.16 assert there is none.
            return {"type": "save_weights_for_sampler", "sampling_session_id": sid}

        return self.ordered(model_id, seq_id, run)

    def close(self) -> None:
        self._train.shutdown(wait=False, cancel_futures=True)
        for s in self.samplers.values():
            s.close()


def default_root() -> str:
    return str(Path.home() / ".cache" / "tokenflow" / "tinker")
