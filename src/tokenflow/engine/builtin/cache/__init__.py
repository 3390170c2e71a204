"""The built-in engine's key/value memory: ``kv_cache`` (slots and per-layer tensors) and
``parked`` (the KV of finished sequences, kept for their next model turn).

May import: layer 1 and the engine seam (``tokenflow.engine``'s own modules); nothing else of
``tokenflow.engine.builtin``.
"""
