"""Scoring multi-turn episodes: the environment's rubric, run in the scorer workers.

The engine worker attaches a summary of each finished episode to its rows
(``Rollout.info["episode"]``: the conversation, the summed step rewards, the turn count, the
finish reason, the environment's info). The scorer pool hands these summaries, instead of
completion texts, to `episode_reward`, a per-group scorer: it loads the environment class named
in the summary and scores the group's `tokenflow.envs.Episode` records with its rubric, so
group-level reward functions see every sample of the prompt. The rubric adds the rewards the
environment returned from ``step``; an environment without a rubric is scored by those alone.

Rows of one episode (a template that does not preserve prefixes gives one row per turn) share
one summary and so one reward.
"""

from __future__ import annotations

from tokenflow.scoring.scorer_shapes import group_scorer

REWARD_SPEC = "tokenflow.scoring.episodes:episode_reward"
"""What an environment task's ``reward_spec`` is: scorer processes load this by name."""

_classes: dict[str, type] = {}


def _env_class(spec: str) -> type:
    cls = _classes.get(spec)
    if cls is None:
        from tokenflow.envs import load_environment

        cls = _classes[spec] = load_environment(spec, build=False)  # its rubric: options are not needed
    return cls


@group_scorer
def episode_reward(prompt: str, episodes: list, example: dict) -> list[dict[str, float]]:
    """Rewards of one group's rows (one dict per row, in order): the rubric's components and
    ``"reward"``, scored once per episode (the rows of one episode share its score)."""
    if not episodes or not all(isinstance(e, dict) and "episode" in e for e in episodes):
        raise TypeError("episode_reward scores multi-turn episodes; a rollout without "
                        "info['episode'] reached it (is task.env set on a single-turn task?)")
    keys = [e["sample_index"] for e in episodes]
    unique = list(dict.fromkeys(keys))
    records = [episodes[keys.index(k)]["episode"] for k in unique]
    rubric = getattr(_env_class(episodes[0]["env"]), "rubric", None)
    if rubric is not None:
        scored = rubric.score(records)
    else:  # no rubric: the rewards the steps returned
        scored = [{"reward": float(sum(r.step_rewards))} for r in records]
    out = {}
    for k, record, s in zip(unique, records, scored):
        out[k] = {**{name: float(v) for name, v in s.items()}, "turns": float(record.turns)}
    return [dict(out[k]) for k in keys]
