"""The vLLM backend: vLLM's engine, in the engine worker's own process, behind `RolloutEngine`.

`engine` (VLLMEngine: requests, steps, per-token versions, abort/resume, update modes), `sample`
(one sample's state, the checkpoint's names and shapes) and
`weight_load` (getting new weights into vLLM: its native weight-transfer API where the installed
version has one, else its in-place reload). Nothing here is imported unless
``engine.backend = "vllm"``.
"""
