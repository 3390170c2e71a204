"""What a server's memory is bounded by, from its limits (docs/serve.md, "Memory").

Past what the process holds at rest (``base``: interpreter, model weights, an empty KV cache),
a request can only hold memory through what the limits admit:

* **bodies**: at most ``max_body_bytes_in_flight`` bytes of request bodies at once (reserved
  before they are read), each held as its bytes, its parsed JSON and its validated request.
  `BODY_BYTES_FACTOR` bytes of memory per body byte covers the worst shapes measured (a chat
  message of many tiny text parts, or a body of empty JSON objects: about 25 bytes per byte; a
  text prompt takes 1-5, token ids 5-9).
* **connections**: each open connection may have up to `CONNECTION_BYTES` of unread request
  data buffered (asyncio reads up to 256 KiB at a time; uvicorn stops reading past 64 KiB).
  Connections are not limited by the server (the kernel's accept queue holds the rest); the
  bound takes the number open.
* **tokens**: the KV cache, at most ``max_num_seqs`` slots of ``max_model_len`` positions,
  counted twice (it grows by copying into a larger buffer); and, for every token admitted
  (``max_tokens_in_flight``), `TOKEN_BYTES` of ids, log-probs and text kept by the engine
  and the service.
* **one step**: the engine's activations and logits for ``max_num_batched_tokens`` tokens.
* **tokenizing**: one prompt at a time, at most the prompt bound in characters, encoded with
  `TOKENIZER_BYTES_PER_CHAR` bytes of ids, offsets and token strings per character.
"""

from __future__ import annotations

from tokenflow.config.serve import ServeConfig

BODY_BYTES_FACTOR = 26
"""Memory per body byte: the bytes, their JSON objects and the validated request (measured:
at most 25)."""
CONNECTION_BYTES = 320 * 1024
"""Unread request data buffered per open connection (asyncio's 256 KiB read + uvicorn's 64 KiB
high-water mark)."""
TOKEN_BYTES = 256
"""Per admitted token, outside the KV cache: its id in the prompt or completion lists (engine
and service), its log-prob, its share of the text."""
TOKENIZER_BYTES_PER_CHAR = 256
"""A fast tokenizer's encoding, per character of input (ids, offsets, masks, token strings)."""


def kv_bytes_per_token(hf_config: dict, dtype_bytes: int = 4) -> int:
    """Bytes of KV cache one position takes: keys and values of every layer's KV heads."""
    heads = hf_config.get("num_key_value_heads") or hf_config["num_attention_heads"]
    head_dim = hf_config.get("head_dim") or hf_config["hidden_size"] // hf_config["num_attention_heads"]
    return 2 * hf_config["num_hidden_layers"] * heads * head_dim * dtype_bytes


def memory_bound(config: ServeConfig, *, base_bytes: int, connections: int, max_model_len: int,
                 max_num_seqs: int, max_num_batched_tokens: int, hf_config: dict, dtype_bytes: int = 4) -> dict:
    """The bound's terms and their sum (``"total"``), in bytes (see the module docstring). A
    limit set to 0 (none) has no bound: its term is ``None`` and so is the total."""
    body_budget = config.body_bytes_in_flight(max_model_len)
    token_budget = config.tokens_in_flight(max_num_seqs, max_model_len)
    kv = kv_bytes_per_token(hf_config, dtype_bytes)
    hidden, vocab = hf_config["hidden_size"], hf_config["vocab_size"]
    terms = {
        "base": base_bytes,
        "bodies": body_budget * BODY_BYTES_FACTOR if body_budget else None,
        "connections": connections * CONNECTION_BYTES,
        "kv_cache": 2 * max_num_seqs * max_model_len * kv,
        "tokens": token_budget * TOKEN_BYTES if token_budget else None,
        "step": max_num_batched_tokens * (vocab + 16 * hidden) * dtype_bytes,
        "tokenizing": config.prompt_chars(max_model_len) * TOKENIZER_BYTES_PER_CHAR,
    }
    terms["total"] = None if any(v is None for v in terms.values()) else sum(terms.values())
    return terms
