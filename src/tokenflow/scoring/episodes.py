"""Scoring multi-turn episodes: the environment's rubric, run in the scorer workers.

The engine worker attaches a summary of each finished episode to its rows
(``Rollout.info["episode"]``: the conversation, the summed step rewards, the turn count, the
finish reason, the environment's info). The scorer pool hands these summaries, instead of
completion texts, to `episode_reward`, a per-group scorer: it loads the environment class named
in the summary and scores the group with its rubric, so group-level reward functions see every
sample of the prompt. A rubric's reward is added to the rewards the environment returned from
``step``; an environment without a rubric is scored by its step rewards alone.

Rows of one episode (a template that does not preserve prefixes gives one row per turn) share
one summary and so one reward.
"""

from __future__ import annotations

from tokenflow.scoring.shapes import group_scorer

REWARD_SPEC = "tokenflow.scoring.episodes:episode_reward"
"""What an environment task's ``reward_spec`` is: scorer processes load this by name."""

_classes: dict[str, type] = {}


def _env_class(spec: str) -> type:
    cls = _classes.get(spec)
    if cls is None:
        from tokenflow.envs import load_environment

        cls = _classes[spec] = load_environment(spec)
    return cls


@group_scorer
def episode_reward(prompt: str, episodes: list, example: dict) -> list[dict[str, float]]:
    """Rewards of one group's episodes (one per row, in order)."""
    if not episodes or not all(isinstance(e, dict) and "messages" in e for e in episodes):
        raise TypeError("episode_reward scores multi-turn episodes; a rollout without "
                        "info['episode'] reached it (is task.env set on a single-turn task?)")
    rubric = getattr(_env_class(episodes[0]["env"]), "rubric", None)
    # One score per distinct episode (rows of one episode share the summary object's content).
    keys = [(e["sample_index"], e["env"]) for e in episodes]
    unique = list(dict.fromkeys(keys))
    firsts = [episodes[keys.index(k)] for k in unique]
    scored = rubric.score(firsts, example) if rubric is not None else [{"reward": 0.0} for _ in firsts]
    out = {}
    for k, e, s in zip(unique, firsts, scored):
        s = {name: float(v) for name, v in s.items()}
        s["reward"] = s.get("reward", 0.0) + float(e.get("step_reward", 0.0))
        s["turns"] = float(e.get("turns", 0))
        out[k] = s
    return [dict(out[k]) for k in keys]
