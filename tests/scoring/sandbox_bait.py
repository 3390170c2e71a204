"""The bait a sandbox's parent holds for the attacks to steal, and the one call that runs an
attack program next to it. Standard library only: it runs inside pytest (attacks as root) and in
sandbox_as_user.py (attacks as an unprivileged user, under a Python without the test deps)."""

from __future__ import annotations

import ctypes
import dataclasses
import os
from pathlib import Path

from tokenflow.scoring.sandbox import SandboxLimits, run_program
from tokenflow.scoring.sandbox.runner import run_in_mode

SECRET_ENV = "TF_ATTACK_SECRET"
PROGRAMS = Path(__file__).with_name("attack_programs.py")
_heap: list[bytearray] = []  # kept alive so its address stays valid while the program runs


def limits(**kw) -> SandboxLimits:
    """SandboxLimits from the fields this version of the sandbox has (the suite also ran
    against the old sandbox, which lacks the work-dir quotas)."""
    names = {f.name for f in dataclasses.fields(SandboxLimits)}
    return SandboxLimits(**{k: v for k, v in kw.items() if k in names})


def run_attack(name: str, params: dict, limits_kw: dict, host_marker: str, mode: str | None = None) -> dict:
    """Run attack ``name`` (in ``mode``, else the probe's) with ``params`` plus this process's pid and the address of a heap
    buffer holding the secret (the caller started this process with the secret in its
    environment, as a scorer's environment holds its tokens)."""
    secret = params["secret"]
    buf = bytearray(secret.encode())
    _heap.append(buf)
    addr = ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))
    P = dict(params, host_pid=os.getpid(), secret_addr=addr, host_marker=host_marker)
    source = PROGRAMS.read_text() + f"\nP = {P!r}\nATTACKS[{name!r}](P)\nprint('ATTACK-DONE', flush=True)\n"
    if mode:  # a weaker mode than the probe would pick, forced
        result = run_in_mode(source, mode, limits=limits(**limits_kw))
    else:
        result = run_program(source, limits=limits(**limits_kw))
    return dataclasses.asdict(result)
