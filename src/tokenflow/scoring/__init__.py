"""Scoring: rewards computed in worker processes."""
