"""No silent hangs: a rank or engine that does not answer fails the wait, by name."""

from __future__ import annotations

import datetime
import multiprocessing as mp

import pytest
import torch

from tests.distributed.ranks_testlib import silent_rank
from tokenflow.sync.factory import make_sender
from tokenflow.sync.broadcast import free_port
from tokenflow.trainer.distributed import RankGroup, RankTimeout, Rendezvous

pytestmark = pytest.mark.slow  # a real run (or several processes) per test


def test_a_rank_that_never_joins_is_named():
    with pytest.raises(RankTimeout, match=r"trainer rank\(s\) \[1, 2\] did not join the trainer group within 1.5s"):
        RankGroup(Rendezvous("127.0.0.1", free_port(), 3, timeout_s=1.5), 0)


def test_a_rank_that_misses_a_barrier_is_named():
    ctx = mp.get_context("spawn")
    port, joined = free_port(), ctx.Event()
    proc = ctx.Process(target=silent_rank, args=(1, 2, port, joined), daemon=True)
    proc.start()
    group = None
    try:
        group = RankGroup(Rendezvous("127.0.0.1", port, 2, timeout_s=20), 0)
        assert joined.wait(30)
        group.timeout_s = 2.0
        group.timeout = datetime.timedelta(seconds=2)  # the join above may be slow; the barrier not
        with pytest.raises(RankTimeout, match=r"Ranks? 1 failed to pass monitoredBarrier"):
            group.barrier("Train (command 1)")
    finally:
        proc.kill()
        if group is not None:
            group.close()


def test_an_engine_that_never_attaches_is_named():
    sender = make_sender("broadcast", [("w", torch.zeros(4))], num_receivers=2, timeout_s=1.0)
    with pytest.raises(TimeoutError, match=r"engine receiver\(s\) \[0, 1\] did not attach .* within 1s"):
        sender.connect()
