"""The trainer process: batches in, one optimizer step each, new weights out to the engines.

The trainer never waits for generation except when the buffer has no full batch for it; weight
sync happens right after a step (every ``sync.every`` steps) and is timed phase by phase. With
``trainer.world_size > 1`` there is one such process per rank, sharded with FSDP2; rank 0 is
the one the runtime and the engines see.
"""

from __future__ import annotations

import logging
import queue
import time

from tokenflow.host_memory import release_freed_memory
from tokenflow.metrics import trace
from tokenflow.runtime.workers.checkpoint_writer import CheckpointWriter, load_trainer_state
from tokenflow.runtime.workers.commands import decode_command, encode_command
from tokenflow.runtime.workers.messages import (
    EngineReplaced,
    Envelope,
    PushWeights,
    RelayedNotice,
    ReformSync,
    ReleaseHostMemory,
    ResizeSync,
    Save,
    Shutdown,
    SyncBroken,
    SyncReformed,
    Train,
    Trained,
    TrainerReady,
    WorkerBooted,
)
from tokenflow.runtime.workers.process import ParentWatch, worker_main

log = logging.getLogger(__name__)


def _exhaust(weights) -> None:
    """Walk a weights iterator to its end: a sharded trainer's gathers happen as it is walked,
    and every rank must make all of them."""
    for _ in weights:
        continue


class _Relay:
    """Engine ``index``'s command queue as the trainer sees it once that engine was replaced
    (its new queue is not one this process can open): notices go through the orchestrator."""

    def __init__(self, out_q, name: str, index: int) -> None:
        self.out_q, self.name, self.index = out_q, name, index

    def put(self, msg) -> None:
        self.out_q.put(Envelope(self.name, RelayedNotice(self.index, msg)))


