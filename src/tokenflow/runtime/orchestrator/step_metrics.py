"""Per-step metrics the orchestrator adds to the trainer's: rewards, rollout shape, engine, idle time."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from tokenflow.rollout import Rollout


def batch_metrics(batch: list[list[Rollout]], dropped_groups: int | None = None) -> dict[str, float]:
    """Rewards and shapes of one step's groups; ``dropped_groups``: how many groups dynamic
    sampling dropped while the batch filled (None: dynamic sampling is off)."""
    rollouts = [r for g in batch for r in g]
    scored = [r for r in rollouts if not r.failed]
    lens = np.array([r.num_tokens for r in rollouts], dtype=np.float64)
    m: dict[str, float] = {
        "rollout/count": float(len(rollouts)),
        "rollout/completion_len_mean": float(lens.mean()) if len(lens) else 0.0,
        "rollout/completion_len_max": float(lens.max()) if len(lens) else 0.0,
        "rollout/truncated_frac": float(np.mean([r.finish_reason == "length" for r in rollouts])) if rollouts else 0.0,
        "rollout/versions_per_rollout": float(np.mean([len(np.unique(r.versions)) for r in rollouts if r.num_tokens]))
        if rollouts else 0.0,
        "reward/failed_frac": (len(rollouts) - len(scored)) / max(1, len(rollouts)),
    }
    m.update(episode_metrics(rollouts))
    if dropped_groups is not None:
        m["rollout/dropped_groups"] = float(dropped_groups)
        m["rollout/dropped_group_frac"] = dropped_groups / max(1, dropped_groups + len(batch))
    if any("overlong_penalty" in r.rewards for r in scored):
        m["rollout/overlong_frac"] = float(np.mean([r.rewards.get("overlong_penalty", 0.0) < 0 for r in scored]))
    if scored:
        rewards = np.array([r.reward for r in scored], dtype=np.float64)
        m.update({"reward/mean": float(rewards.mean()), "reward/std": float(rewards.std()),
                  "reward/max": float(rewards.max()), "reward/min": float(rewards.min())})
        # Groups whose samples all got the same reward carry no GRPO signal.
        flat = [g for g in batch if len({r.reward for r in g if not r.failed}) <= 1]
        m["reward/zero_signal_group_frac"] = len(flat) / max(1, len(batch))
        for key in scored[0].rewards:
            if key != "reward":
                m[f"reward/{key}_mean"] = float(np.mean([r.rewards.get(key, 0.0) for r in scored]))
        # Token scorers' numbers (teacher reverse KL and time, PRM steps), mean over samples.
        for key in sorted({k for r in scored for k in r.info.get("scorer", {})}):
            m[f"scorer/{key}"] = float(np.mean([r.info["scorer"][key] for r in scored if key in r.info.get("scorer", {})]))
        if any(r.token_rewards is not None for r in scored):
            m["reward/token_sum_mean"] = float(np.mean([r.token_rewards.sum() for r in scored
                                                        if r.token_rewards is not None]))
    return m


def episode_metrics(rollouts: list[Rollout]) -> dict[str, float]:
    """Multi-turn episodes (environment tasks): turns, endings, environment failures, tool-call
    errors. One count per episode, not per row."""
    episodes = {}
    for r in rollouts:
        e = r.info.get("episode")
        if e is not None:
            episodes[(r.group_id, r.sample_index)] = (e, r)
    if not episodes:
        return {}
    n = len(episodes)
    summaries = [e for e, _ in episodes.values()]
    m = {
        "episode/count": float(n),
        "episode/turns_mean": float(np.mean([e["turns"] for e in summaries])),
        "episode/multi_turn_frac": float(np.mean([e["turns"] >= 2 for e in summaries])),
        "episode/failed": float(sum(e["error"] is not None for e in summaries)),
        "episode/new_rows": float(sum(e["rows"] - 1 for e in summaries)),
        "episode/env_tokens_frac": float(
            sum(int((r.loss_mask == 0).sum()) for r in rollouts) / max(1, sum(r.num_tokens for r in rollouts))),
    }
    for reason in ("stop", "length", "max_turns", "token_limit", "context_length", "error"):
        m[f"episode/finish_{reason}_frac"] = sum(e["finish"] == reason for e in summaries) / n
    for key in ("malformed_tool_calls", "tool_errors"):
        m[f"episode/{key}"] = float(sum(e["info"].get(key, 0) for e in summaries))
    return m


@dataclass
class EngineTotals:
    """Cumulative engine counters (summed over engines) from their latest status messages."""

    per_engine: dict[str, object] = field(default_factory=dict)

    def update(self, worker: str, status) -> None:
        self.per_engine[worker] = status

    def total(self, attr: str) -> float:
        return float(sum(getattr(s, attr) for s in self.per_engine.values()))


class IdleClock:
    """Busy time of the trainer and the engines within the training window → idle fractions."""

    def __init__(self) -> None:
        self.trainer_busy_s = 0.0
        self.engine_busy_at_start: float | None = None
        self.engine_wall_at_start: float | None = None

    def start(self, engines: EngineTotals) -> None:
        self.engine_busy_at_start = engines.total("busy_s")
        self.engine_wall_at_start = engines.total("wall_s")

    def trainer_idle(self, window_s: float) -> float:
        return max(0.0, 1.0 - self.trainer_busy_s / window_s) if window_s > 0 else 0.0

    def engine_idle(self, engines: EngineTotals) -> float:
        if self.engine_busy_at_start is None:
            return 0.0
        wall = engines.total("wall_s") - self.engine_wall_at_start
        busy = engines.total("busy_s") - self.engine_busy_at_start
        return max(0.0, 1.0 - busy / wall) if wall > 0 else 0.0


def engine_metrics(totals: EngineTotals, rate: "StepRate", version: int) -> dict[str, float]:
    steps = totals.total("decode_steps")
    return {"perf/engine_tokens_per_s": rate.tokens_per_s, "engine/step_tokens": rate.tokens,
            "engine/step_seconds": rate.seconds, "engine/tokens_total": totals.total("tokens"),
            "engine/decode_step_s": totals.total("decode_s") / steps if steps else 0.0,
            "engine/running": totals.total("running"), "engine/waiting": totals.total("waiting"),
            "engine/version": float(version)}


@dataclass
class StepRate:
    tokens: float
    """Tokens the engines generated between their readings at the previous step and at this one."""
    seconds: float
    """Those readings' distance on the engines' own clocks (the longest, over engines)."""
    tokens_per_s: float
    """The sum over engines of each one's tokens ÷ its seconds."""


