"""A restarted engine re-attaches to the shared-memory sync mid-run: it loads the newest weights,
and the acknowledgements its dead predecessor never sent no longer hold the trainer up."""

from __future__ import annotations

import pytest
import torch

from tokenflow.sync.factory import make_receiver, make_sender

pytestmark = pytest.mark.slow  # a real run (or several processes) per test


def _weights(version: int) -> dict[str, torch.Tensor]:
    return {"a": torch.full((3, 4), float(version)), "b": torch.arange(5.0) + version}


def _load(recv, msg) -> dict[str, torch.Tensor]:
    recv.begin(msg)
    assert recv.ready()
    got = {k: v.clone() for k, v in recv.tensors().items()}
    recv.done(msg)
    return got


def _died_after_loading_version_1(sender, notices: list, *unloaded: int) -> None:
    """An engine that loaded version 1, then died with ``unloaded`` versions written after it."""
    first = make_receiver(sender.spec)
    sender.send(_weights(1).items(), 1, notify=notices.append)
    _load(first, notices[-1])
    for v in unloaded:
        sender.send(_weights(v).items(), v, notify=notices.append)
    first.close()


def test_a_reattached_receiver_loads_the_newest_slot_and_releases_the_old_ones():
    sender = make_sender("shared_memory", _weights(0).items(), num_receivers=1, timeout_s=1.0)
    notices = []
    try:
        _died_after_loading_version_1(sender, notices, 2, 3)  # it never loads versions 2 and 3

        again = make_receiver(sender.spec)  # the replacement, same receiver index
        newest = again.latest(version=0)
        assert newest is not None and newest.version == 3
        assert all(torch.equal(t, _weights(3)[k]) for k, t in _load(again, newest).items())
        assert again.latest(version=3) is None  # nothing newer
        # Version 4 overwrites version 2's slot, which only the dead engine held: no timeout.
        sender.send(_weights(4).items(), 4, notify=notices.append)
        assert all(torch.equal(t, _weights(4)[k]) for k, t in _load(again, notices[-1]).items())
        sender.send(_weights(5).items(), 5, notify=notices.append)
        again.close()
    finally:
        sender.close()


def test_with_one_slot_a_replacement_already_holding_the_newest_version_releases_the_slot():
    """sync.slots = 1: the trainer rewrites the only slot once every engine acknowledged it. An
    engine that died after the trainer wrote version 2 but before acknowledging it, replaced by one
    that starts from version 2 already (a checkpoint), loads nothing; its `latest` must still
    release the slot, or the trainer's next write waits until its timeout."""
    sender = make_sender("shared_memory", _weights(0).items(), num_receivers=1, timeout_s=1.0, slots=1)
    notices = []
    try:
        _died_after_loading_version_1(sender, notices, 2)  # it dies before acknowledging version 2

        again = make_receiver(sender.spec)
        assert again.latest(version=2) is None  # it holds version 2: nothing to load
        sender.send(_weights(3).items(), 3, notify=notices.append)  # no timeout: the slot was released
        assert all(torch.equal(t, _weights(3)[k]) for k, t in _load(again, notices[-1]).items())
        again.close()
    finally:
        sender.close()
