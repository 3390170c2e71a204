"""The trainer ranks' rendezvous listens on the address it was given and nowhere else, and what a
rank reads from it is data: commands decode from a short list of types, never from a pickle."""

from __future__ import annotations

import pickle
import socket

import numpy as np
import psutil
import pytest

from tokenflow.rollout import Rollout
from tokenflow.runtime.workers.commands import CommandError, decode_command, encode_command
from tokenflow.runtime.workers.messages import ReformSync, Save, SetThreads, Shutdown, Train
from tokenflow.sync.broadcast import free_port
from tokenflow.sync.rendezvous import tcp_store


def _listening(port: int) -> set[str]:
    return {c.laddr.ip for c in psutil.Process().net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


def _other_address() -> str | None:
    """An address of this machine that is not loopback, if it has one."""
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    return None


def test_the_store_listens_on_loopback_only():
    port = free_port()
    store = tcp_store("127.0.0.1", port, 2, is_master=True, timeout_s=5)
    assert _listening(port) == {"127.0.0.1"}
    client = tcp_store("127.0.0.1", port, 2, is_master=False, timeout_s=5)
    client.set("k", b"v")
    assert store.get("k") == b"v"
    other = _other_address()
    if other is not None:  # the same port on the machine's own address: nobody there
        with pytest.raises(OSError):
            socket.create_connection((other, port), timeout=2).close()


def _rollouts():
    return [Rollout([1, 2], [3, 4, 5], [-0.1, -0.2, -0.3], [0, 0, 1], group_id=g, prompt_id=g, reward=1.0,
                    support=[None, np.array([3, 4]), None]) for g in range(3)]


@pytest.mark.parametrize("msg", [Save("/tmp/x"), Shutdown(), SetThreads(2), ReformSync("engine1"),
                                 Train(7, _rollouts(), sync_weights=False)])
def test_every_trainer_command_crosses_as_data(msg):
    back = decode_command(encode_command(msg))
    assert type(back) is type(msg)
    if isinstance(msg, Train):
        assert (back.step, back.sync_weights) == (7, False)
        assert [r.completion_ids.tolist() for r in back.rollouts] == [r.completion_ids.tolist() for r in msg.rollouts]
        assert [r.support[1].tolist() for r in back.rollouts] == [[3, 4]] * 3
    else:
        assert back == msg


class Payload:
    def __reduce__(self):
        return (print, ("ran",))


def _forged(head: str) -> bytes:
    from safetensors.numpy import save

    return save({}, metadata={"tokenflow.command": head, "tokenflow.rollouts": "[]"})


@pytest.mark.parametrize("blob, why", [
    (pickle.dumps(Save("/tmp/x")), "not a trainer command"),
    (pickle.dumps(Payload()), "not a trainer command"),
    (_forged('{"type": "Popen", "fields": {"args": "sh"}}'), "not a trainer command"),
    (_forged('{"type": "Save", "fields": {"directory": ["/", "etc"]}}'), "Save.directory is list"),
    (_forged('{"type": "Train", "fields": {"step": "7", "sync_weights": true}}'), "Train.step is str"),
    (_forged('{"type": "Shutdown", "fields": {"now": true}}'), "Shutdown has no fields"),
])
def test_anything_else_is_refused(blob, why, capsys):
    with pytest.raises(CommandError, match=why):
        decode_command(blob)
    assert "ran" not in capsys.readouterr().out
