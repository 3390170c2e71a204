"""Where the workers run, behind one typed surface the orchestrator talks to
(``protocol.Backend``: ``engines``, ``trainer``, ``recv``, ``broadcast``, ``check``, replacing
workers, ``shutdown``):

* ``local``: spawned or fork-server processes on this machine, no services;
* ``ray``: Ray actors on one machine or a cluster, with restarts and a scorer pool of actors.

May import: layers 1-4 and ``runtime.view``, ``runtime.drivers``, ``runtime.workers``.
"""


def trainer_start(cfg, start: tuple[str, str | None], checkpoint=None) -> tuple[str, str | None]:
    """(model folder, resume folder) a replaced trainer starts from: ``checkpoint`` (a checkpoint
    folder) when there is one, else ``start``, where this run's trainer started. LoRA adapters
    resume on the base model; full weights from the checkpoint's own model folder."""
    model, resume_dir = start
    if checkpoint is not None:
        resume_dir = str(checkpoint)
        if cfg.trainer.lora_rank is None:
            model = str(checkpoint / "model")
    return model, resume_dir
