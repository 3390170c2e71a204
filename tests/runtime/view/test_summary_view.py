"""The end-of-run table: what it says, and that it fits an 80-column terminal."""

from __future__ import annotations

from rich.console import Console

from tokenflow.runtime.view.summary import print_summary, summary_rows

SUMMARY = {"baseline_accuracy": 0.390625, "final_accuracy": 0.98046875, "steps": 6, "wall_s": 10.0,
           "train_wall_s": 4.0, "mode": "async", "max_staleness": 2, "update_mode": "inflight",
           "trainer_idle_frac": 0.1356, "engine_idle_frac": 0.4208, "tokens_generated": 30000.0,
           "in_flight_prompt_ids": [], "last_reward_mean": 0.7578125,
           "token_age_histogram": {"0": 1, "1": 1, "2": 2}, "run_dir": "runs/a-rather-long-run-name-for-wrapping"}


def test_rows_say_what_changed_and_how_it_ran():
    rows = dict(summary_rows(SUMMARY))
    assert rows["held-out accuracy"] == "0.391 → 0.980  (+0.590)"
    assert rows["idle"] == "trainer 14%, engine 42%"
    assert rows["token age"] == "mean 1.25, max 2 versions behind"  # (0 + 1 + 2·2) / 4
    assert rows["throughput"] == "30,000 tokens generated, 3,000 tok/s over the wall time"
    assert rows["steps"].startswith("6 (async, admission bound max_staleness 2")


def test_tokens_older_than_the_staleness_budget_are_told():
    """max_staleness bounds admission, not token age: the table says how much was trained older."""
    rows = dict(summary_rows({**SUMMARY, "max_staleness": 1}))
    assert rows["token age"].startswith("mean 1.25, max 2 versions behind; 50.0% older than max_staleness 1 "
                                        "(an admission bound; algorithm.max_token_age drops them")


def test_table_fits_80_columns_and_names_the_next_commands(tmp_path):
    (tmp_path / "tensorboard").mkdir()
    console = Console(width=80, record=True, file=open("/dev/null", "w"))
    print_summary({**SUMMARY, "run_dir": str(tmp_path)}, console)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "tokenflow report" in text and "look further" in text
    assert "tensorboard --logdir" in text and "tokenflow eval" in text


def test_no_tensorboard_folder_no_tensorboard_command(tmp_path):
    console = Console(width=80, record=True, file=open("/dev/null", "w"))
    print_summary({**SUMMARY, "run_dir": str(tmp_path)}, console)
    assert "tensorboard --logdir" not in console.export_text()


def test_engines_that_joined_or_left_get_a_row():
    assert "engines" not in dict(summary_rows({**SUMMARY, "engines": {
        "added": [], "removed": [], "readmitted_groups": 0, "final": ["engine"]}}))
    rows = dict(summary_rows({**SUMMARY, "engines": {
        "added": ["engine2"], "removed": ["engine0"], "readmitted_groups": 4, "final": ["engine1", "engine2"]}}))
    assert rows["engines"] == "added engine2, removed engine0 (4 groups re-sent); at the end engine1, engine2"


def test_each_workers_peak_memory_is_shown():
    rows = dict(summary_rows({**SUMMARY, "peak_rss_gb": {"trainer": 2.345, "engine-0": 0.6}}))
    assert rows["peak memory"] == "engine-0 0.60 GB, trainer 2.35 GB resident"
    assert "peak memory" not in dict(summary_rows(SUMMARY))  # a backend that does not sample it (Ray)
