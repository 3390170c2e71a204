"""Training runs and their checkpoints as the SDK's RestClient sees them (a mixin of the service):
weights info, checkpoint listing and deletion, a run's record, a model created from a saved
state, and unloading a model."""

from __future__ import annotations

import datetime as dt

from tokenflow.tinker import store
from tokenflow.tinker.errors import user_error
from tokenflow.tinker.training import Lora


def _when(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat()


class RunsMixin:
    def weights_info(self, path: str) -> dict:
        meta = self.store.meta(store.parse(path))
        lora = meta.get("lora")
        return {"base_model": meta["base_model"], "is_lora": lora is not None,
                "lora_rank": lora["rank"] if lora else None,
                **({k: lora[k] for k in ("train_unembed", "train_mlp", "train_attn")} if lora else {})}

    def _checkpoint(self, loc: store.Location, meta: dict) -> dict:
        return {"checkpoint_id": f"{loc.kind}/{loc.name}", "checkpoint_type": store.KINDS[loc.kind],
                "time": _when(meta.get("time", 0.0)), "tinker_path": loc.path, "size_bytes": self.store.size(loc)}

    def checkpoints(self, model_id: str) -> list[dict]:
        return [self._checkpoint(loc, meta) for loc, meta in self.store.list(model_id)]

    def delete_checkpoint(self, model_id: str, checkpoint_id: str) -> None:
        kind, _, name = checkpoint_id.partition("/")
        self.store.delete(store.parse(f"tinker://{model_id}/{kind}/{name}"))

    def training_run(self, model_id: str) -> dict:
        listed = self.store.list(model_id)
        m = self.models.get(model_id)
        if m is None and not listed:
            raise user_error(f"unknown training run {model_id!r}")
        meta = listed[-1][1] if listed else {}
        lora = (m.lora.__dict__ if m and m.lora else meta.get("lora"))
        last = {k: None for k in ("weights", "sampler_weights")}
        for loc, mt in listed:
            last[loc.kind] = self._checkpoint(loc, mt)
        times = [mt.get("time", 0.0) for _, mt in listed] or [0.0]
        return {"training_run_id": model_id, "base_model": m.base_model if m else meta.get("base_model", ""),
                "model_owner": "local", "is_lora": lora is not None, "lora_rank": lora["rank"] if lora else None,
                "last_request_time": _when(max(times)), "last_checkpoint": last["weights"],
                "last_sampler_checkpoint": last["sampler_weights"]}

    def create_from_state(self, session_id: str, path: str, optimizer: bool, model_seq_id: int | None = None) -> str:
        """A new training client on a saved state (the SDK's create_training_client_from_state)."""
        loc = store.parse(path)
        if loc.kind != "weights":
            raise user_error(f"{path} is a sampler checkpoint; a training client starts from a training state")
        meta = self.store.meta(loc)
        lora = meta.get("lora")
        cfg = None if lora is None else Lora(rank=lora["rank"], train_unembed=lora["train_unembed"],
                                             train_mlp=lora["train_mlp"], train_attn=lora["train_attn"])
        rid, model_id = self.new_model(session_id, meta["base_model"], cfg, model_seq_id)
        inner = self.futures.get(self.load_state(model_id, None, path, optimizer))
        return self.futures.add(_then(self.futures.get(rid), inner, model_id, path))

    def finish_session(self, session_id: str) -> None:
        """The client is done: unload its models (on the training thread, after its calls)."""
        if session_id not in self.sessions:
            return
        for model_id in list(self.sessions[session_id]["models"]):
            if model_id in self.models:
                self.unload(model_id)
        with self._lock:
            for sid in [k for k, v in self.sampling_sessions.items() if v[0] == session_id]:
                del self.sampling_sessions[sid]
            self.sessions.pop(session_id, None)

    def unload(self, model_id: str) -> str:
        m = self.model(model_id)

        def run() -> dict:
            m.training = None  # its memory goes after the calls queued before this one
            m.snapshots.clear()
            return {"type": "unload_model", "model_id": model_id}

        rid = self.ordered(model_id, None, run)
        # Out of the table at once: the slot (--max-models) is free for the next model, whose load
        # queues behind this unload on the same training thread, and new calls to it are refused.
        with self._lock:
            self.models.pop(model_id, None)
            if model_id in self.sessions.get(m.session_id, {}).get("models", []):
                self.sessions[m.session_id]["models"].remove(model_id)
        return rid


def _then(first, second, model_id: str, path: str):
    """A future done when both are: the load's answer, or the first error."""
    from concurrent.futures import Future

    out: Future = Future()

    def done(_):
        if not (first.done() and second.done()) or out.done():
            return
        for f in (first, second):
            if f.exception() is not None:
                out.set_exception(f.exception())
                return
        out.set_result({"type": "load_weights", "path": path, "model_id": model_id})

    first.add_done_callback(done)
    second.add_done_callback(done)
    return out
