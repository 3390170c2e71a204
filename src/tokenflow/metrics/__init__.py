"""Metrics sinks and timeline traces."""
