"""Which model families ``trainer.lean_activations`` changes, by ``model_type`` (config.json).

Standard library only: the memory estimate (``tokenflow train --dry-run``, which does not import
torch) reads the same table as ``lean_layers``, which swaps the modules.
"""

from __future__ import annotations

# model_type → (RMSNorm class, gated-MLP class or None where only the norms are swapped)
LEAN_CLASSES: dict[str, tuple[str, str | None]] = {
    "llama": ("LlamaRMSNorm", "LlamaMLP"),
    "mistral": ("MistralRMSNorm", "MistralMLP"),
    "qwen2": ("Qwen2RMSNorm", "Qwen2MLP"),
    "qwen3": ("Qwen3RMSNorm", "Qwen3MLP"),
    "qwen3_moe": ("Qwen3MoeRMSNorm", None),  # its experts are not one gated MLP
    "olmo": ("OlmoRMSNorm", None),
}

NORMS = frozenset(norm for norm, _ in LEAN_CLASSES.values())
MLPS = frozenset(mlp for _, mlp in LEAN_CLASSES.values() if mlp)
# families whose norms and MLPs are both swapped: what the memory estimate subtracts for (it errs
# high for the others)
FULL_FAMILIES = frozenset(t for t, (_, mlp) in LEAN_CLASSES.items() if mlp)
