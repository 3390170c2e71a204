"""The vLLM backend: vLLM's engine, in the engine worker's own process, behind `RolloutEngine`.

`engine` (VLLMEngine: requests, steps, per-token versions, abort/resume, update modes), `sample`
(one sample's state, the checkpoint's names and shapes),
`weight_load` (getting new weights into vLLM: its native weight-transfer API where the installed
version has one, else its in-place reload), `routing` (Keep Routing from vLLM's routed-experts
return) and `engine_args`. Nothing here is imported unless ``engine.backend = "vllm"``; its
capabilities are `tokenflow.engine.backends.VLLM`.

May import: layer 1 and the engine seam (``tokenflow.engine``'s own modules and ``loading/``);
never the built-in backend (the ``builtin`` subpackage beside this one).
"""
