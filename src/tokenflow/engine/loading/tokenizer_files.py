"""Loading a model folder's tokenizer, by its declared class where that is transformers' generic
fast tokenizer.

``AutoTokenizer`` resolves the tokenizer's class from the model's config, so it imports
transformers' config classes (``transformers.activations`` and, through it,
``torch.distributed.tensor`` and sympy: about 0.6 s here) even when ``tokenizer_config.json``
names the generic class. Loading that class directly builds the same object without them, which
keeps them off the path to a run's first generated token (see `tokenflow.runtime.backends.local.preload`).
Torch-free, so the launching process can use it too.
"""

from __future__ import annotations

import json
from pathlib import Path

GENERIC_FAST = ("TokenizersBackend", "PreTrainedTokenizerFast")


def read_tokenizer(folder: str | Path):
    """The folder's tokenizer, as ``AutoTokenizer.from_pretrained(folder)`` builds it."""
    folder = Path(folder)
    try:
        declared = json.loads((folder / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        declared = None  # AutoTokenizer says what is wrong, if anything
    if declared in GENERIC_FAST and (folder / "tokenizer.json").exists():
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(folder)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)
