"""Typed messages between the orchestrator, the engine worker and the trainer worker.

Nothing but these dataclasses (and the ``Rollout`` records and ``WeightsReady`` notices they
carry) crosses a process boundary, so each side can read what the other may send.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tokenflow.rollout import Rollout

RequestKind = Literal["train", "eval"]


# ---- orchestrator → engine -----------------------------------------------------------------
@dataclass(frozen=True)
class Generate:
    """Sample ``params.n`` completions of one prompt; they come back as one ``Generated`` group."""

    group_id: int
    prompt_id: int
    prompt_ids: list[int]
    params: object  # tokenflow.engine.SamplingParams (kept untyped here to stay import-light)
    kind: RequestKind = "train"
    episode: object = None
    """An environment task's `tokenflow.runtime.drivers.episodes.EpisodeSpec`: the engine worker runs
    ``params.n`` multi-turn episodes (``prompt_ids`` is then unused: each reset gives its own)."""
    kept: tuple = ()
    """Rollouts of this group a checkpoint kept (a resumed run): finished samples come back as
    they are, partial ones (finish reason "abort") are continued from their tokens, the others
    are generated afresh."""


@dataclass(frozen=True)
class AttachSync:
    """The trainer's weight-sync spec; the engine builds its receiver from it."""

    spec: object  # tokenflow.sync.base.SyncSpec
    receiver_index: int = 0
    # Generate nothing until weights of at least this version are loaded: after a broadcast group
    # is re-formed the trainer's catch-up push is on its way, and a restarted engine holds only
    # the weights it was built with.
    min_version: int = 0


@dataclass(frozen=True)
class SetPaused:
    """Blocking mode: generation and training take turns."""

    paused: bool


@dataclass(frozen=True)
class SetThreads:
    """Use this many torch threads: the trainer's cores are free while it waits for a batch
    (``runtime.lend_trainer_threads``) and after the last step, and the engines get them."""

    threads: int


@dataclass(frozen=True)
class AbortKind:
    """Drop every unfinished request of this kind (e.g. leftover training work before the final eval)."""

    kind: RequestKind


@dataclass(frozen=True)
class Shutdown:
    pass


@dataclass(frozen=True)
class ReportInFlight:
    """A checkpoint is being taken: send back (``InFlight``) what the unfinished groups of this
    kind hold so far."""

    step: int
    kind: RequestKind = "train"


# ---- engine → orchestrator -----------------------------------------------------------------
@dataclass
class InFlight:
    """The answer to ``ReportInFlight``: per unfinished group, its finished samples and the
    running ones' tokens so far (partial rollouts); the groups whose state cannot be kept (an
    environment's or an agent's episodes) are only named."""

    step: int
    groups: dict[int, list[Rollout]]
    unkeepable: list[int] = field(default_factory=list)


@dataclass
class Generated:
    """All samples of one ``Generate`` request, finished."""

    group_id: int
    kind: RequestKind
    rollouts: list[Rollout]


@dataclass
class WeightsLoaded:
    version: int
    timings: dict[str, float]


@dataclass
class EngineStatus:
    """Cumulative counters since the worker started, sent about once a second and on demand."""

    version: int
    busy_s: float
    wall_s: float
    tokens: int
    decode_steps: int
    decode_s: float
    prefill_tokens: int
    prefill_s: float
    running: int
    waiting: int
    pauses: list[float] = field(default_factory=list)
    """Engine pause per weight update since the last status (seconds)."""
    decode_samples: list[tuple[int, float]] = field(default_factory=list)
    """(running sequences, seconds) per decode step since the last status, for calibration."""
    prefill_samples: list[tuple[int, float]] = field(default_factory=list)


# ---- orchestrator → trainer ----------------------------------------------------------------
@dataclass
class Train:
    step: int
    rollouts: list[Rollout]
    sync_weights: bool = True
    """Push the new weights to the engines after this step."""


@dataclass(frozen=True)
class Save:
    """Checkpoint the trainer into ``directory``. ``background``: copy the state to CPU memory,
    answer ``Saved`` at once and write the files in a background thread (``SaveWritten`` when
    they are on disk); otherwise write them first."""

    directory: str
    background: bool = True


@dataclass(frozen=True)
class ReformSync:
    """Broadcast transport: an engine was replaced, and a gloo/NCCL group cannot take in a new
    member. Build a new group, hand its spec back (``SyncReformed``), wait until every engine
    has joined it, and push the current weights to all of them."""

    engine: str


