"""Live progress of a run: a rich progress bar on a terminal, periodic log lines otherwise."""

from __future__ import annotations

import logging
import sys
import time

log = logging.getLogger("tokenflow")


def _fmt(info: dict) -> str:
    parts = [f"reward {info['reward']:.3f}" if "reward" in info else None,
             f"acc {info['accuracy']:.3f}" if info.get("accuracy") is not None else None,
             f"{info['tokens_per_s']:.0f} tok/s" if "tokens_per_s" in info else None,
             f"age {info['age_mean']:.2f}/{info['age_max']:.0f}" if "age_mean" in info else None]
    return "  ".join(p for p in parts if p)


class Progress:
    def __init__(self, total: int, start: int = 0, description: str = "train", enabled: bool = True,
                 unit: str = "step") -> None:
        self.total = total
        self.unit = unit
        self.description = description
        self.done = start
        self.t0 = time.monotonic()
        self.start = start
        self.live = enabled and sys.stderr.isatty()
        self.enabled = enabled
        self._every = max(1, total // 20)
        self._bar = None
        if self.live:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress
            from rich.progress import TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self._bar = RichProgress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                TextColumn("{task.fields[info]}"), console=Console(stderr=True), transient=False)
            self._task = self._bar.add_task(description, total=total, completed=start, info="")
            self._bar.start()

    def status(self, text: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, info=text)
        elif self.enabled:
            log.info(text)

    def update(self, step: int, info: dict) -> None:
        self.done = step
        if self._bar is not None:
            self._bar.update(self._task, completed=step, info=_fmt(info))
        elif self.enabled and (step % self._every == 0 or step == self.total):
            elapsed = time.monotonic() - self.t0
            rate = (step - self.start) / max(elapsed, 1e-9)
            eta = (self.total - step) / rate if rate > 0 else float("nan")
            log.info("%s: %s %d/%d  %s  (%.0fs, ETA %.0fs)", self.description, self.unit, step, self.total,
                     _fmt(info), elapsed, eta)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
