"""A restarted engine attached to a re-formed broadcast group drops a late notice of the old
group. The trainer's failed pushes to the dead engine (versions 3 and 4, say) are delivered to
its replacement when it is up (Ray queues calls to a restarting actor), possibly after it
attached to the new group; received for, such a notice pairs every later broadcast with the
version before it, and the last one is waited for until the sync times out (seen once in the
suite: `test_killed_engine_actor_comes_back_and_no_prompt_is_lost[broadcast]`)."""

from __future__ import annotations

import threading
import time
import types

import torch

from tokenflow.runtime.workers.engine_worker import EngineWorker
from tokenflow.sync.base import WeightsReady
from tokenflow.sync.factory import make_receiver, make_sender


def _weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"model.embed_tokens.weight": torch.randn(50, 16, generator=g),
            "lm_head.weight": torch.randn(50, 16, generator=g)}


def test_a_notice_of_the_old_group_is_dropped_and_the_new_groups_versions_pair_up():
    old = make_sender("broadcast", _weights(0).items(), timeout_s=20)  # the group the dead engine was in
    # re-formed around its replacement, on the port the old group had: a released port is handed
    # out again (seen once: the two groups' notices then looked alike and both were received for)
    new = make_sender("broadcast", _weights(0).items(), timeout_s=20, port=old.spec.options["port"])
    # what the failed push of version 4 announced (BroadcastSender.send's notice, in the old group)
    notices = [WeightsReady(4, "broadcast", 0, None, time.time(), group=old.spec.options["group"])]
    receiver = make_receiver(new.spec)
    joined = threading.Thread(target=receiver.connect)
    joined.start()
    new.connect()
    joined.join(20)
    # the engine's state where _begin_next runs: attached to the new group, holding version 3
    engine = types.SimpleNamespace(receiver=receiver, receiving=False, loading=None, name="engine",
                                   pending_weights=list(notices), engine=types.SimpleNamespace(version=3))
    try:
        for version in (4, 5, 6):
            # appended to the list the engine holds when the notice arrives (_begin_next replaces it)
            sent = threading.Thread(target=new.send, args=(_weights(version).items(), version,
                                                           lambda m: engine.pending_weights.append(m)))
            sent.start()
            deadline = time.monotonic() + 20
            # the new group's notice: the old group's notice of version 4 is there from the start
            while not any(m.version == version and m.group == new.spec.options["group"]
                          for m in engine.pending_weights):
                assert time.monotonic() < deadline
                time.sleep(0.01)
            EngineWorker._begin_next(engine)
            # only the new group's notice is received for
            assert [m.version for m in engine.pending_weights] == [version], engine.pending_weights
            assert engine.receiving
            deadline = time.monotonic() + 20
            while not receiver.ready():
                assert time.monotonic() < deadline, f"version {version} never arrived"
                time.sleep(0.01)
            sent.join(20)
            got = receiver.tensors()
            for name, t in _weights(version).items():
                assert torch.equal(got[name], t), (version, name)
            receiver.done(engine.pending_weights.pop(0))
            engine.receiving = False
            engine.engine.version = version
    finally:
        receiver.close()
        new.close()
        old.close()