class TrainerWorker:
    """One trainer rank. Rank 0 talks to the runtime and the engines; with ``rendezvous`` set
    (``trainer.world_size > 1``) it forwards every command to the other ranks, which run the
    same code on it (see ``tokenflow.trainer.distributed``)."""

    def __init__(self, model_path: str, cfg, out_q, cmd_q, engine_qs, resume_dir: str | None,
                 name: str = "trainer", trace_dir: str | None = None, rank: int = 0, rendezvous=None) -> None:
        from tokenflow.engine.loading.tokenizer_files import read_tokenizer
        from tokenflow.metrics import phases

        phases.mark(f"{name}/imported")
        trace.configure(trace_dir, name)
        self.name, self.out_q, self.cmd_q, self.engine_qs, self.cfg = name, out_q, cmd_q, engine_qs, cfg
        self.rank, self.group, self.sender = rank, None, None
        self.parent = ParentWatch()
        self.sync_error: str | None = None  # a failed push, reported after the step
        self._retired: list = []  # senders of broadcast groups replaced by reform_sync
        self.last_notice = None  # the last weight notice sent, for an engine replaced after it
        tokenizer = read_tokenizer(model_path)
        self.trainer = self._build(model_path, cfg, tokenizer, rendezvous)
        if resume_dir is not None:
            self._phase("resume", lambda: load_trainer_state(self.trainer, resume_dir))
        self.writer = CheckpointWriter(self.trainer, out_q, name, writes=rank == 0)
        if rank == 0:
            self._attach_sender()

    def _build(self, model_path, cfg, tokenizer, rendezvous):
        from tokenflow.trainer import Trainer

        if rendezvous is None:
            return Trainer(model_path, cfg.trainer, cfg.algorithm, tokenizer=tokenizer)
        import dataclasses

        import torch

        from tokenflow.trainer.distributed import RankGroup
        from tokenflow.trainer.fsdp import FSDPTrainer
        from tokenflow.trainer.trainer import resolve_device

        if resolve_device(cfg.trainer.device).type == "cuda":
            torch.cuda.set_device(self.rank % torch.cuda.device_count())
            rendezvous = dataclasses.replace(rendezvous, backend="nccl")
        self.group = RankGroup(rendezvous, self.rank)
        return FSDPTrainer(model_path, cfg.trainer, cfg.algorithm, group=self.group, tokenizer=tokenizer)

    def _new_sender(self):
        from tokenflow.sync.factory import make_sender

        sync = self.cfg.sync
        opts = {"num_receivers": len(self.engine_qs), "timeout_s": sync.timeout_s}
        if sync.transport == "shared_memory":
            opts.update(slots=sync.slots, abandon=self.parent.orphaned)
        if sync.transport == "broadcast":
            opts.update(bucket_mb=sync.bucket_mb, streams=sync.streams, device=str(self.trainer.device),
                        host=self._sync_host())
        # Shapes only: the layout needs no values, and a sharded trainer's values are collectives.
        shapes = getattr(self.trainer, "weight_shapes", self.trainer.named_weights)()
        wire = self._wire_dtype()
        if wire is not None:  # the slots hold the weights as they travel; packing casts into them
            import torch

            dtype = getattr(torch, wire)
            shapes = [(n, torch.empty(t.shape, dtype=dtype, device="meta")) for n, t in shapes]
        return make_sender(sync.transport, shapes, **opts)

    def _wire_dtype(self) -> str | None:
        from tokenflow.config.sync import wire_dtype

        return wire_dtype(self.cfg.sync, self.cfg.engine.dtype)

    def _sync_host(self) -> str:
        """Where engines reach the broadcast group's store: this node's address on Ray (engines
        may sit on other machines), loopback for the local backend."""
        if self.cfg.runtime.backend == "ray":
            import ray

            return ray.util.get_node_ip_address()
        return "127.0.0.1"

    def _attach_sender(self) -> None:
        self.sender = self._new_sender()
        if self.cfg.sync.transport == "broadcast":  # a push then sends the weights where they are
            self.trainer.place_weights(self.sender.spec.layout)
        n_params = sum(p.numel() for p in self.trainer.model.parameters())
        from tokenflow.metrics import phases

        phases.mark(f"{self.name}/loaded")
        self.out_q.put(Envelope(self.name, WorkerBooted(self.name, phases.worker_marks(self.name))))
        self.out_q.put(Envelope(self.name, TrainerReady(self.trainer.version, self.sender.spec, n_params)))
        self.sender.connect()

    def reform_sync(self) -> dict[str, float]:
        """A new broadcast group after an engine was replaced, then a push of the current weights
        (every rank takes part: a sharded trainer gathers). The old group is retired, not torn
        down: a receiver of it may still be blocked in a broadcast, and gloo's destructor would
        wait for that. The layout is the same, so placed weights stay where they are."""
        if self.rank == 0:
            self.sender.close()
            self._retired.append(self.sender)
            self.sender = self._new_sender()
            self.out_q.put(Envelope(self.name, SyncReformed(self.sender.spec, self.trainer.version)))
            with trace.span("sync/reform"):
                self.sender.connect()
        return self.push_weights()

    def resize_sync(self) -> dict[str, float]:
        """The weight sync rebuilt for a new set of engines (``ResizeSync``; ``engine_qs`` is
        already the new set). Broadcast: a re-formed group, as after a restart. Shared memory:
        new slots sized for the new count, the current weights packed into them before
        ``SyncReformed`` goes out and without a notice (an engine still attached to the old slots
        would read the notice there), so every engine loads them when it attaches."""
        if self.cfg.sync.transport == "broadcast":
            return self.reform_sync()
        if self.rank == 0:
            self.sender.close()  # the engines' mappings of the old slots stay valid until they detach
            self.sender = self._new_sender()
        timings = self.push_weights(notify=lambda msg: None)
        if self.rank == 0:
            self.out_q.put(Envelope(self.name, SyncReformed(self.sender.spec, self.trainer.version)))
        return timings

    def _phase(self, what: str, fn):
        """Run ``fn`` on every rank; with several ranks a failure names where each rank was."""
        return self.group.run(what, fn) if self.group is not None else fn()

    def notify_engines(self, msg) -> None:
        self.last_notice = msg
        for q in self.engine_qs:
            q.put(msg)

    def relay_to(self, index: int) -> None:
        """Engine ``index`` was replaced: reach it through the orchestrator, starting with the last
        notice (sent to the dead engine's queue, or before the new one attached)."""
        old = self.engine_qs[index]
        if hasattr(old, "cancel_join_thread"):  # nobody reads it again: never wait on its feeder
            old.cancel_join_thread()
        self.engine_qs[index] = _Relay(self.out_q, self.name, index)
        if self.last_notice is not None:
            self.engine_qs[index].put(self.last_notice)

    def push_weights(self, notify=None) -> dict[str, float]:
        # A broadcast takes the weights where they live (GPU for NCCL); shared memory wants CPU.
        on_device = self.cfg.sync.transport == "broadcast"
        named = lambda: self.trainer.named_weights(cpu=not on_device)  # noqa: E731
        if self.sender is None:  # ranks > 0: take part in the gathers rank 0's send makes
            for _ in range(2 if self.cfg.sync.checksum else 1):
                _exhaust(named())
            return {}
        checksum = None
        if self.cfg.sync.checksum:
            from tokenflow.engine import weights_checksum

            wire = self._wire_dtype()
            # of the values the engine receives: the weights rounded to the dtype they travel as
            named_now = self.trainer.named_weights()
            if wire is not None:
                import torch

                named_now = ((n, t.to(getattr(torch, wire))) for n, t in named_now)
            checksum = weights_checksum(named_now)
        weights = named()
        with trace.span("sync/send", version=self.trainer.version):
            try:
                return self.sender.send(weights, self.trainer.version, notify=notify or self.notify_engines,
                                        checksum=checksum)
            except (TimeoutError, RuntimeError) as e:
                if not on_device:
                    raise
                # A receiver dropped out of the broadcast (its engine died, say). The step stands;
                # finish the walk over the weights so a sharded trainer's gathers stay in step,
                # and let the orchestrator decide: re-form the group once the engine is back, or
                # stop the run.
                _exhaust(weights)
                self.sync_error = f"{type(e).__name__}: {e}"
                return {"sync/failed": 1.0}

    def _report_broken_sync(self) -> None:
        if self.rank == 0 and self.sync_error is not None:
            self.out_q.put(Envelope(self.name, SyncBroken(self.trainer.version, self.sync_error)))
            self.sync_error = None

    def execute(self, msg) -> bool:
        """Run one command on this rank; False once it is time to stop."""
        if isinstance(msg, Train):
            t0 = time.perf_counter()
            with trace.span("trainer/step", step=msg.step):
                metrics = self._phase(f"train step {msg.step}", lambda: self.trainer.train_step(msg.rollouts))
            t1 = time.perf_counter()
            if msg.sync_weights:
                metrics.update(self._phase(f"weight push {self.trainer.version}", self.push_weights))
                self._report_broken_sync()
            t2 = time.perf_counter()
            metrics["sync/trainer_s"] = t2 - t1
            if self.rank == 0:
                self.out_q.put(Envelope(self.name, Trained(msg.step, self.trainer.version, metrics, t1 - t0,
                                                           t2 - t1, int(metrics.get("perf/train_tokens", 0)))))
        elif isinstance(msg, Save):
            with trace.span("trainer/save", background=msg.background):
                self.writer.save(msg.directory, msg.background, self._phase)
        elif isinstance(msg, ReformSync):
            log.warning("%s: %s was replaced; re-forming the weight-sync group", self.name, msg.engine)
            self._phase("weight-sync reform", self.reform_sync)
            self._report_broken_sync()
        elif isinstance(msg, ResizeSync):
            log.info("%s: the engines changed (%s); rebuilding the weight sync for %d", self.name, msg.engine,
                     len(msg.inboxes))
            self.engine_qs = list(msg.inboxes)
            self._phase("weight-sync resize", self.resize_sync)
            self._report_broken_sync()
        elif isinstance(msg, PushWeights):
            self._phase(f"weight push {self.trainer.version}", self.push_weights)
            self._report_broken_sync()
        elif isinstance(msg, EngineReplaced):
            if self.rank == 0:
                self.relay_to(msg.index)
        elif isinstance(msg, ReleaseHostMemory):
            with trace.span("host/release_memory"):
                release_freed_memory()
        elif isinstance(msg, Shutdown):
            return False
        else:
            raise TypeError(f"trainer worker got an unknown message {type(msg).__name__}")
        return True

    def next_command(self, parent: ParentWatch):
        """Rank 0 reads the runtime's queue and forwards; other ranks read what rank 0 forwarded.
        None when the orchestrator is gone."""
        if self.rank > 0:
            blob = self.group.next_command(parent.orphaned)
            msg = None if blob is None else decode_command(blob)
        else:
            while True:
                try:
                    msg = self.cmd_q.get(timeout=1.0)
                    break
                except queue.Empty:
                    if parent.orphaned():
                        msg = None
                        break
            if msg is not None and self.group is not None:
                # The other ranks need no engine handles: they take part in a resize's gathers as
                # in a re-formed group's.
                forward = ReformSync(msg.engine) if isinstance(msg, ResizeSync) else msg
                self.group.post(encode_command(forward))
        if msg is None:
            log.warning("%s: the orchestrator is gone; exiting", self.name)
        elif self.group is not None:
            self.group.barrier(f"{type(msg).__name__} (command {self.group.seq})")
        return msg

    def loop(self) -> None:
        while True:
            msg = self.next_command(self.parent)
            if msg is None or not self.execute(msg):
                break
        self.writer.wait()  # a checkpoint still being written is finished, not torn
        if self.sender is not None:
            self.sender.close()
        if self.group is not None:
            self.group.close()
        trace.flush()


def run_trainer_worker(model_path, cfg, out_q, cmd_q, engine_qs, resume_dir=None, name="trainer",
                       trace_dir=None, rank=0, rendezvous=None) -> None:
    """Process entry point (spawned)."""
    worker_main(name, out_q, lambda: TrainerWorker(model_path, cfg, out_q, cmd_q, engine_qs, resume_dir,
                                                   name, trace_dir, rank, rendezvous).loop())
