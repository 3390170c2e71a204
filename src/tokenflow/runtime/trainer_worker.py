"""The trainer process: batches in, one optimizer step each, new weights out to the engines.

The trainer never waits for generation except when the buffer has no full batch for it; weight
sync happens right after a step (every ``sync.every`` steps) and is timed phase by phase.
"""

from __future__ import annotations

import logging
import queue
import time
from pathlib import Path

from tokenflow.metrics import trace
from tokenflow.runtime.messages import Envelope, Save, Saved, Shutdown, Train, Trained, TrainerReady
from tokenflow.runtime.workers import ParentWatch, worker_main

log = logging.getLogger(__name__)

STATE_FILE = "trainer_state.pt"


def save_trainer(trainer, directory: str | Path) -> None:
    """Policy in Hugging Face format plus optimizer/scheduler/RNG/version (without a second copy
    of the weights)."""
    import torch

    directory = Path(directory)
    trainer.save_pretrained(directory / "model")
    state = trainer.state_dict()
    state.pop("model")
    torch.save(state, directory / STATE_FILE)


def load_trainer_state(trainer, directory: str | Path) -> None:
    import torch

    state = torch.load(Path(directory) / STATE_FILE, weights_only=False)
    state["model"] = trainer.model.state_dict()  # already loaded from directory/model
    trainer.load_state_dict(state)


class TrainerWorker:
    def __init__(self, model_path: str, cfg, out_q, cmd_q, engine_qs, resume_dir: str | None,
                 name: str = "trainer", trace_dir: str | None = None) -> None:
        from transformers import AutoTokenizer

        from tokenflow.sync.base import make_sender
        from tokenflow.trainer import Trainer

        trace.configure(trace_dir, name)
        self.name, self.out_q, self.cmd_q, self.engine_qs, self.cfg = name, out_q, cmd_q, engine_qs, cfg
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.trainer = Trainer(model_path, cfg.trainer, cfg.algorithm, tokenizer=tokenizer)
        if resume_dir is not None:
            load_trainer_state(self.trainer, resume_dir)
        sync = cfg.sync
        opts = {"num_receivers": len(engine_qs), "timeout_s": sync.timeout_s}
        if sync.transport == "broadcast":
            opts.update(bucket_mb=sync.bucket_mb, device=str(self.trainer.device))
        self.sender = make_sender(sync.transport, self.trainer.named_weights(), **opts)
        n_params = sum(p.numel() for p in self.trainer.model.parameters())
        out_q.put(Envelope(name, TrainerReady(self.trainer.version, self.sender.spec, n_params)))
        self.sender.connect()

    def notify_engines(self, msg) -> None:
        for q in self.engine_qs:
            q.put(msg)

    def push_weights(self) -> dict[str, float]:
        checksum = None
        if self.cfg.sync.checksum:
            from tokenflow.engine import weights_checksum

            checksum = weights_checksum(self.trainer.named_weights())
        with trace.span("sync/send", version=self.trainer.version):
            return self.sender.send(self.trainer.named_weights(), self.trainer.version,
                                    notify=self.notify_engines, checksum=checksum)

    def loop(self) -> None:
        parent = ParentWatch()
        while True:
            try:
                msg = self.cmd_q.get(timeout=1.0)
            except queue.Empty:
                if parent.orphaned():
                    log.warning("%s: the orchestrator is gone; exiting", self.name)
                    break
                continue
            if isinstance(msg, Train):
                t0 = time.perf_counter()
                with trace.span("trainer/step", step=msg.step):
                    metrics = self.trainer.train_step(msg.rollouts)
                t1 = time.perf_counter()
                if msg.sync_weights:
                    metrics.update(self.push_weights())
                t2 = time.perf_counter()
                metrics["sync/trainer_s"] = t2 - t1
                self.out_q.put(Envelope(self.name, Trained(msg.step, self.trainer.version, metrics,
                                                           t1 - t0, t2 - t1, int(metrics.get("perf/train_tokens", 0)))))
            elif isinstance(msg, Save):
                with trace.span("trainer/save"):
                    save_trainer(self.trainer, msg.directory)
                self.out_q.put(Envelope(self.name, Saved(msg.directory)))
            elif isinstance(msg, Shutdown):
                break
            else:
                raise TypeError(f"trainer worker got an unknown message {type(msg).__name__}")
        self.sender.close()
        trace.flush()


def run_trainer_worker(model_path, cfg, out_q, cmd_q, engine_qs, resume_dir=None, name="trainer",
                       trace_dir=None) -> None:
    """Process entry point (spawned)."""
    worker_main(name, out_q, lambda: TrainerWorker(model_path, cfg, out_q, cmd_q, engine_qs,
                                                   resume_dir, name, trace_dir).loop())
