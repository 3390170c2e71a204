"""The worker processes and what crosses their boundary.

* ``engine_worker``: generation that never waits for the trainer;
* ``trainer_worker``: batches in, one optimizer step each, new weights out;
* ``messages``: the typed messages between orchestrator and workers (nothing else crosses);
* ``process``: running a worker so that its failure and its log records reach the orchestrator;
* ``os_environ``: a worker's OS environment variables (``os.environ``), the orchestrator's
  whatever started it (not the RL environments of ``tokenflow.envs``).

May import: layers 1-4, ``runtime.view`` and ``runtime.drivers``. Never a backend: a backend
starts workers, a worker does not know how it was started.
"""
