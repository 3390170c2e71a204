"""A two-turn verifiers environment: a question, the model's reply, a second question.

Built from the same JSONL rows as ``tf_vf_qa``: task i asks row i, then (as a new user message
after the reply) row i+1. Reward: half for each reply that says its answer.
"""

from __future__ import annotations

import json
from pathlib import Path

import verifiers.v1 as vf
from tf_vf_chat import ChatData, ChatHarness, replies, says

HERE = Path(__file__).resolve().parent


class TwoTurnConfig(vf.TasksetConfig):
    path: str = str(HERE.parent / "tf_vf_qa" / "qa.jsonl")


class TwoTurnTask(vf.Task[ChatData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, task, trace) -> float:
        said = replies(trace)
        hits = [says(text, answer) for text, answer in zip(said, task.answers)]
        return sum(hits) / len(task.answers)


class TwoTurnTaskset(vf.Taskset[TwoTurnTask, TwoTurnConfig]):
    def load(self):
        rows = [json.loads(line) for line in Path(self.config.path).read_text().splitlines() if line.strip()]
        for a, b in zip(rows, rows[1:]):
            data = ChatData(prompt=a["question"], followups=[b["question"]], answers=[a["answer"], b["answer"]])
            yield TwoTurnTask(data, self.config.task)


__all__ = ["ChatHarness", "TwoTurnTaskset"]
