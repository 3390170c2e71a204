"""The Ray backend: ``backend`` (engines and trainer ranks as actors), ``actors`` (the actor that
runs a worker loop), ``placement`` (resources and placement groups), ``scoring`` (the scorer
pool as actors). Ray loads only when this backend is chosen.

May import: what ``runtime.backends`` may.
"""
