"""Reading a Hugging Face model folder, part of the engine seam: ``loader`` (the folder, EOS ids,
the context length), ``plain_config`` (a Llama config.json without transformers' config
classes), ``tokenizer_files`` (its tokenizer) and ``weights`` (checkpoint reading, update
validation, the sync checksum). Shared: both backends read checkpoints and validate updates with
it, the seam's `RolloutEngine` names its `NamedTensors`, ``tokenflow.engine.weights_checksum`` is
the public checksum, and the trainer worker and the preflight load tokenizers with it.

May import: layer 1 and the seam's low modules (``tokenflow.engine.errors``); no backend.
"""
