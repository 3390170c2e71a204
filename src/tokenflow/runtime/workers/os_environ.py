"""A worker's OS environment variables (``os.environ``; not the RL environments of
``tokenflow.envs``): the orchestrator's, whatever process the worker was started from.

A worker forked from the local backend's fork server would otherwise inherit the server's
environment, taken when the server started (``tokenflow.runtime.backends.local.start``); and its
parent is the server, so the orchestrator's pid travels here too (``ORCHESTRATOR_PID``), for
``process.ParentWatch``.
"""

from __future__ import annotations

import os

ORCHESTRATOR_PID = "TOKENFLOW_ORCHESTRATOR_PID"
"""Set in a forked worker's environment: the process whose death it must notice
(``workers.ParentWatch``). Its parent is the fork server, which outlives the orchestrator for
as long as any child holds the server's liveness pipe — and every forked child does."""


def environment() -> dict[str, str]:
    """This process's environment, for a worker to take on (see the module's docstring), with
    this process's pid as the orchestrator's."""
    return {**os.environ, ORCHESTRATOR_PID: str(os.getpid())}


def apply_environment(env: dict[str, str] | None) -> None:
    """In a worker: make ``os.environ`` exactly ``env`` (the orchestrator's when it started us)."""
    if env is None or env == dict(os.environ):
        return
    for k in [k for k in os.environ if k not in env]:
        del os.environ[k]
    for k, v in env.items():
        if os.environ.get(k) != v:
            os.environ[k] = v

