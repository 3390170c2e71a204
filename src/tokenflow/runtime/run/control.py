"""Commands to a running run through its folder: `tokenflow engines add|remove|list`.

    tokenflow engines add --run R ──► R/control/requests/<id>.json ──► orchestrator (polls twice a second)
                                      R/control/replies/<id>.json   ◄── accepted, then done or failed
                                      R/control/engines.json        ◄── the engines now (rewritten on change)

A file in the run folder rather than a socket: no port to open or guard, it works wherever the
run folder is readable (a shared filesystem on a cluster), and whoever may write the folder may
already stop the run. Everything read from ``requests/`` is still treated as hostile: only names
this module writes (32 hex digits), regular files (no symlinks followed), at most
``MAX_REQUEST_BYTES``, strict JSON with exactly the known fields and types; anything else is
answered with an error reply (or, for a name that cannot carry one, deleted) and changes nothing.
Nothing is ever executed or unpickled. Replies and the status file are written to a temporary
name and renamed, so a reader never sees half a file.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import stat
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

MAX_REQUEST_BYTES = 4096
MAX_COUNT = 16
"""The most engines one request may add or remove."""
MAX_PER_POLL = 8
"""Requests read per poll; the rest wait for the next one (a flood cannot stall the run)."""
OPS = ("add", "remove")
_ID = re.compile(r"^[0-9a-f]{32}$")
ENGINE_NAME = re.compile(r"^engine[0-9]{0,4}$")


class ControlError(ValueError):
    """A request that cannot be sent or was refused; the message says why, in one line."""


@dataclass(frozen=True)
class Request:
    id: str
    op: str
    count: int = 1
    engine: str | None = None


def control_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "control"


def validate(fields: dict) -> tuple[str, int, str | None]:
    """(op, count, engine) from a request's fields, or `ControlError` saying what is wrong."""
    if not isinstance(fields, dict):
        raise ControlError(f"a request is a JSON object, not {type(fields).__name__}")
    unknown = sorted(set(fields) - {"op", "count", "engine"})
    if unknown:
        raise ControlError(f"unknown field(s) {unknown}; a request has op, count, engine")
    op = fields.get("op")
    if op not in OPS:
        raise ControlError(f"op must be one of {list(OPS)}, not {op!r}")
    count = fields.get("count", 1)
    if type(count) is not int or not 1 <= count <= MAX_COUNT:
        raise ControlError(f"count must be an integer from 1 to {MAX_COUNT}, not {count!r}")
    engine = fields.get("engine")
    if engine is not None:
        if op != "remove":
            raise ControlError("engine names the engine to remove; an added engine gets a new name")
        if not isinstance(engine, str) or not ENGINE_NAME.match(engine):
            raise ControlError(f"engine must be an engine's name (engine, engine0, engine1, ...), not {engine!r}")
        if count != 1:
            raise ControlError("name one engine, or give a count, not both")
    return op, count, engine


def run_is_live(run_dir: str | Path) -> bool:
    """Whether a tokenflow process holds the run's lock (``tokenflow.runtime.run.resources``)."""
    try:
        fd = os.open(Path(run_dir) / ".lock", os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _write_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, allow_nan=False)
    os.replace(tmp, path)


def submit(run_dir: str | Path, op: str, count: int = 1, engine: str | None = None) -> str:
    """Place a request for the run in ``run_dir``; its id (for `wait_reply`)."""
    fields = {"op": op, "count": count, **({"engine": engine} if engine is not None else {})}
    validate(fields)
    if not run_is_live(run_dir):
        raise ControlError(f"no tokenflow run is live in {run_dir} (nothing holds its .lock)")
    requests = control_dir(run_dir) / "requests"
    if not requests.is_dir():
        raise ControlError(f"{run_dir} has no control folder: the run does not take engine commands "
                           "(it was started by an older tokenflow)")
    rid = uuid.uuid4().hex
    _write_atomic(requests / f"{rid}.json", fields)
    return rid


