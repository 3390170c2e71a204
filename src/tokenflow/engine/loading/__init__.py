"""Reading a model folder for the built-in engine: ``loader`` (the folder, the context length),
``plain_config`` (a Llama config.json without transformers' config classes),
``tokenizer_files`` (its tokenizer) and ``weights`` (checkpoint reading, update validation, the
sync checksum).

May import: layer 1 and the rest of ``tokenflow.engine``'s low modules (errors, config).
"""