@dataclass(frozen=True)
class ResizeSync:
    """Engines joined or left the run (``tokenflow.runtime.orchestrator.elastic``): notify
    ``inboxes`` from now on, and rebuild the weight sync for their number. Broadcast: a new group,
    as for ``ReformSync``. Shared memory: new slots for the new count, holding the current weights
    before anyone is told, so an engine that attaches loads them from the slots. Either way the
    answer is ``SyncReformed``. Only rank 0 reads it (ranks > 0 get a ``ReformSync``: they take
    part in the gathers the same way)."""

    inboxes: tuple
    """Each engine's command queue, in receiver order (Ray: ``ActorInbox`` handles)."""
    engine: str
    """The engine that joined or left, for the log."""


@dataclass(frozen=True)
class EngineReplaced:
    """Local backend: engine ``index`` is a new process with a new command queue, which this
    trainer cannot reach. Its weight notices go through the orchestrator from now on
    (``RelayedNotice``), the last one sent at once (the new engine may have attached after it)."""

    index: int


@dataclass(frozen=True)
class ReleaseHostMemory:
    """The last step is done (sent before the final checkpoint's ``Save``): hand the heap's free
    pages back. A CPU trainer keeps them between steps for speed (``trainer.keep_host_memory``),
    2 GB or more of a laptop run's memory, which the final checkpoint's write and the final
    evaluation would otherwise come on top of."""


@dataclass(frozen=True)
class PushWeights:
    """Push the current weights now, without a step: a replaced trainer's catch-up, so that an
    engine that attaches to its new weight sync finds the version the others hold."""


# ---- trainer → orchestrator ----------------------------------------------------------------
@dataclass(frozen=True)
class RelayedNotice:
    """A weight notice (``WeightsReady``) for engine ``index``, which the orchestrator forwards
    (see ``EngineReplaced``)."""

    index: int
    notice: object

@dataclass
class TrainerReady:
    version: int
    sync_spec: object
    num_parameters: int


@dataclass
class Trained:
    step: int
    version: int
    metrics: dict[str, float]
    train_s: float
    sync_s: float
    num_tokens: int


@dataclass(frozen=True)
class Saved:
    """The trainer holds a copy of its state and is free to train on."""

    directory: str
    snapshot_s: float = 0.0
    """How long the trainer was held up, ``waited_s`` included."""
    waited_s: float = 0.0
    """Of it, the wait for the previous checkpoint's write to end (one write at a time)."""


@dataclass(frozen=True)
class SaveWritten:
    """The trainer's part of a checkpoint is on disk in ``directory`` (or failed: ``error``,
    with the OSError's ``errno`` when it was one)."""

    directory: str
    write_s: float = 0.0
    error: str = ""
    errno: int = 0


@dataclass
class SyncReformed:
    """A new weight-sync group is waiting for the engines; its catch-up push carries ``version``."""

    sync_spec: object
    version: int


@dataclass(frozen=True)
class SyncBroken:
    """A weight push failed part-way (broadcast: a receiver dropped out, e.g. its engine died).
    The step itself stands; engines keep older weights until a re-formed group brings newer."""

    version: int
    error: str


# ---- backend → orchestrator ----------------------------------------------------------------
@dataclass(frozen=True)
class WorkerRestarted:
    """A worker process died and its replacement is up (``runtime.max_worker_restarts``).
    Whatever the dead process held is gone; the orchestrator re-sends its work and sync spec."""

    worker: str
    restarts: int


# ---- any worker → orchestrator -------------------------------------------------------------
@dataclass(frozen=True)
class WorkerBooted:
    """A worker is built (imports done, model loaded): its start-up marks (``runtime.phases``,
    seconds since the epoch), for the run's phase breakdown. Informational only."""

    worker: str
    marks: dict


@dataclass(frozen=True)
class WorkerFailed:
    worker: str
    error: str
    traceback: str
    user_error: bool = False
    """The worker raised a `tokenflow.errors.CheckpointError` (a run folder's file that does not
    read): the run ends with the one-line message, exit 2, not a traceback."""


@dataclass(frozen=True)
class Envelope:
    """What goes on the shared result queue: the sender's name and its message."""

    worker: str
    message: object
