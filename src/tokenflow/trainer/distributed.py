"""The trainer's ranks: one process group, a command mailbox, and waits that name who is late.

    runtime ──Train / Save / Shutdown──► rank 0 ──post(command k)──► TCP store ──► ranks 1..N-1
                                           │                                          │
                                           └──── barrier(k), then the same code ◄─────┘
                                                 (FSDP all-gathers / reduce-scatters,
                                                  full-tensor gathers of a weight push)

The runtime talks to rank 0 only. Rank 0 posts each command (bytes: the runtime encodes its
messages as data, never as pickles, `tokenflow.runtime.workers.commands`) in the TCP store the
group was built from, whose server listens on the rendezvous address alone
(`tokenflow.sync.rendezvous`); the other ranks wait for it there in short polls (an idle trainer may wait for
generation for a long time, and must still notice that its parent is gone), then every rank
runs the same code, so the collectives inside line up.

No wait is unbounded, and every timeout names ranks: joining the group (each rank writes a
``joined/<rank>`` key; rank 0 lists the missing ones), the barrier that opens each command
(gloo's monitored barrier reports the ranks that did not arrive), and any collective inside a
command (each rank records the phase it entered; the error lists where every rank was last seen).
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from tokenflow.sync.rendezvous import all_gather_bytes, tcp_store

log = logging.getLogger(__name__)


class RankTimeout(TimeoutError):
    """A trainer rank did not answer in time; the message names it."""


@dataclass(frozen=True)
class Rendezvous:
    """Where the trainer ranks meet: rank 0 hosts the TCP store at ``host:port``."""

    host: str
    port: int
    world_size: int
    timeout_s: float = 300.0
    backend: str = "gloo"  # "nccl" when the ranks train on GPUs


class RankGroup:
    """This process's place among the trainer ranks (the default process group is theirs)."""

    def __init__(self, rdv: Rendezvous, rank: int) -> None:
        self.rank, self.world, self.timeout_s = rank, rdv.world_size, rdv.timeout_s
        self.timeout = datetime.timedelta(seconds=rdv.timeout_s)
        self.store = tcp_store(rdv.host, rdv.port, rdv.world_size, is_master=rank == 0, timeout_s=rdv.timeout_s)
        self.store.set(f"joined/{rank}", b"1")
        if rank == 0:
            self._wait_keys({r: f"joined/{r}" for r in range(self.world)}, "join the trainer group")
        dist.init_process_group(rdv.backend, store=dist.PrefixStore("pg", self.store), rank=rank,
                                world_size=self.world, timeout=self.timeout)
        # Monitored barriers (the ones that name missing ranks) exist on gloo only; NCCL ranks
        # get a small gloo side group for control traffic.
        self.ctrl = dist.group.WORLD if rdv.backend == "gloo" else dist.new_group(backend="gloo")
        self.seq = 0
        self.phase = "start"
        log.debug("trainer rank %d of %d joined (%s)", rank, self.world, rdv.backend)

    # ---- waits that name ranks -------------------------------------------------------------
    def _wait_keys(self, keys: dict[int, str], what: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not self.store.check(list(keys.values())):
            if time.monotonic() > deadline:
                late = [r for r, k in keys.items() if not self.store.check([k])]
                raise RankTimeout(f"trainer rank(s) {late} did not {what} within {self.timeout_s:g}s "
                                  "(trainer.collective_timeout_s)")
            time.sleep(0.02)

    def barrier(self, what: str) -> None:
        """Every rank reaches this point, or rank 0 fails naming the ranks that did not."""
        try:
            dist.monitored_barrier(self.ctrl, timeout=self.timeout, wait_all_ranks=True)
        except RuntimeError as e:
            raise RankTimeout(f"trainer rank {self.rank}: not every rank reached {what} within "
                              f"{self.timeout_s:g}s: {e}") from None

    def mark(self, phase: str) -> None:
        """Record the phase this rank is entering (read back by ``where`` when something hangs)."""
        self.phase = phase
        self.store.set(f"phase/{self.rank}", f"command {self.seq}: {phase}".encode())

    def where(self) -> str:
        out = []
        for r in range(self.world):
            try:
                out.append(f"rank {r} at {self.store.get(f'phase/{r}').decode()}"
                           if self.store.check([f"phase/{r}"]) else f"rank {r} never started")
            except (RuntimeError, dist.DistError):
                out.append(f"rank {r} unknown")
        return "; ".join(out)

    def run(self, phase: str, fn: Callable):
        """Run ``fn`` (which holds collectives) as ``phase``; a failure names where each rank was."""
        self.mark(phase)
        try:
            return fn()
        except (RuntimeError, TimeoutError, dist.DistError) as e:
            if isinstance(e, RankTimeout):
                raise
            raise RankTimeout(f"trainer rank {self.rank}: '{phase}' failed or timed out "
                              f"(trainer.collective_timeout_s = {self.timeout_s:g}): {e}\n"
                              f"ranks last seen: {self.where()}") from None

    # ---- the command mailbox ---------------------------------------------------------------
    def post(self, command: bytes) -> None:
        """Rank 0: hand ``command`` (encoded by the caller) to the other ranks."""
        self.seq += 1
        self.store.set(f"cmd/{self.seq}", command)
        if self.seq > 1:  # everyone passed the barrier of the previous command, so read it
            self.store.delete_key(f"cmd/{self.seq - 1}")

    def next_command(self, orphaned: Callable[[], bool] = lambda: False, poll_s: float = 0.005) -> bytes | None:
        """Ranks > 0: wait for rank 0's next command (its bytes); None once ``orphaned()`` says to stop.

        Polls with ``check`` (a blocking ``wait`` that times out logs a warning every time); a
        store that has gone away (rank 0 died) raises."""
        self.seq += 1
        key = f"cmd/{self.seq}"
        last_orphan_check = time.monotonic()
        while not self.store.check([key]):
            time.sleep(poll_s)
            if time.monotonic() - last_orphan_check > 1.0:
                last_orphan_check = time.monotonic()
                if orphaned():
                    return None
        return self.store.get(key)

    # ---- small collectives -------------------------------------------------------------------
    def all_reduce(self, t: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
        dist.all_reduce(t, op=op)
        return t

    def all_gather_bytes(self, payload: bytes) -> list[bytes]:
        """Every rank's ``payload`` (no pickles cross between ranks)."""
        return all_gather_bytes(payload, self.ctrl)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def partition(lengths: list[int], world: int) -> list[list[int]]:
    """Split indices into ``world`` shares of nearly equal token totals: longest first, each to
    the lightest share so far (ties to the lower rank). Deterministic, so every rank computes
    the same split from the same batch."""
    shares: list[list[int]] = [[] for _ in range(world)]
    load = [0] * world
    for i in sorted(range(len(lengths)), key=lambda k: (-lengths[k], k)):
        r = min(range(world), key=lambda k: (load[k], k))
        shares[r].append(i)
        load[r] += lengths[i]
    return [sorted(s) for s in shares]