def read_reply(run_dir: str | Path, rid: str) -> dict | None:
    try:
        return json.loads((control_dir(run_dir) / "replies" / f"{rid}.json").read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None


def wait_reply(run_dir: str | Path, rid: str, timeout_s: float, on_change=None) -> dict | None:
    """The request's last reply once it is final (``state`` done or failed), or the latest one
    (None if none) when ``timeout_s`` passes; ``on_change(reply)`` sees each new state."""
    deadline, seen = time.monotonic() + timeout_s, None
    while True:
        reply = read_reply(run_dir, rid)
        if reply is not None and reply.get("state") != seen:
            seen = reply.get("state")
            if on_change is not None:
                on_change(reply)
        if reply is not None and reply.get("state") in ("done", "failed"):
            return reply
        if time.monotonic() > deadline:
            return reply
        time.sleep(0.2)


def read_status(run_dir: str | Path) -> dict | None:
    try:
        return json.loads((control_dir(run_dir) / "engines.json").read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None


class ControlInbox:
    """The orchestrator's end: requests read and validated, replies and status written."""

    def __init__(self, run_dir: str | Path) -> None:
        self.root = control_dir(run_dir)
        self.requests = self.root / "requests"
        self.replies = self.root / "replies"
        for d in (self.root, self.requests, self.replies):
            d.mkdir(exist_ok=True)
        for stale in self.requests.iterdir():  # addressed to an earlier invocation of the run
            self._remove(stale)

    @staticmethod
    def _remove(path: Path) -> None:
        try:
            if path.is_dir() and not path.is_symlink():
                return  # a folder is left alone (nothing here makes one)
            path.unlink()
        except OSError:
            pass

    def poll(self) -> list[Request]:
        """Valid requests, oldest first; invalid ones are answered (failed) and removed."""
        try:
            entries = sorted(os.scandir(self.requests), key=_mtime)
        except OSError:
            return []
        out = []
        for entry in entries[:MAX_PER_POLL]:
            path = Path(entry.path)
            rid = entry.name[:-5] if entry.name.endswith(".json") else None
            if rid is None or not _ID.match(rid):
                self._remove(path)  # not a name this module writes (a temporary file, or junk)
                continue
            try:
                fields = self._read(path)
                op, count, engine = validate(fields)
            except ControlError as e:
                self.reply(rid, "failed", str(e))
                continue
            finally:
                self._remove(path)
            out.append(Request(rid, op, count, engine))
        return out

    @staticmethod
    def _read(path: Path) -> dict:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as e:
            why = "it is a symlink" if e.errno == errno.ELOOP else e.strerror
            raise ControlError(f"request file not read: {why}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ControlError("a request is a regular file")
            if st.st_size > MAX_REQUEST_BYTES:
                raise ControlError(f"a request is at most {MAX_REQUEST_BYTES} bytes, this one {st.st_size}")
            data = os.read(fd, MAX_REQUEST_BYTES + 1)
        finally:
            os.close(fd)
        try:
            return json.loads(data.decode("utf-8"), parse_constant=_refuse_constant)
        except (UnicodeDecodeError, ValueError) as e:
            raise ControlError(f"a request is UTF-8 JSON ({type(e).__name__}: {e})") from None

    def reply(self, rid: str, state: str, message: str, **extra) -> None:
        if not _ID.match(rid):
            return
        try:
            _write_atomic(self.replies / f"{rid}.json", {"state": state, "message": message, **extra})
        except OSError:
            pass  # the run goes on; the command times out saying no reply came

    def status(self, data: dict) -> None:
        try:
            _write_atomic(self.root / "engines.json", data)
        except OSError:
            pass


def _mtime(entry) -> int:
    try:
        return entry.stat(follow_symlinks=False).st_mtime_ns
    except OSError:  # gone meanwhile
        return 0


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")
