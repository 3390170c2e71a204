"""Will the run fit in this machine's memory? An estimate of each worker's peak resident memory,
made before any process starts, and the check that refuses a run that cannot fit.

    trainer  process base + fp32 weights (+ a KL reference) + grads and AdamW moments of the
             trainable parameters + activations (per token per layer × micro-batch tokens; less
             under bfloat16 autocast and gradient checkpointing)
             + logits (vocabulary × min(micro-batch, logprob_chunk) tokens)
             + the weight sync's shared-memory slots + a background checkpoint's copy
    engine   process base + weights in its dtype + KV cache (max_num_seqs × longest sequence)

Only what lives in host memory is counted: a worker on a GPU counts its process base. The check
that compares the figures with the memory available and with ``trainer.memory_budget_gb`` is
``tokenflow.runtime.run.memory_budget``. The factors are calibrated on CPU trainer steps
(docs/howto/laptop.md, "Memory"). Standard library only: ``tokenflow train --dry-run`` prints
it without importing torch.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from tokenflow.config.sync import wire_dtype
from tokenflow.engine.builtin.models import LARGE_WEIGHT
from tokenflow.errors import InputError
from tokenflow.precision import cpu_onednn_bf16
from tokenflow.trainer.model.lean_families import FULL_FAMILIES as LEAN_FAMILIES

GB = 1e9
AVAILABLE_ENV = "TOKENFLOW_MEMORY_AVAILABLE_GB"

# Calibrated on CPU trainer steps (VmHWM of a trainer process over two `train_step`s on full
# micro-batches of 128-token sequences in 512-token rows): the shipped tiny model at 512-8192 tokens
# and SmolLM2-135M at 1024-8192 (docs/howto/laptop.md, "Memory").
PROCESS_BASE = 0.4 * GB  # an idle worker: Python, torch, transformers, our modules
ACT_PER_HIDDEN = 16.0  # float32 activations kept for the backward pass, per token per layer, × hidden
ACT_PER_INTER = 5.0  # ... × intermediate (MLP) size
AUTOCAST_BF16 = 2 / 3  # their bytes under bfloat16 autocast: matmul inputs in bfloat16, norms in float32
CHECKPOINTED = 0.45  # the fraction of that still held at the peak with trainer.gradient_checkpointing
LOGIT_COPIES = 4.0  # float32 logits of a chunk: logits, log-softmax, their gradients
PROMPT_TOKENS = 256  # a prompt's length when the task's prompts are not at hand (--dry-run)
# trainer.lean_activations (trainer/model/lean_layers.py): float32-sized values per token per
# layer off the peak, × (hidden, intermediate). Under bfloat16 autocast, what autograd no longer
# keeps (each RMSNorm's float32 x·rstd; silu(gate) and silu(gate)·up in bfloat16; x's second cast):
# SmolLM2's first step measured 0.17 GB less where this counts 0.18. In float32 autograd stops
# keeping 2 × (hidden + intermediate), but the tiny model's peak fell by only 350-640 floats per
# token-layer (2,048-16,384 tokens; why is not established: the backward's transient buffers may
# set that peak), so the low end is counted: one intermediate-size value.
LEAN_FP32 = (0.0, 1.0)
LEAN_BF16 = (2.5, 1.0)


@dataclass
class ModelShape:
    params: int
    hidden: int
    layers: int
    intermediate: int
    vocab: int
    kv_dim: int  # kv heads × head dim
    max_positions: int
    family: str = ""  # config.json's model_type

    @classmethod
    def read(cls, folder: str | Path) -> "ModelShape":
        folder = Path(folder)
        c = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        c = c.get("text_config", c)
        hidden, layers = int(c["hidden_size"]), int(c["num_hidden_layers"])
        heads = int(c.get("num_attention_heads", 1))
        head_dim = int(c.get("head_dim") or hidden // heads)
        kv_dim = int(c.get("num_key_value_heads") or heads) * head_dim
        inter = int(c.get("intermediate_size") or 4 * hidden)
        vocab = int(c["vocab_size"])
        params = safetensors_params(folder)
        if params is None:
            experts = int(c.get("num_local_experts") or 1)
            per_layer = 2 * hidden * hidden + 2 * hidden * kv_dim + 3 * hidden * inter * experts
            params = layers * per_layer + vocab * hidden * (1 if c.get("tie_word_embeddings") else 2)
        return cls(params, hidden, layers, inter, vocab, kv_dim, int(c.get("max_position_embeddings") or 4096),
                   str(c.get("model_type") or ""))


def safetensors_params(folder: Path) -> int | None:
    """The number of weights in the folder's safetensors files, read from their headers."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    n = 0
    try:
        for f in files:
            with open(f, "rb") as fh:
                (size,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(size))
            for name, t in header.items():
                if name != "__metadata__":
                    count = 1
                    for d in t["shape"]:
                        count *= d
                    n += count
    except (OSError, ValueError, KeyError, struct.error):
        return None
    return n


