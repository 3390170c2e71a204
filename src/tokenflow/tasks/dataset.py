"""A user's task: prompts from a local JSONL/JSON/Parquet file, a reward function named by module.

Rows are read with Hugging Face `datasets` and checked at start: a row whose prompt field is
missing or not a non-empty string is reported with its file and row number, before any worker
starts. The training stream walks the rows in a fresh seeded order each epoch; a prompt's id is
its position in that stream, so resume accounts for every prompt exactly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tokenflow.tasks.base import Prompt
from tokenflow.tasks.reward_loading import load_reward_fn

_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


class DatasetError(ValueError):
    pass


def read_rows(path: str, prompt_field: str) -> list[dict]:
    p = Path(path)
    if not p.is_file():
        raise DatasetError(f"dataset file {str(p)!r} does not exist")
    fmt = _FORMATS.get(p.suffix.lower())
    if fmt is None:
        raise DatasetError(f"dataset file {p.name!r}: use .jsonl, .json or .parquet")
    import datasets

    datasets.disable_progress_bars()
    try:
        ds = datasets.load_dataset(fmt, data_files=str(p), split="train")
    except Exception as e:  # noqa: BLE001 - datasets raises many types for a broken file
        raise DatasetError(f"cannot read {p}: {e}") from None
    rows = ds.to_list()
    bad = [i for i, r in enumerate(rows)
           if not isinstance(r.get(prompt_field), str) or not r.get(prompt_field).strip()]
    if bad:
        shown = ", ".join(str(i + 1) for i in bad[:5])
        raise DatasetError(
            f"{p}: {len(bad)} row(s) lack a non-empty string field {prompt_field!r} (rows {shown}"
            f"{', ...' if len(bad) > 5 else ''}); fix them or set task.prompt_field to the prompt column"
        )
    if not rows:
        raise DatasetError(f"{p} holds no rows")
    return rows


class DatasetTask:
    def __init__(self, train_path: str, reward: str, *, eval_path: str | None = None,
                 eval_fraction: float = 0.1, prompt_field: str = "prompt", seed: int = 0) -> None:
        self.name = Path(train_path).stem
        self.reward_spec = reward
        self.reward_fn = load_reward_fn(reward)
        self.prompt_field = prompt_field
        self.seed = seed
        rows = read_rows(train_path, prompt_field)
        # What `tokenflow eval` names as scored: the eval file, or the share held out of train_path.
        self.eval_source = (Path(eval_path).name if eval_path
                            else f"{Path(train_path).name} (the {eval_fraction:.0%} held out)")
        if eval_path:
            self._train, self._eval = rows, read_rows(eval_path, prompt_field)
        else:
            order = np.random.default_rng([seed, 7]).permutation(len(rows))
            n_eval = int(round(eval_fraction * len(rows)))
            self._eval = [rows[i] for i in sorted(order[:n_eval])]
            self._train = [rows[i] for i in sorted(order[n_eval:])]
        if not self._train:
            raise DatasetError(f"{train_path}: no training rows left after holding out the eval split")
        self._epoch_orders: dict[int, np.ndarray] = {}

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._epoch_orders:
            self._epoch_orders[epoch] = np.random.default_rng([self.seed, epoch]).permutation(len(self._train))
        return self._epoch_orders[epoch]

    def train_prompt(self, index: int) -> Prompt:
        epoch, pos = divmod(index, len(self._train))
        row = self._train[int(self._order(epoch)[pos])]
        return Prompt(id=index, text=row[self.prompt_field], example=row)

    def eval_prompts(self) -> list[Prompt]:
        return [Prompt(id=i, text=r[self.prompt_field], example=r) for i, r in enumerate(self._eval)]

    def num_train_prompts(self) -> int | None:
        return len(self._train)
