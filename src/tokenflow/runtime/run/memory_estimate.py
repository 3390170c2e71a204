"""Will the run fit in this machine's memory? An estimate of each worker's peak resident memory,
made before any process starts, and the check that refuses a run that cannot fit.

    trainer  process base + fp32 weights (+ a KL reference) + grads and AdamW moments of the
             trainable parameters + activations (per token per layer × micro-batch tokens)
             + logits (vocabulary × min(micro-batch, logprob_chunk) tokens)
    engine   process base + weights in its dtype + KV cache (max_num_seqs × longest sequence)

Only what lives in host memory is compared with it: a worker on a GPU counts its process base.
The figures are compared with MemAvailable and the cgroup's limit (``TOKENFLOW_MEMORY_AVAILABLE_GB``
replaces both, for the check only); ``runtime.check_memory = false`` turns the refusal into a
warning. The factors are calibrated on a CPU trainer step (docs/howto/laptop.md, "Memory").
Standard library only: ``tokenflow train --dry-run`` prints it without importing torch.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from tokenflow.errors import InputError

GB = 1e9
AVAILABLE_ENV = "TOKENFLOW_MEMORY_AVAILABLE_GB"

# Calibrated on CPU trainer steps (VmHWM of a trainer process, `train_step` on full micro-batches):
# the shipped tiny model and SmolLM2-135M at 512-4096 tokens (docs/howto/laptop.md, "Memory").
PROCESS_BASE = 0.4 * GB  # an idle worker: Python, torch, transformers, our modules
ACT_PER_HIDDEN = 16.0  # activation floats kept for the backward pass, per token per layer, × hidden
ACT_PER_INTER = 5.0  # ... × intermediate (MLP) size
CHECKPOINTED = 0.35  # the fraction of that still held at the peak with trainer.gradient_checkpointing
LOGIT_COPIES = 4.0  # float32 logits of a chunk: logits, log-softmax, their gradients
PROMPT_TOKENS = 256  # a prompt's length when the task's prompts are not at hand (--dry-run)


@dataclass
class ModelShape:
    params: int
    hidden: int
    layers: int
    intermediate: int
    vocab: int
    kv_dim: int  # kv heads × head dim
    max_positions: int

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
        return cls(params, hidden, layers, inter, vocab, kv_dim, int(c.get("max_position_embeddings") or 4096))


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


def _on_gpu(device: str) -> bool:
    if device == "cuda":
        return True
    return device == "auto" and Path("/dev/nvidiactl").exists()


def estimate(cfg, model: str | Path, prompt_tokens: int = PROMPT_TOKENS) -> Estimate:
    """Each worker's peak host memory for ``cfg`` on the model folder ``model``."""
    m = ModelShape.read(model)
    t, e, est = cfg.trainer, cfg.engine, Estimate()
    seq = min(prompt_tokens + cfg.sampling.max_tokens, e.max_model_len or m.max_positions, m.max_positions)
    batch_tokens = cfg.rollout.prompts_per_step * cfg.rollout.group_size * seq
    tokens = min(t.micro_batch_tokens, batch_tokens)  # a micro-batch holds at most the whole batch
    trainer = {"base": PROCESS_BASE}
    if not _on_gpu(t.device):
        trainable = 0 if t.lora_rank else m.params
        kl = cfg.algorithm.kl_coef > 0 and not (t.lora_rank and cfg.algorithm.reference_model is None)
        floats = m.layers * (ACT_PER_HIDDEN * m.hidden + ACT_PER_INTER * m.intermediate)
        if t.gradient_checkpointing:  # layer inputs, a layer recomputed, its gradients: measured
            floats *= CHECKPOINTED
        trainer |= {"weights": 4 * m.params * (2 if kl else 1), "grads+adam": 12 * trainable,
                    "activations": 4 * tokens * floats,
                    "logits": 4 * LOGIT_COPIES * m.vocab * min(tokens, t.logprob_chunk_tokens)}
    for rank in range(t.world_size):
        est.parts["trainer" if rank == 0 else f"trainer{rank}"] = dict(trainer)
    engine = {"base": PROCESS_BASE}
    if not _on_gpu(e.device) and e.backend == "builtin":
        width = 2 if e.dtype == "bfloat16" else 4
        kv = 2 * m.layers * m.kv_dim * width * e.max_num_seqs * seq
        engine |= {"weights": width * m.params, "kv_cache": 1.5 * kv}  # growing copies the old cache
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


def _fix(est: Estimate, cfg) -> str:
    worst = max(est.parts, key=est.worker)
    parts = est.parts[worst]
    if worst.startswith("engine"):
        return ("lower engine.max_num_seqs or sampling.max_tokens" if parts.get("kv_cache", 0) > parts.get("weights", 0)
                else "use a smaller model")
    big = max(parts, key=parts.get)
    if big in ("activations", "logits"):
        return (f"lower trainer.micro_batch_tokens (now {cfg.trainer.micro_batch_tokens})"
                + ("" if cfg.trainer.gradient_checkpointing else " or turn on trainer.gradient_checkpointing"))
    return "use a smaller model or trainer.lora_rank"


def check_memory(cfg, model: str | Path, prompt_tokens: int = PROMPT_TOKENS, log=None) -> Estimate:
    """Refuse (``InputError``) a run whose estimate exceeds the memory available, unless
    ``runtime.check_memory`` is off (then a warning)."""
    est = estimate(cfg, model, prompt_tokens)
    have, source = available_bytes()
    if log is not None:
        log.info("memory estimate: %s; %.2f GB in all, %s available (%s)", "; ".join(est.lines()), est.total() / GB,
                 f"{have / GB:.2f} GB" if have is not None else "unknown", source)
    if have is None or est.total() <= have:
        return est
    msg = (f"the run needs about {est.total() / GB:.1f} GB of memory ({'; '.join(est.lines())}) but "
           f"{have / GB:.1f} GB is available ({source}); {_fix(est, cfg)}, or set runtime.check_memory = false "
           "to start anyway")
    if getattr(cfg.runtime, "check_memory", True):
        raise InputError(msg)
    if log is not None:
        log.warning("%s (runtime.check_memory = false: starting anyway)", msg)
    return est


def dry_run_lines(cfg, model: str | Path) -> list[str]:
    """The estimate as TOML comments, for ``tokenflow train --dry-run``."""
    est = estimate(cfg, model)
    have, source = available_bytes()
    out = ["# memory estimate (peak resident, host): " + f"{est.total() / GB:.2f} GB in all"]
    out += [f"#   {line}" for line in est.lines()]
    out.append(f"#   available: {have / GB:.2f} GB ({source})" if have is not None else "#   available: unknown")
    if have is not None and est.total() > have:
        out.append(f"#   does not fit: {_fix(est, cfg)}")
    return out
