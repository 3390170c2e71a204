"""Per-prompt sampling seeds."""

from __future__ import annotations


def request_seed(run_seed: int, prompt_id: int) -> int:
    """The same prompt gets the same samples in every run, on resume and after an engine restart."""
    return (run_seed * 1_000_003 + prompt_id) % (2**31 - 1)
