"""The bait a sandbox's parent holds for the attacks to steal, and the one call that runs an
attack program next to it. Standard library only: it runs in sandbox_as_user.py, the sandbox's
parent, as root or as an unprivileged user (under a Python that may lack the test deps)."""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import os
import threading
import time
from pathlib import Path

from tokenflow.scoring.sandbox import SandboxLimits, bwrap, run_program
from tokenflow.scoring.sandbox.runner import run_in_mode

SECRET_ENV = "TF_ATTACK_SECRET"
HERE = Path(__file__).parent
# The attack programs, shipped into the work dir; main.py calls one of them.
ATTACK_FILES = ("attack_syscalls.py", "attacks_privilege.py", "attacks_reach.py", "attacks_kernel.py")
MAIN = """import os, sys
sys.path.insert(0, os.getcwd())  # python -I leaves the work dir off sys.path
import attacks_privilege, attacks_reach, attacks_kernel
attack = {{**attacks_privilege.ATTACKS, **attacks_reach.ATTACKS, **attacks_kernel.ATTACKS}}[{name!r}]
attack({params!r})
print("ATTACK-DONE", flush=True)
"""
_heap: list[bytearray] = []  # kept alive so its address stays valid while the program runs


def limits(**kw) -> SandboxLimits:
    """SandboxLimits from the fields this version of the sandbox has (the suite also ran
    against the old sandbox, which lacks the work-dir quotas)."""
    names = {f.name for f in dataclasses.fields(SandboxLimits)}
    return SandboxLimits(**{k: v for k, v in kw.items() if k in names})


def run_attack(name: str, params: dict, limits_kw: dict, host_marker: str, mode: str | None = None) -> dict:
    """Run attack ``name`` (in ``mode``, else the probe's) with ``params`` plus this process's
    pid and the address of a heap buffer holding the secret (the caller started this process
    with the secret in its environment, as a scorer's environment holds its tokens)."""
    secret = params["secret"]
    buf = bytearray(secret.encode())
    _heap.append(buf)
    addr = ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))
    P = dict(params, host_pid=os.getpid(), secret_addr=addr, host_marker=host_marker)
    source = MAIN.format(name=name, params=P)
    files = {f: (HERE / f).read_text() for f in ATTACK_FILES}
    watch = _CallerInotify() if name == "inotify_instances" else None
    try:
        if mode:  # a weaker mode than the probe would pick, forced
            result = run_in_mode(source, mode, files=files, limits=limits(**limits_kw))
        else:
            result = run_program(source, files=files, limits=limits(**limits_kw))
    finally:
        host = watch.stop() if watch else []
    # whether this caller (which may be another Python than the suite's) has bubblewrap at all
    return dict(dataclasses.asdict(result), host_breaches=host, bwrap_found=bwrap.find() is not None)


class _CallerInotify:
    """While a run goes on, this process (the sandbox's caller) keeps making an inotify
    instance; EMFILE means the run took the caller's own allowance."""

    def __init__(self) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.failed: list[str] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.done.is_set():
            fd = self.libc.inotify_init1(os.O_CLOEXEC)
            if fd >= 0:
                os.close(fd)
            elif ctypes.get_errno() == errno.EMFILE and not self.failed:
                self.failed.append("the caller could not make an inotify instance (EMFILE) during the run")
            time.sleep(0.05)

    def stop(self) -> list[str]:
        self.done.set()
        self.thread.join()
        return self.failed
