"""A user's task: prompts from a local JSONL/JSON/Parquet file, a reward function named by module.

Rows are read with Hugging Face `datasets` and checked at start: a row whose prompt field is
missing or not a non-empty string is reported with its file and row number, before any worker
starts. The training stream walks the rows in a fresh seeded order each epoch; a prompt's id is
its position in that stream, so resume accounts for every prompt exactly.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from tokenflow.tasks.base import Prompt
from tokenflow.tasks.reward_loading import load_reward_fn

_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


class DatasetError(ValueError):
    pass


def _read_jsonl(p: Path) -> tuple[list[int], list]:
    """Rows of a JSON Lines file with their line numbers (blank lines skipped); a line that is
    not UTF-8 or not JSON is named with its number and what is wrong with it."""
    numbers, rows = [], []
    with open(p, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DatasetError(f"{p}: line {number} is not UTF-8 ({e.reason} at byte {e.start}); "
                                   "save the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{p}: line {number} is not valid JSON ({e.msg} at column {e.colno}); "
                                   "each line must hold one JSON object") from None
            numbers.append(number)
            rows.append(row)
    return numbers, rows


def read_numbered_rows(path: str, prompt_field: str, require_prompt: bool = True) -> tuple[list[int], list[dict]]:
    """The rows of a data file and each one's number in it (the line of a JSONL file, the
    1-based position otherwise), checked: each is an object with (when ``require_prompt``) a
    non-empty prompt string."""
    p = Path(path)
    if not p.is_file():
        raise DatasetError(f"dataset file {str(p)!r} does not exist; check task.train_path / task.eval_path")
    fmt = _FORMATS.get(p.suffix.lower())
    if fmt is None:
        raise DatasetError(f"dataset file {p.name!r} has an unknown format; use .jsonl, .json or .parquet")
    if p.suffix.lower() == ".jsonl":
        numbers, rows = _read_jsonl(p)
    else:
        import datasets

        datasets.disable_progress_bars()
        # datasets logs the useful detail of a failure at ERROR level before raising; it goes in
        # the one-line message below instead.
        ds_log = logging.getLogger("datasets")
        level = ds_log.level
        ds_log.setLevel(logging.CRITICAL)
        try:
            ds = datasets.load_dataset(fmt, data_files=str(p), split="train")
        except Exception as e:  # noqa: BLE001 - datasets raises many types for a broken file
            # Its message may be empty or sit in a chained exception: name the innermost one.
            while e.__cause__ is not None or e.__context__ is not None:
                e = e.__cause__ or e.__context__
            detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise DatasetError(f"cannot read {p} as {p.suffix.lower()} ({detail}); fix the file "
                               "or save it as JSON Lines") from None
        finally:
            ds_log.setLevel(level)
        rows = ds.to_list()
        numbers = list(range(1, len(rows) + 1))
    if not rows:
        raise DatasetError(f"{p} holds no rows; add one JSON object per line with a {prompt_field!r} field")
    what = "line" if p.suffix.lower() == ".jsonl" else "row"
    not_obj = [n for n, r in zip(numbers, rows) if not isinstance(r, dict)]
    if not_obj:
        raise DatasetError(f"{p}: {what} {not_obj[0]} is not a JSON object ({len(not_obj)} such); "
                           f"write each row as {{\"{prompt_field}\": ...}}")
    bad = [n for n, r in zip(numbers, rows)
           if require_prompt and (not isinstance(r.get(prompt_field), str) or not r.get(prompt_field).strip())]
    if bad:
        shown = ", ".join(str(n) for n in bad[:5])
        raise DatasetError(
            f"{p}: {len(bad)} row(s) lack a non-empty string field {prompt_field!r} ({what}s {shown}"
            f"{', ...' if len(bad) > 5 else ''}); fix them or set task.prompt_field to the prompt column"
        )
    return numbers, rows


def read_rows(path: str, prompt_field: str) -> list[dict]:
    return read_numbered_rows(path, prompt_field)[1]


def _where(path: str, number: int) -> str:
    p = Path(path)
    return f"{p.name} {'line' if p.suffix.lower() == '.jsonl' else 'row'} {number}"


class DatasetTask:
    def __init__(self, train_path: str, reward: str | None, *, eval_path: str | None = None,
                 eval_fraction: float = 0.1, prompt_field: str = "prompt", seed: int = 0,
                 require_prompt: bool = True) -> None:
        """``reward`` None (and ``require_prompt`` False) serves an environment's examples
        (`tokenflow.envs.task`): its rubric scores, its reset() reads the rows."""
        self.name = Path(train_path).stem
        self.reward_spec = reward
        self.reward_fn = load_reward_fn(reward) if reward is not None else None
        self.prompt_field = prompt_field
        self.seed = seed
        numbers, rows = read_numbered_rows(train_path, prompt_field, require_prompt)
        # (where, prompt) of every row, for checks that name a row (tokenflow.runtime.run.preflight)
        self.rows = [(_where(train_path, n), self._text(r)) for n, r in zip(numbers, rows)]
        # What `tokenflow eval` names as scored: the eval file, or the share held out of train_path.
        self.eval_source = (Path(eval_path).name if eval_path
                            else f"{Path(train_path).name} (the {eval_fraction:.0%} held out)")
        if eval_path:
            eval_numbers, eval_rows = read_numbered_rows(eval_path, prompt_field, require_prompt)
            self.rows += [(_where(eval_path, n), self._text(r)) for n, r in zip(eval_numbers, eval_rows)]
            self._train, self._eval = rows, eval_rows
        else:
            order = np.random.default_rng([seed, 7]).permutation(len(rows))
            n_eval = int(round(eval_fraction * len(rows)))
            self._eval = [rows[i] for i in sorted(order[:n_eval])]
            self._train = [rows[i] for i in sorted(order[n_eval:])]
        if not self._train:
            raise DatasetError(f"{train_path}: no training rows left after holding out the eval split")
        self._epoch_orders: dict[int, np.ndarray] = {}

    def _text(self, row: dict) -> str:
        text = row.get(self.prompt_field)
        return text if isinstance(text, str) else ""

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._epoch_orders:
            self._epoch_orders[epoch] = np.random.default_rng([self.seed, epoch]).permutation(len(self._train))
        return self._epoch_orders[epoch]

    def train_prompt(self, index: int) -> Prompt:
        epoch, pos = divmod(index, len(self._train))
        row = self._train[int(self._order(epoch)[pos])]
        return Prompt(id=index, text=self._text(row), example=row)

    def eval_prompts(self) -> list[Prompt]:
        return [Prompt(id=i, text=self._text(r), example=r) for i, r in enumerate(self._eval)]

    def num_train_prompts(self) -> int | None:
        return len(self._train)


def from_config(cfg):
    """A file of prompts scored by ``task.reward`` (``task.name = "dataset"`` without ``task.env``;
    the registered factory, `tokenflow.envs.task.from_dataset_config`, decides)."""
    return DatasetTask(cfg.train_path, cfg.reward, eval_path=cfg.eval_path, eval_fraction=cfg.eval_fraction,
                       prompt_field=cfg.prompt_field, seed=cfg.seed)
