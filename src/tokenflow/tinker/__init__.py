"""A Tinker-compatible training service (``tokenflow tinker``; docs/tinker.md), layer 5.

The client writes the RL loop (sample, advantages, ``forward_backward`` with a named loss,
``optim_step``) with the official ``tinker`` SDK; this package holds the models and answers
its HTTP calls with tokenflow's parts: the trainer's model loading, LoRA and loss code for
training, the engines for sampling, weight snapshots as policy versions for sampling clients.

Rooms: ``errors`` (the SDK's error categories), ``wire`` (request and response encodings,
JSON and the SDK's protobuf schema), ``losses`` (the SDK's loss names over
`tokenflow.algorithms.losses`), ``training`` (one training client's model and optimizer),
``sampling`` (engines and snapshots), ``store`` (checkpoints on disk), ``futures``,
``service`` (sessions, models, ordering), ``app`` (the HTTP routes).

May import: layers 1-4, and the runtime's memory estimate (`tokenflow.runtime.run.memory_estimate`,
the figures `tokenflow train` checks) to refuse a model that would not fit before loading it. Nothing is imported here: ``import tokenflow`` stays light.
"""
