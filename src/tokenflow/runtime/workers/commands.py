"""The trainer's commands as bytes for the other ranks: data, never a pickle.

Rank 0 forwards each command it reads from the runtime to ranks 1..N-1 through the TCP store
(`tokenflow.trainer.distributed`); a store is a network service, so what a rank reads from it is
decoded as data: a type from a short list, its scalar fields as JSON, a `Train`'s rollouts as a
safetensors blob (`tokenflow.rollout_files`). Anything else is refused with `CommandError`.
"""

from __future__ import annotations

import dataclasses
import json

from tokenflow.rollout_files import RolloutFileError, decode, encode, metadata
from tokenflow.runtime.workers.messages import (
    EngineReplaced, PushWeights, ReformSync, ReleaseHostMemory, Save, SetThreads, Shutdown, Train,
)

COMMANDS = {cls.__name__: cls for cls in (Train, Save, ReformSync, SetThreads, Shutdown, EngineReplaced,
                                          PushWeights, ReleaseHostMemory)}
"""What rank 0 forwards, by name."""
_KEY = "tokenflow.command"
_PLAIN = {"int": (int,), "bool": (bool,), "str": (str,), "float": (int, float)}  # field annotation → JSON types


class CommandError(ValueError):
    """Bytes that are not a trainer command this module wrote."""


def encode_command(msg) -> bytes:
    name = type(msg).__name__
    if name not in COMMANDS:
        raise TypeError(f"{name} is not a trainer command ({', '.join(COMMANDS)})")
    fields = {f.name: getattr(msg, f.name) for f in dataclasses.fields(msg) if f.name != "rollouts"}
    rollouts = getattr(msg, "rollouts", [])
    return encode(rollouts, extra={_KEY: json.dumps({"type": name, "fields": fields}, allow_nan=False)})


def decode_command(blob: bytes):
    try:
        head = json.loads(metadata(blob)[_KEY])
        cls = COMMANDS[head["type"]]
        fields = dict(head["fields"])
        if cls is Train:
            fields["rollouts"] = decode(blob)
        want = {f.name: f.type for f in dataclasses.fields(cls)}
        if set(fields) - set(want):
            raise CommandError(f"{cls.__name__} has no fields {sorted(set(fields) - set(want))}")
        for k, v in fields.items():
            if k != "rollouts" and type(v) not in _PLAIN.get(want[k], ()):
                raise CommandError(f"{cls.__name__}.{k} is {type(v).__name__} {v!r}, not {want[k]}")
        return cls(**fields)
    except (RolloutFileError, KeyError, TypeError, ValueError) as e:
        if isinstance(e, CommandError):
            raise
        raise CommandError(f"not a trainer command ({type(e).__name__}: {e})") from None
