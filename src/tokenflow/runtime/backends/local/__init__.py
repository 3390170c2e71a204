"""The local backend: ``backend`` (engine and trainer processes on this machine), ``start`` (how
they start: spawn or a fork server warmed early) and ``preload`` (what the fork server imports).

May import: what ``runtime.backends`` may.
"""
