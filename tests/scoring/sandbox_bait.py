"""The bait a sandbox's parent holds for the attacks to steal, and the one call that runs an
attack program next to it. Standard library only: it runs in sandbox_as_user.py, the sandbox's
parent, as root or as an unprivileged user (under a Python that may lack the test deps)."""

from __future__ import annotations

import ctypes
import dataclasses
import os
from pathlib import Path

from tokenflow.scoring.sandbox import SandboxLimits, run_program
from tokenflow.scoring.sandbox.runner import run_in_mode

SECRET_ENV = "TF_ATTACK_SECRET"
HERE = Path(__file__).parent
# The attack programs, shipped into the work dir; main.py calls one of them.
ATTACK_FILES = ("attack_syscalls.py", "attacks_privilege.py", "attacks_reach.py")
MAIN = """import os, sys
sys.path.insert(0, os.getcwd())  # python -I leaves the work dir off sys.path
import attacks_privilege, attacks_reach
attack = {{**attacks_privilege.ATTACKS, **attacks_reach.ATTACKS}}[{name!r}]
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
    if mode:  # a weaker mode than the probe would pick, forced
        result = run_in_mode(source, mode, files=files, limits=limits(**limits_kw))
    else:
        result = run_program(source, files=files, limits=limits(**limits_kw))
    return dataclasses.asdict(result)
