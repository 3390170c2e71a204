"""Metrics sinks and timeline traces, and how a run folder's files are written (``safe_files``:
never through a link).

May import: its own modules and ``tokenflow.errors`` (layer 1, below everything that records
through it); tensorboard and wandb lazily, inside their sinks.
"""
