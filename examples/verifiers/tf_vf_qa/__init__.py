"""A single-turn verifiers environment built from a local JSONL file of questions.

Each row is ``{"question": ..., "answer": ...}``; the reward is 1 when the model's reply says the
answer (case-insensitively). Taskset config: ``path`` (the JSONL file, default the ``qa.jsonl``
beside this file). Played by the in-process chat harness of ``tf_vf_chat``.
"""

from __future__ import annotations

import json
from pathlib import Path

import verifiers.v1 as vf
from tf_vf_chat import ChatData, ChatHarness, replies, says

HERE = Path(__file__).resolve().parent


class QAConfig(vf.TasksetConfig):
    path: str = str(HERE / "qa.jsonl")


class QATask(vf.Task[ChatData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, task, trace) -> float:
        said = replies(trace)
        return float(bool(said) and says(said[-1], task.answers[0]))


class QATaskset(vf.Taskset[QATask, QAConfig]):
    def load(self):
        path = Path(self.config.path)
        for line in (path if path.is_absolute() else Path.cwd() / path).read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                yield QATask(ChatData(prompt=row["question"], answers=[row["answer"]]), self.config.task)


__all__ = ["ChatHarness", "QATaskset"]