def _readings(totals: EngineTotals) -> dict[str, tuple[float, float, float]]:
    """Each engine's latest (wall_s, tokens, busy_s): read together, in the engine, on its clock."""
    return {name: (float(s.wall_s), float(s.tokens), float(s.busy_s)) for name, s in totals.per_engine.items()}


class EngineClock:
    """Generation rates on the engines' own clocks.

    An engine's status carries its token counter and its wall clock read at the same moment, so
    tokens ÷ seconds between two of its statuses is exactly what it generated per second then,
    however late the statuses reach the orchestrator (a blocked orchestrator handles several at
    once) and whatever else the orchestrator samples in between (an optimizer step brings no new
    engine reading). Dividing by the orchestrator's time instead made each step's rate depend
    on which statuses had landed before it ended: steps that each generated ~700 tokens read
    anywhere from 6 to 219 tok/s."""

    def __init__(self) -> None:
        self.marks: dict[str, tuple[float, float, float]] = {}

    def reset(self, totals: EngineTotals) -> None:
        """Start measuring from the engines' latest readings (the training window opens)."""
        self.marks = _readings(totals)

    def step(self, totals: EngineTotals, fallback: float = 0.0) -> StepRate:
        """Tokens and rate since the last call. With no new reading from any engine (a step
        shorter than their report interval), the rate is ``fallback`` (the live view's) and the
        marks stay where they are, so the next step's interval covers both."""
        tokens, seconds, rate, advanced = 0.0, 0.0, 0.0, False
        for name, now in _readings(totals).items():
            mark = self.marks.get(name)
            if mark is not None and now[0] < mark[0]:  # a restarted engine: a new clock from 0
                mark = None
            mark = mark or (0.0, 0.0, 0.0)
            if now[0] <= mark[0]:
                continue
            advanced = True
            tokens += now[1] - mark[1]
            seconds = max(seconds, now[0] - mark[0])
            rate += (now[1] - mark[1]) / (now[0] - mark[0])
            self.marks[name] = now
        if not advanced:
            return StepRate(0.0, 0.0, fallback)
        return StepRate(tokens, seconds, rate)


def sync_metrics(timings: list[dict]) -> dict[str, float]:
    """Weight loads since the last step: the mean of each timing, and the longest engine pause."""
    out: dict[str, float] = {}
    for key in sorted({k for t in timings for k in t}):
        vals = [t[key] for t in timings if key in t]
        out[f"{key}_mean" if key.endswith("_s") else key] = sum(vals) / len(vals)
        if key == "sync/engine_pause_s":
            out["sync/engine_pause_max_s"] = max(vals)
    return out


class SlidingWindow:
    """Cumulative counters sampled over time; differences over the last ``window_s`` seconds."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.samples: deque[tuple[float, dict[str, float]]] = deque()

    def add(self, t: float, counters: dict[str, float]) -> None:
        self.samples.append((t, counters))
        while len(self.samples) > 2 and self.samples[1][0] <= t - self.window_s:
            self.samples.popleft()

    def delta(self, key: str) -> float:
        return self.samples[-1][1][key] - self.samples[0][1][key]

    def span(self) -> float:
        return self.samples[-1][0] - self.samples[0][0] if self.samples else 0.0


class LiveFigures:
    """The live view's current throughput and idle fractions, over a sliding window.

    Engines report cumulative counters with their own clock about once a second. Throughput is
    each engine's tokens generated ÷ its wall seconds over the last ``window_s`` seconds of its
    clock (`EngineClock` says why its clock), summed over engines; engine idle likewise (busy
    seconds ÷ wall seconds). Trainer idle is over the orchestrator's clock, which times the
    trainer's steps. Sampled on every engine report and every optimizer step."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self.window = SlidingWindow(window_s)
        self.engines: dict[str, deque[tuple[float, float, float]]] = {}

    def sample(self, t: float, trainer_busy_s: float, engines: EngineTotals) -> dict[str, float]:
        self.window.add(t, {"trainer_busy": trainer_busy_s})
        rate, busy, wall = 0.0, 0.0, 0.0
        for name, now in _readings(engines).items():
            history = self.engines.setdefault(name, deque())
            if history and now[0] < history[-1][0]:  # a restarted engine: a new clock
                history.clear()
            if not history or now[0] > history[-1][0]:
                history.append(now)
            while len(history) > 2 and history[1][0] <= now[0] - self.window_s:
                history.popleft()
            first, last = history[0], history[-1]
            if last[0] > first[0]:
                rate += (last[1] - first[1]) / (last[0] - first[0])
                busy += last[2] - first[2]
                wall += last[0] - first[0]
        out: dict[str, float] = {}
        if wall > 0:
            out["tokens_per_s"] = rate
            out["engine_idle"] = max(0.0, 1.0 - busy / wall)
        span = self.window.span()
        if span > 0:
            out["trainer_idle"] = min(1.0, max(0.0, 1.0 - self.window.delta("trainer_busy") / span))
        return out