@dataclass
class Estimate:
    """Each worker's estimated peak host memory, in bytes, and what it is made of."""

    parts: dict[str, dict[str, float]] = field(default_factory=dict)  # worker -> {part: bytes}

    def worker(self, name: str) -> float:
        return sum(self.parts[name].values())

    def total(self) -> float:
        return sum(self.worker(w) for w in self.parts)

    def lines(self) -> list[str]:
        out = []
        for w, parts in self.parts.items():
            body = ", ".join(f"{k} {v / GB:.2f}" for k, v in parts.items() if v)
            out.append(f"{w}: {self.worker(w) / GB:.2f} GB ({body})")
        return out


def on_gpu(device: str) -> bool:
    if device == "cuda":
        return True
    return device == "auto" and Path("/dev/nvidiactl").exists()


def sequence_tokens(cfg, m: ModelShape, prompt_tokens: int = PROMPT_TOKENS) -> int:
    """The longest sequence a rollout can have: its prompt and ``sampling.max_tokens``."""
    return min(prompt_tokens + cfg.sampling.max_tokens, cfg.engine.max_model_len or m.max_positions, m.max_positions)


def micro_batch_fill(cfg, seq: int, micro_batch_tokens: int | None = None) -> int:
    """The tokens of the fullest micro-batch: ``micro_batch_tokens`` (the config's when None), at
    least one whole sequence (a longer one is a micro-batch by itself), at most the whole batch
    (every rollout at its longest)."""
    batch_tokens = cfg.rollout.prompts_per_step * cfg.rollout.group_size * seq
    return min(max(micro_batch_tokens or cfg.trainer.micro_batch_tokens, seq), batch_tokens)


def trainer_parts(cfg, m: ModelShape, tokens: int, *, checkpointing: bool | None = None,
                  chunk: int | None = None) -> dict[str, float]:
    """A CPU trainer's peak host memory, in bytes by part, for a micro-batch of ``tokens`` tokens;
    ``checkpointing`` and ``chunk`` replace ``trainer.gradient_checkpointing`` and
    ``trainer.logprob_chunk_tokens`` (to price a fix)."""
    t = cfg.trainer
    checkpointing = t.gradient_checkpointing if checkpointing is None else checkpointing
    chunk = t.logprob_chunk_tokens if chunk is None else chunk
    if t.world_size > 1:  # sharded (FSDP) trainers compute the log-probs unchunked
        chunk = tokens
    trainable = _trainable(cfg, m)
    kl = cfg.algorithm.kl_coef > 0 and not (t.lora_rank and cfg.algorithm.reference_model is None)
    floats = m.layers * (ACT_PER_HIDDEN * m.hidden + ACT_PER_INTER * m.intermediate)
    if t.dtype == "bfloat16":
        floats *= AUTOCAST_BF16
    if t.lean_activations and m.family in LEAN_FAMILIES:  # not kept (trainer/model/lean_layers.py): see LEAN_* above
        per_hidden, per_inter = LEAN_BF16 if t.dtype == "bfloat16" else LEAN_FP32
        floats -= m.layers * (per_hidden * m.hidden + per_inter * m.intermediate)
    if checkpointing:  # layer inputs, a layer recomputed, its gradients: measured
        floats *= CHECKPOINTED
    return {"base": PROCESS_BASE, "weights": 4 * m.params * (2 if kl else 1), "grads+adam": 12 * trainable,
            "activations": 4 * tokens * floats, "logits": 4 * LOGIT_COPIES * m.vocab * min(tokens, chunk)}


def _trainable(cfg, m: ModelShape) -> int:
    """Parameters with gradients and AdamW moments: none of the base model's under LoRA (its
    adapters are small enough to leave out)."""
    return 0 if cfg.trainer.lora_rank else m.params


