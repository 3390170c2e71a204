"""A worker killed by SIGKILL is reported with its peak resident memory and the settings that bound
it; "killed by the kernel's out-of-memory killer" only when one of the kernel's oom_kill counters
moved (read here from files in the real cgroup v1 / v2 and /proc/vmstat formats: an out-of-memory
kill cannot be caused safely in a test)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import pytest

from tokenflow.errors import WorkerDied
from tests.runtime.runtime_testlib import small_config
from tokenflow.runtime.workers.memory_watch import (
    OomCounters, cgroup_limit_bytes, cgroup_memory_dir, describe_death, read_counter,
)
from tokenflow.runtime.workers.process import WorkerHandle

V2_EVENTS = "low 0\nhigh 0\nmax 17\noom 1\noom_kill {n}\noom_group_kill 0\n"
V1_OOM_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill {n}\n"
VMSTAT = "nr_free_pages 1\npgfault 99\noom_kill {n}\nunevictable_pgs_culled 0\n"


def _machine(tmp_path, version: int):
    """A /proc/self/cgroup and a cgroup mount as the kernel writes them, under tmp_path."""
    proc, root = tmp_path / "cgroup", tmp_path / "sys"
    if version == 2:
        proc.write_text("0::/user.slice/run-1.scope\n")
        d = root / "user.slice" / "run-1.scope"
        d.mkdir(parents=True)
        (d / "memory.events").write_text(V2_EVENTS.format(n=3))  # a sandbox below was killed: not ours
        (d / "memory.events.local").write_text(V2_EVENTS.format(n=0))
        (d / "memory.max").write_text("2147483648\n")
        events = d / "memory.events.local"
    else:
        proc.write_text("9:name=systemd:/\n4:memory:/process_api/af33\n1:cpu:/\n0::/\n")
        d = root / "memory" / "process_api" / "af33"
        d.mkdir(parents=True)
        (d / "memory.oom_control").write_text(V1_OOM_CONTROL.format(n=2))
        (d / "memory.limit_in_bytes").write_text("9223372036854771712\n")
        events = d / "memory.oom_control"
    vmstat = tmp_path / "vmstat"
    vmstat.write_text(VMSTAT.format(n=5))
    return proc, root, d, events, vmstat


@pytest.mark.parametrize("version", [1, 2])
def test_a_moved_oom_kill_counter_says_the_out_of_memory_killer(tmp_path, version):
    proc, root, d, events, vmstat = _machine(tmp_path, version)
    found = cgroup_memory_dir(str(proc), str(root))
    assert found == (d, version)
    assert cgroup_limit_bytes(found) == (2147483648 if version == 2 else None)  # v1's "no limit"
    counters = OomCounters(found, str(vmstat))
    assert counters.readable() and counters.moved() == []
    vmstat.write_text(VMSTAT.format(n=9))  # another cgroup of the machine: not ours
    assert counters.moved() == []
    before = read_counter(events)
    events.write_text((V2_EVENTS if version == 2 else V1_OOM_CONTROL).format(n=before + 1))
    assert counters.moved() == [f"{events} oom_kill {before} → {before + 1}"]
    cfg = small_config()
    msg, cause = describe_death("trainer", 42, -9, int(3.5e9), counters, cfg)
    assert cause == "oom_killer"
    assert msg.startswith("the trainer process (pid 42) was killed by the kernel's out-of-memory killer")
    assert "peak resident memory was 3.50 GB" in msg
    assert f"trainer.micro_batch_tokens = {cfg.trainer.micro_batch_tokens}" in msg
    assert "lower trainer.micro_batch_tokens" in msg
    msg, _ = describe_death("engine", 43, -9, int(1e9), counters, cfg)
    assert f"engine.max_num_seqs = {cfg.engine.max_num_seqs}" in msg and "lower engine.max_num_seqs" in msg


def test_the_machine_wide_counter_alone_also_tells(tmp_path):
    proc, root, d, events, vmstat = _machine(tmp_path, 2)
    counters = OomCounters(None, str(vmstat))  # no memory cgroup found
    vmstat.write_text(VMSTAT.format(n=6))
    msg, cause = describe_death("engine", 7, -9, 0, counters, small_config())
    assert cause == "oom_killer" and "oom_kill 5 → 6" in msg and "peak resident memory is unknown" in msg


def test_a_sigkill_with_no_counter_moved_says_maybe(tmp_path):
    proc, root, d, events, vmstat = _machine(tmp_path, 1)
    counters = OomCounters(cgroup_memory_dir(str(proc), str(root)), str(vmstat))
    msg, cause = describe_death("trainer", 42, -9, int(2e9), counters, small_config())
    assert cause == "sigkill"
    assert "killed by SIGKILL (maybe the out-of-memory killer: no out-of-memory counter moved)" in msg
    unreadable = OomCounters(None, str(tmp_path / "absent"))
    msg, _ = describe_death("trainer", 42, -9, int(2e9), unreadable, small_config())
    assert "the kernel's out-of-memory counters are not readable here" in msg
    assert describe_death("engine", 1, 3, 0, counters)[1] == "exit_code"  # other deaths: as before


def _hold_memory(mb: int) -> None:
    block = bytearray(mb << 20)
    for i in range(0, len(block), 4096):  # touched: resident
        block[i] = 1
    time.sleep(600)


def test_a_real_worker_killed_by_sigkill_is_reported_with_its_peak(tmp_path):
    cfg = small_config()
    h = WorkerHandle("trainer", _hold_memory, (300,), mp.get_context("spawn"), cfg=cfg, oom=OomCounters())
    h.start()
    try:
        deadline = time.monotonic() + 60
        while h.rss.process_peak < 300e6 and time.monotonic() < deadline:
            h.check()  # samples VmHWM while the worker lives
            time.sleep(0.2)
        assert h.rss.process_peak >= 300e6
        os.kill(h.pid, signal.SIGKILL)
        h.process.join(10)
        with pytest.raises(WorkerDied) as died:
            h.check()
    finally:
        if h.process.is_alive():
            h.process.kill()
    e = died.value
    assert e.worker == "trainer" and e.cause in ("sigkill", "oom_killer")
    assert e.peak_rss_gb is not None and 0.3 <= e.peak_rss_gb < 1.5
    assert f"the trainer process (pid {h.pid}) died with exit code -9: killed by SIGKILL" in str(e) or \
        e.cause == "oom_killer"
    # the message rounds the peak once; peak_rss_gb is already rounded to 3 places, so formatting it
    # again can differ in the last digit (0.3849 -> 0.385 -> "0.39" against "0.38")
    assert f"its peak resident memory was {h.rss.process_peak / 1e9:.2f} GB" in str(e)
    assert "trainer.micro_batch_tokens" in str(e)
