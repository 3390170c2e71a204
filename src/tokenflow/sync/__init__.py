"""Weight sync transports: shared memory and packed torch.distributed broadcast.

May import: layer 1 (``metrics``, ``errors``) and its own modules; never the engine or the
trainer, which import it.
"""
