"""The engine worker's side of keeping in-flight rollouts across a checkpoint.

    checkpoint: ReportInFlight ──► per unfinished group: its finished samples + the running
                samples' tokens so far (`Engine.partial_rollouts`) ──InFlight──► orchestrator
    resume:     Generate(kept=...) ──► finished samples taken as they are, partial ones
                continued from their tokens (``add_request(resume=...)``), the rest started

A continued sample keeps its seed and its tokens' versions, and the counter-based sampler draws
its next token as it would have without the interruption; the trainer corrects the old tokens
like any stale ones. Groups played by an environment or an agent are named, not kept: their
state lives in objects (an environment, an agent's thread) that a checkpoint cannot hold.
"""

from __future__ import annotations

import dataclasses

from tokenflow.rollout import Rollout
from tokenflow.runtime.workers.messages import Generate, InFlight, ReportInFlight


def report(groups: dict, engine, msg: ReportInFlight) -> InFlight:
    """What ``groups`` (request id → the worker's ``_Group``) of ``msg.kind`` hold so far."""
    mine = {rid: g for rid, g in groups.items() if g.msg.kind == msg.kind}
    unkeepable = [g.msg.group_id for g in mine.values() if g.msg.episode is not None]
    plain = {rid: g for rid, g in mine.items() if g.msg.episode is None}
    partial = getattr(engine, "partial_rollouts", None)  # an engine without it keeps finished samples only
    running: dict[str, list[Rollout]] = {}
    for r in partial(set(plain)) if partial is not None and plain else []:
        running.setdefault(r.request_id, []).append(r)
    out = {}
    for rid, g in plain.items():
        kept = list(g.rollouts.values()) + [r for r in running.get(rid, []) if r.sample_index not in g.rollouts]
        if kept:
            out[g.msg.group_id] = kept
    return InFlight(msg.step, out, unkeepable)


def submit_kept(engine, msg: Generate, rid: str, finished: dict[int, Rollout]) -> None:
    """Start ``msg``'s samples from what a checkpoint kept: a finished one goes into
    ``finished`` (sample index → rollout), a partial one is continued, a missing one starts
    afresh (as a resume of no tokens, so that it keeps its sample index and its seed)."""
    kept = {r.sample_index: r for r in msg.kept}
    one = dataclasses.replace(msg.params, n=1)
    for i in range(msg.params.n):
        r = kept.get(i)
        if r is not None and r.finish_reason != "abort":
            finished[i] = r
            continue
        if r is None:
            r = Rollout(prompt_ids=msg.prompt_ids, completion_ids=[], logprobs=[], versions=[],
                        finish_reason="abort", temperature=msg.params.temperature, request_id=rid,
                        sample_index=i, group_id=msg.group_id, prompt_id=msg.prompt_id)
        engine.add_request(msg.prompt_ids, one, request_id=rid, resume=r)
