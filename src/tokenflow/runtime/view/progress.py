"""Live progress of a run: a two-line rich view on a terminal, periodic plain log lines otherwise.

    train ━━━━━━━━━━━━━━━━━━━━ 12/60 0:00:41 eta 0:02:44 acc 0.391 @ step 0
    reward 0.617  11.5k tok/s  age 1.62 (max 4, 3%>K)  idle: trainer 14%, engine 42%

Every figure is the current one: accuracy is the latest evaluation and names its step (nothing
before the first); throughput and idle fractions are over a sliding window of the engines'
cumulative counters (``tokenflow.runtime.orchestrator.step_metrics.LiveFigures``), so the rate does not drop
to 0 between their once-a-second reports; age is that of the last batch, and "3%>K" the share
of the run's trained tokens older than ``rollout.max_staleness`` (an admission bound, not an age
bound: a straggler overtaken by younger groups is trained older; shown only when there are
some). The view fits 80 columns. While it is up, log records (the workers' too, see ``LogForwarder``) print above it
through rich's console handler instead of tearing it.

Every write to the terminal while the view is up (a refresh, a log record from any thread) holds
one lock for the whole print. Rich's own refresh thread does not suffice: a record printed from
another thread (the workers' forwarder) reads the view's height before a refresh and writes after
it, so when the refresh changed the height (the figures line appearing) it erases one line too few
and a torn copy of the bar stays on the screen.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import warnings

log = logging.getLogger("tokenflow")


def _rate(x: float) -> str:
    return f"{x / 1000:.1f}k" if x >= 1000 else f"{x:.0f}"


def format_figures(info: dict) -> str:
    """The figures line (also the body of the plain periodic lines)."""
    parts = []
    if info.get("reward") is not None:
        parts.append(f"reward {info['reward']:.3f}")
    if info.get("tokens_per_s") is not None:
        parts.append(f"{_rate(info['tokens_per_s'])} tok/s")
    if info.get("age_mean") is not None:
        # max_staleness bounds admission, not age: say how much of the run trained older than it.
        over = f", {info['over_k']:.0%}>K" if info.get("over_k") else ""
        parts.append(f"age {info['age_mean']:.2f} (max {info['age_max']:.0f}{over})")
    idle = [f"{who} {100 * info[key]:.0f}%" for who, key in (("trainer", "trainer_idle"), ("engine", "engine_idle"))
            if info.get(key) is not None]
    if idle:
        parts.append("idle: " + ", ".join(idle))
    return "  ".join(parts)


def format_accuracy(info: dict) -> str:
    acc = info.get("accuracy")
    return "" if acc is None else f"acc {acc[0]:.3f} @ step {acc[1]}"


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
        self.info: dict = {}
        self.status_text: str | None = None
        self._every = max(1, total // 20)
        self._bar = None
        self._swapped: list[tuple[logging.Logger, logging.Handler, logging.Handler]] = []
        self._warnings_routed = False
        self._lock = threading.RLock()  # every print while the view is up (see the module's docstring)
        self._stop = threading.Event()
        self._refresher: threading.Thread | None = None
        if self.live:
            self._start_live()

    def _start_live(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress
        from rich.progress import TextColumn, TimeElapsedColumn, TimeRemainingColumn
        from rich.text import Text

        view = self

        class TwoLines(RichProgress):
            def get_renderables(self):
                yield self.make_tasks_table(self.tasks)
                line = view.status_text or format_figures(view.info)
                if line:  # eval and report bars have no figures: one line
                    yield Text(line, no_wrap=True, overflow="ellipsis", style="dim" if view.status_text else "")

        console = Console(stderr=True)
        self._bar = TwoLines(
            TextColumn("[bold]{task.description}"), BarColumn(bar_width=20), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
            TextColumn("{task.fields[acc]}"), console=console, transient=False, auto_refresh=False)
        self._task = self._bar.add_task(self.description, total=self.total, completed=self.start, acc="")
        self._route_logging(console)
        # A Python warning in this process would be written to stderr by warnings.showwarning,
        # through the bar; as a log record it prints above it. Undone by close.
        self._warnings_routed = getattr(warnings.showwarning, "__module__", "") != "logging"
        if self._warnings_routed:
            logging.captureWarnings(True)
        with self._lock:
            self._bar.start()
        self._refresher = threading.Thread(target=self._refresh_loop, name="tokenflow-view", daemon=True)
        self._refresher.start()

    def _refresh_loop(self) -> None:
        while not self._stop.wait(0.25):  # 4 a second
            self.refresh()

    def refresh(self) -> None:
        """Redraw the live view now (the refresher thread does, 4 times a second)."""
        with self._lock:
            if self._bar is not None:
                self._bar.refresh()

    def _route_logging(self, console) -> None:
        """Swap every stderr stream handler for rich's, on the bar's console, so that records
        print above the bar; ``close`` swaps them back. Not only the root logger's: a library
        can keep its own handler (transformers does, with propagation off), which would write
        through the bar."""
        from rich.logging import RichHandler

        lock = self._lock

        class LockedHandler(RichHandler):
            def emit(self, record):
                with lock:
                    super().emit(record)

        loggers = [logging.getLogger()] + [lg for lg in list(logging.root.manager.loggerDict.values())
                                            if isinstance(lg, logging.Logger)]
        for logger in loggers:
            for h in list(logger.handlers):
                if type(h) is logging.StreamHandler and getattr(h, "stream", None) in (sys.stderr, sys.__stderr__):
                    rich_handler = LockedHandler(console=console, show_path=False, log_time_format="%H:%M:%S",
                                               markup=False, rich_tracebacks=False)
                    rich_handler.setLevel(h.level)
                    rich_handler.setFormatter(logging.Formatter("%(message)s"))
                    logger.removeHandler(h)
                    logger.addHandler(rich_handler)
                    self._swapped.append((logger, h, rich_handler))

    def status(self, text: str | None) -> None:
        """A passing state ("evaluating the starting model"); None returns to the figures."""
        self.status_text = text
        if self._bar is None and self.enabled and text:
            log.info(text)

    def set(self, **figures) -> None:
        """Update figures (``reward``, ``tokens_per_s``, ``age_mean``/``age_max``, ``trainer_idle``/
        ``engine_idle``, ``accuracy`` = (value, step)); the live view shows them at its next refresh."""
        self.info.update(figures)
        if self._bar is not None and "accuracy" in figures:
            self._bar.update(self._task, acc=format_accuracy(self.info))

    def update(self, step: int, info: dict | None = None) -> None:
        self.done = step
        if info:
            self.set(**info)
        if self._bar is not None:
            self._bar.update(self._task, completed=step)
        elif self.enabled and (step % self._every == 0 or step == self.total):
            elapsed = time.monotonic() - self.t0
            rate = (step - self.start) / max(elapsed, 1e-9)
            eta = (self.total - step) / rate if rate > 0 else float("nan")
            figures = "  ".join(p for p in (format_accuracy(self.info), format_figures(self.info)) if p)
            log.info("%s: %s %d/%d  %s  (%.0fs, ETA %.0fs)", self.description, self.unit, step, self.total,
                     figures, elapsed, eta)

    def close(self) -> None:
        if self._refresher is not None:
            self._stop.set()
            self._refresher.join()
            self._refresher = None
        with self._lock:
            if self._bar is not None:
                self._bar.stop()
                self._bar = None
        if self._warnings_routed:
            logging.captureWarnings(False)
            self._warnings_routed = False
        for logger, original, rich_handler in self._swapped:
            logger.removeHandler(rich_handler)
            logger.addHandler(original)
        self._swapped = []
