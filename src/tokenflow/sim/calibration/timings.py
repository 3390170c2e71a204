"""``calibration.json``: component timings of a real run, written by the runtime, read by the simulator.

The runtime fills a :class:`Calibration` while it runs and writes it into the run folder with
:meth:`Calibration.to_json`; ``tokenflow simulate --calibrate RUN_DIR`` reads it back with
:meth:`Calibration.from_json`. The schema is a contract between the two; keep it stable and
add fields only with defaults. All times are seconds of wall clock, all sizes tokens or bytes.

```
{"run": {"mode": "sync"|"async", "prompts_per_step": int, "group_size": int,
         "max_staleness": int, "steps": int, "update_mode": str, "sync_every": int,
         "wall_s": float, "engine_threads": int|null, "trainer_threads": int|null},
 "engine": {"decode_steps": [[num_running_seqs, seconds], ...],
            "prefill": [[num_prompt_tokens, seconds], ...]},
 "completion_lengths": [int, ...], "prompt_lengths": [int, ...],
 "trainer": {"steps": [[num_tokens, seconds], ...]},
 "sync": {"updates": [[num_bytes, seconds], ...], "engine_pauses": [seconds, ...]},
 "measured": {"wall_s": float, "trainer_idle_frac": float, "engine_idle_frac": float,
              "steps": int}}
```
What each entry measures:

* ``engine.decode_steps``: one entry per decode step: sequences in the batch, step seconds.
* ``engine.prefill``: one entry per prefill call: tokens actually prefilled (a prompt shared by
  the G samples of a group counts once), call seconds.
* ``completion_lengths`` / ``prompt_lengths``: one entry per rollout / per prompt, tokens.
* ``trainer.steps``: one entry per optimizer step: prompt + completion tokens in the batch, and
  the seconds of the step's compute (log-prob recompute, forward, backward, optimizer), not
  the wait for data and not the weight sync.
* ``sync.updates``: one entry per weight update: bytes sent, seconds the trainer was blocked
  sending them (including any wait for a free slot or for the engines to join).
* ``sync.engine_pauses``: one entry per weight swap in an engine: seconds decoding stopped
  (optional; missing means swaps are free).
* ``measured``: the run's outcome; the simulator predicts it and never fits to it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

FILENAME = "calibration.json"


def _known(cls, d: dict):
    return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


@dataclass
class RunInfo:
    mode: str
    """"sync" or "async"."""
    prompts_per_step: int
    group_size: int
    max_staleness: int
    steps: int
    update_mode: str
    sync_every: int
    wall_s: float
    """Wall seconds of the run (also in ``measured``; kept for the runtime's convenience)."""
    engine_threads: int | None = None
    """CPU threads given to the engine process (None on GPU)."""
    trainer_threads: int | None = None
    """CPU threads given to the trainer process (None on GPU)."""


@dataclass
class EngineTimings:
    decode_steps: list[list[float]] = field(default_factory=list)
    """[[num_running_seqs, seconds], ...] per decode step."""
    prefill: list[list[float]] = field(default_factory=list)
    """[[num_prompt_tokens, seconds], ...] per prefill call."""


@dataclass
class TrainerTimings:
    steps: list[list[float]] = field(default_factory=list)
    """[[num_tokens, seconds], ...] per optimizer step (compute only)."""


@dataclass
class SyncTimings:
    updates: list[list[float]] = field(default_factory=list)
    """[[num_bytes, seconds], ...] per weight update (trainer side)."""
    engine_pauses: list[float] = field(default_factory=list)
    """Seconds of decoding stopped per weight swap (engine side)."""


@dataclass
class Measured:
    wall_s: float
    trainer_idle_frac: float
    engine_idle_frac: float
    steps: int


@dataclass
class Calibration:
    run: RunInfo
    engine: EngineTimings = field(default_factory=EngineTimings)
    completion_lengths: list[int] = field(default_factory=list)
    prompt_lengths: list[int] = field(default_factory=list)
    trainer: TrainerTimings = field(default_factory=TrainerTimings)
    sync: SyncTimings = field(default_factory=SyncTimings)
    measured: Measured | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Calibration:
        """Read a dict; keys this version does not know are ignored (a newer runtime may add some)."""
        return cls(
            run=_known(RunInfo, d["run"]),
            engine=_known(EngineTimings, d.get("engine", {})),
            completion_lengths=[int(x) for x in d.get("completion_lengths", [])],
            prompt_lengths=[int(x) for x in d.get("prompt_lengths", [])],
            trainer=_known(TrainerTimings, d.get("trainer", {})),
            sync=_known(SyncTimings, d.get("sync", {})),
            measured=_known(Measured, d["measured"]) if d.get("measured") else None,
        )

    def to_json(self, path: str | Path) -> Path:
        """Write to ``path`` (a file, or a run folder that gets ``calibration.json``)."""
        path = Path(path)
        if path.is_dir():
            path = path / FILENAME
        path.write_text(json.dumps(self.to_dict(), indent=1), encoding="utf-8")
        return path

    @classmethod
    def from_json(cls, path: str | Path) -> Calibration:
        """Read from ``path`` (a file, or a run folder holding ``calibration.json``)."""
        path = Path(path)
        if path.is_dir():
            path = path / FILENAME
        return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))
