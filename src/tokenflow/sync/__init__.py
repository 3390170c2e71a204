"""Weight sync transports: shared memory and packed torch.distributed broadcast."""
