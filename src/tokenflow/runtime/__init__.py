"""The runtime: the orchestrator, the worker processes, the run folder, the live view.

A regular package (not a namespace one) so that setuptools' package finder ships it in a wheel
and the API reference can document it. Nothing is imported here: ``import tokenflow`` stays light.
"""
