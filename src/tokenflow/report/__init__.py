"""`tokenflow report`: figures and a text summary of one run, or two overlaid.

    load_run(RUN_DIR) ─► RunData (summary.json, metrics.jsonl, trace.json, rollouts.jsonl)
                              │
            ┌─────────┬───────┴───┬──────────┬─────────┬─────────┐
          curves   throughput   idle      ages      gantt      text
          (PNG)      (PNG)      (PNG)     (PNG)     (PNG)   (report.txt, report.json)

Every number in the text summary that ``summary.json`` holds (idle fractions, wall times,
accuracies) is read from it, so the report and ``tokenflow bench pipeline`` print the same
values; the figures add the time series behind them.

May import: layers 1-5 (what a run folder holds: ``metrics``, ``runtime.view``); no other front end.
"""

from tokenflow.report.build import make_report
from tokenflow.report.run_data import RunData, load_run

__all__ = ["RunData", "load_run", "make_report"]
