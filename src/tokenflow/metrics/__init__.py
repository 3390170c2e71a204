"""Metrics sinks and timeline traces.

May import: its own modules only (layer 1, below everything that records through it); tensorboard
and wandb lazily, inside their sinks.
"""
