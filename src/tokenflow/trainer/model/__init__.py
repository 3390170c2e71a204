"""The trained model and what sits on it: loading the policy and its KL reference (``loading``),
LoRA adapters (``lora``), lean norms and MLPs (``lean_layers``, for the families in
``lean_families``), the value head (``value_head``), running a model on a packed
micro-batch (``runner``), and the host memory a CPU trainer keeps between steps (``memory``).

May import: layers 1-2 and ``tokenflow.trainer.batch`` / ``tokenflow.trainer.logprobs``.
"""