def run_trainer_parts(cfg, m: ModelShape, tokens: int, **switches) -> dict[str, float]:
    """A trainer in a ``tokenflow train`` run, in bytes by part: its steps (`trainer_parts`, with
    ``switches``) and what it holds beside them, the weight sync's ``sync.slots`` shared-memory
    slots and a background checkpoint's copy."""
    parts = trainer_parts(cfg, m, tokens, **switches)
    if cfg.sync.transport == "shared_memory":
        # sync.slots copies of the weights as they travel (sync.dtype); the engines map the same
        # pages, so they are counted here once
        parts["sync_slots"] = cfg.sync.slots * m.params * (2 if wire_dtype(cfg.sync, cfg.engine.dtype) else 4)
    if cfg.run.checkpoint_every and cfg.run.checkpoint_background:
        # the copy a background checkpoint writes from, kept for the next one: float32 weights
        # and AdamW's two moments
        parts["checkpoint_copy"] = 4 * m.params + 8 * _trainable(cfg, m)
    return parts


def packed_float32_params(m: ModelShape) -> int:
    """The elements of the float32 linear weights the built-in engine packs
    (`engine.builtin.models.packed.packs`: those of at least `LARGE_WEIGHT` elements): each
    layer's fused q/k/v, output, fused gate/up and down products, and the head (dense models)."""
    per_layer = [m.hidden * (m.hidden + 2 * m.kv_dim), m.hidden * m.hidden, 2 * m.hidden * m.intermediate,
                 m.hidden * m.intermediate]
    head = m.vocab * m.hidden
    return m.layers * sum(n for n in per_layer if n >= LARGE_WEIGHT) + (head if head >= LARGE_WEIGHT else 0)


def estimate(cfg, model: str | Path, prompt_tokens: int = PROMPT_TOKENS) -> Estimate:
    """Each worker's peak host memory for ``cfg`` on the model folder ``model``."""
    m = ModelShape.read(model)
    t, e, est = cfg.trainer, cfg.engine, Estimate()
    seq = sequence_tokens(cfg, m, prompt_tokens)
    trainer = run_trainer_parts(cfg, m, micro_batch_fill(cfg, seq)) if not on_gpu(t.device) else {"base": PROCESS_BASE}
    for rank in range(t.world_size):
        est.parts["trainer" if rank == 0 else f"trainer{rank}"] = dict(trainer)
    engine = {"base": PROCESS_BASE}
    if not on_gpu(e.device) and e.backend == "builtin":
        width = 2 if e.dtype == "bfloat16" else 4
        kv = 2 * m.layers * m.kv_dim * width * e.max_num_seqs * seq
        engine |= {"weights": width * m.params, "kv_cache": 1.5 * kv}  # growing copies the old cache
        if e.keep_host_memory_mb:  # freed memory the heap keeps for the next step
            engine["kept_heap"] = e.keep_host_memory_mb << 20
        if e.pack_weights and e.dtype == "bfloat16" and cpu_onednn_bf16():
            # oneDNN's packed copies of the linear weights: every weight but an untied embedding
            # (counted whole: a little high for untied models)
            engine["packed_weights"] = width * m.params
        elif e.pack_weights and e.dtype == "float32" and (packed := packed_float32_params(m)):
            engine["packed_weights"] = width * packed
    for i in range(cfg.runtime.num_engines):
        est.parts["engine" if cfg.runtime.num_engines == 1 else f"engine{i}"] = dict(engine)
    return est


def available_bytes() -> tuple[float | None, str]:
    """What the run may use: the least of MemAvailable and the cgroup's free room (its limit less
    its usage), or ``TOKENFLOW_MEMORY_AVAILABLE_GB``; and where the figure comes from."""
    override = os.environ.get(AVAILABLE_ENV)
    if override:
        try:
            return float(override) * GB, f"{AVAILABLE_ENV}={override}"
        except ValueError:
            raise InputError(f"{AVAILABLE_ENV}={override!r} is not a number of GB") from None
    from tokenflow.runtime.workers.memory_watch import cgroup_limit_bytes, cgroup_memory_dir, read_counter

    figures = []
    avail = read_counter("/proc/meminfo", "MemAvailable:")
    if avail is not None:
        figures.append((avail * 1024.0, "MemAvailable"))
    found = cgroup_memory_dir()
    limit = cgroup_limit_bytes(found)
    if limit is not None and found is not None:
        d, version = found
        try:
            used = int((d / ("memory.current" if version == 2 else "memory.usage_in_bytes")).read_text())
        except (OSError, ValueError):
            used = 0
        figures.append((float(limit - used), f"cgroup limit {limit / GB:.1f} GB less {used / GB:.1f} GB used"))
    if not figures:
        return None, "unknown"
    return min(figures)
