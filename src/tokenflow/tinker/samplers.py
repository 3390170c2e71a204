"""Sampling sessions as the SDK sees them (a mixin of the service): a session pins the base model
or a snapshot by its key; a sample request finds the snapshot (held in memory, or read back from
a named checkpoint), and queues on the base model's engine (`tokenflow.tinker.sampling`)."""

from __future__ import annotations

import uuid

from tokenflow.tinker import store
from tokenflow.tinker.errors import user_error
from tokenflow.tinker.sampling import BASE, Sampler, Snapshot, keep_last, sample_call


class SamplingMixin:
    def _new_sampling_session(self, session_id: str, folder: str, key: str | None, path: str | None) -> str:
        sid = f"sampler-{uuid.uuid4().hex[:16]}"
        with self._lock:
            self.sampling_sessions[sid] = (session_id, folder, key, path)
        return sid

    def create_sampling_session(self, session_id: str, base_model: str | None, model_path: str | None) -> str:
        self.session(session_id)
        if model_path:
            snap, folder = self._snapshot(model_path)
            return self._new_sampling_session(session_id, folder, snap.key, model_path)
        if base_model:
            return self._new_sampling_session(session_id, self.resolve(base_model), None, None)
        raise user_error("create_sampling_session needs base_model or model_path")

    def _snapshot(self, path: str) -> tuple[Snapshot, str]:
        loc = store.parse(path)
        if loc.kind != "sampler_weights":
            raise user_error(f"{path} is a training state; sample from a sampler checkpoint "
                             "(save_weights_for_sampler) instead")
        m = self.models.get(loc.model_id)
        if m is not None and path in m.snapshots:
            return m.snapshots[path], m.folder
        if loc.name.startswith("ephemeral-"):
            raise user_error(f"{path} is no longer held (only the newest {self.settings.snapshots_in_memory} "
                             "snapshots per model are kept in memory): save the weights again")
        with self._lock:
            if path in self._from_disk:
                self._from_disk.move_to_end(path)
                return self._from_disk[path]
        meta = self.store.meta(loc)
        from safetensors.torch import load_file

        tensors = load_file(str(self.store.folder(loc) / "model.safetensors"))
        found = Snapshot(path, int(meta.get("version", 0)), tensors), self.resolve(meta["base_model"])
        with self._lock:
            self._from_disk[path] = found
            while len(self._from_disk) > self.settings.snapshots_in_memory:
                self._from_disk.popitem(last=False)
        return found

    def sampler_info(self, sampler_id: str) -> dict:
        s = self.sampling_sessions.get(sampler_id)
        if s is None:
            raise user_error(f"unknown sampling session {sampler_id!r}")
        return {"sampler_id": sampler_id, "base_model": s[1], "model_path": s[3]}

    def sampler_for(self, folder: str) -> Sampler:
        with self._lock:
            if folder not in self.samplers:
                self.samplers[folder] = Sampler(folder, threads=self.settings.threads, dtype=self.settings.dtype)
            return self.samplers[folder]

    def sample(self, req: dict) -> str:
        sid = req.get("sampling_session_id")
        if sid:
            if sid not in self.sampling_sessions:
                raise user_error(f"unknown sampling_session_id {sid!r}")
            _, folder, key, _ = self.sampling_sessions[sid]
            snap = BASE if key is None else self._snapshot(key)[0]
        elif req.get("model_path"):
            snap, folder = self._snapshot(req["model_path"])
        elif req.get("base_model"):
            snap, folder = BASE, self.resolve(req["base_model"])
        else:
            raise user_error("sample needs sampling_session_id, model_path or base_model")
        call = sample_call(req, snap)
        sampler = self.sampler_for(folder)
        fut = sampler.submit(call)
        if call.prompt_logprobs_last_n is not None:
            fut = keep_last(fut, call.prompt_logprobs_last_n)
        return self.futures.add(fut)
