"""Read the history rows back from an offline W&B run file (``run-<id>.wandb``).

The file is a W&B header (7 bytes) followed by records in 32 KiB blocks, each chunk with a
7-byte header (CRC32C, little-endian length, type: 1 full, 2 first, 3 middle, 4 last); a record
is a ``wandb_internal_pb2.Record`` protobuf. Only what the tests need: history rows as dicts.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

BLOCK = 32 * 1024
HEADER = 7


def records(path: Path) -> list[bytes]:
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    out, buf, pos = [], b"", HEADER
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # block trailer padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        pos += HEADER
        if kind == 0 and length == 0:
            break
        buf += data[pos:pos + length]
        pos += length
        if kind in (1, 4):
            out.append(buf)
            buf = b""
    return out


def history(path: Path, wait_s: float = 20.0) -> list[dict]:
    """History rows of a finished run. W&B's service process may still be writing the file
    when ``finish()`` returns, so wait (up to ``wait_s``) for the run's exit record."""
    from wandb.proto import wandb_internal_pb2 as pb

    deadline = time.monotonic() + wait_s
    while True:
        rows, finished = [], False
        for raw in records(path):
            rec = pb.Record()
            rec.ParseFromString(raw)
            kind = rec.WhichOneof("record_type")
            finished |= kind == "exit"
            if kind == "history":
                rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                             for i in rec.history.item})
        if finished or time.monotonic() > deadline:
            return rows
        time.sleep(0.1)
