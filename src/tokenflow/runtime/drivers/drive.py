"""What the episode and agent drivers share: per-sample seeds, picklable state, and `drive`,
the blocking loop that runs either driver in-process (`tokenflow eval`, tests, scripts; in
training the engine worker's own loop drives them)."""

from __future__ import annotations

import time

from tokenflow.rollout import Rollout


def seed_of(params, index: int) -> int:
    """Each episode's own seed: the request's seed and the sample index, so that one episode is
    regenerated exactly on resume while the n samples of a group still differ."""
    from tokenflow.engine.request import derive_seed

    base = params.seed if params.seed is not None else 0
    return derive_seed(base, index)


def tools_key(bridge) -> tuple:
    return tuple(sorted(getattr(t, "__name__", repr(t)) for t in bridge.tools))


def picklable(state: dict) -> dict:
    """The environment's state as far as it can cross to the scorer process (a socket or a
    subprocess handle in it cannot, and is left out rather than failing the episode)."""
    import pickle

    out = {}
    for k, v in state.items():
        try:
            pickle.dumps(v)
        except Exception:  # noqa: BLE001 - anything unpicklable is simply not sent
            continue
        out[k] = v
    return out


def drive(driver, engine, specs: list, params, on_progress=None) -> list[list[Rollout]]:
    """Run one request per spec on ``driver`` (an `EpisodeDriver` or an agents' driver) until
    every request's rows are back, stepping ``engine`` in this thread; closes the driver."""
    results: dict[str, list[Rollout]] = {}
    try:
        for i, spec in enumerate(specs):
            driver.start(f"request-{i}", spec, params, group_id=i, prompt_id=i)
        while len(results) < len(specs):
            driver.pump()
            if engine.has_unfinished():
                driver.dispatch(engine.step())
            else:
                time.sleep(0.001)  # only environments (or agents) are working
            for rid, rows in driver.poll():
                results[rid] = rows
                if on_progress is not None:
                    on_progress(len(results))
    finally:
        driver.close()
    return [results[f"request-{i}"] for i in range(len(specs))]
