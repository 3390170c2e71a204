"""`tokenflow bench pipeline --teacher MODEL`: does a teacher scorer keep the pipeline full?

Two asynchronous runs of the same config, seed and steps, without and with
``[scorer.teacher]`` (both with the token-level estimator distillation needs, so the teacher is
the only difference). The teacher scores each group in its own worker while the engine and the
trainer go on, so the trainer's idle fraction should barely move; the number to read is the
difference in points.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

logger = logging.getLogger(__name__)


def run_with_teacher(base, out: Path, staleness: int, teacher: str, as_json: bool) -> int:
    from tokenflow.config.root import TrainConfig
    from tokenflow.metrics.sinks import read_jsonl
    from tokenflow.runtime.launch import train

    runs, teacher_s = {}, 0.0
    for name, with_teacher in (("async", False), ("async_teacher", True)):
        data = base.model_dump()
        data["rollout"]["max_staleness"] = staleness
        if data["algorithm"]["advantage"] not in ("reinforce_pp", "reinforce_pp_baseline", "gae"):
            data["algorithm"]["advantage"] = "reinforce_pp"
        data["scorer"]["teacher"] = {**(data["scorer"].get("teacher") or {}), "model": teacher} if with_teacher else None
        cfg = TrainConfig.model_validate(data)
        logger.info("bench pipeline: %s run (max_staleness %d) → %s", name, staleness, out / name)
        runs[name] = train(cfg, out / name)
    rows = [r for r in read_jsonl(out / "async_teacher" / "metrics.jsonl") if "loss/total" in r]
    teacher_s = sum(r.get("scorer/teacher/time_s", 0.0) for r in rows) / max(len(rows), 1)
    a, t = runs["async"], runs["async_teacher"]
    result = {
        "steps": a["steps"], "async_max_staleness": staleness, "teacher": teacher,
        "async_wall_s": a["train_wall_s"], "async_teacher_wall_s": t["train_wall_s"],
        "async_trainer_idle_frac": a["trainer_idle_frac"], "async_teacher_trainer_idle_frac": t["trainer_idle_frac"],
        "idle_difference_points": 100 * (t["trainer_idle_frac"] - a["trainer_idle_frac"]),
        "async_engine_idle_frac": a["engine_idle_frac"], "async_teacher_engine_idle_frac": t["engine_idle_frac"],
        "teacher_s_per_group_mean": teacher_s,
        "output_dir": str(out),
    }
    (out / "bench.json").write_text(json.dumps(result, indent=2))
    if as_json:
        print(json.dumps(result))
        return 0
    print(f"steps {result['steps']} (same seed), async K={staleness}, training-window wall time:")
    print(f"  without teacher  {a['train_wall_s']:8.1f} s   trainer idle {a['trainer_idle_frac']:.1%}   "
          f"engine idle {a['engine_idle_frac']:.1%}")
    print(f"  with teacher     {t['train_wall_s']:8.1f} s   trainer idle {t['trainer_idle_frac']:.1%}   "
          f"engine idle {t['engine_idle_frac']:.1%}   teacher {teacher_s:.3f} s per group")
    print(f"  trainer idle difference: {result['idle_difference_points']:+.1f} points")
    return 0
