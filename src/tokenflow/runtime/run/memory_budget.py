"""Memory is a budget: the check, made before any process starts, that the run fits in the memory
available and that the trainer fits in its own budget (``trainer.memory_budget_gb``), with the
numbers and the settings that would fit when it does not.

    trainer budget  ``trainer.memory_budget_gb``, or (None) the memory available (the least of
                    MemAvailable and the cgroup's limit less its use) less the other workers'
                    estimates; compared with a CPU trainer's estimate for its fullest micro-batch
    the whole run   every worker's estimate together, compared with the memory available

A trainer over its budget is refused (``InputError``) with the largest
``trainer.micro_batch_tokens`` that fits and what ``gradient_checkpointing`` or a
``logprob_chunk_tokens`` of 512 would need; never shrunk silently (a smaller micro-batch trains the
same gradients over more micro-batches, checkpointing pays a second forward pass: the user
chooses). ``runtime.check_memory = false`` turns either refusal into a warning. Standard library
only (``tokenflow train --dry-run``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenflow.errors import InputError
from tokenflow.runtime.run.memory_estimate import (GB, PROMPT_TOKENS, Estimate, ModelShape, on_gpu,
                                                   available_bytes, estimate, micro_batch_fill, run_trainer_parts,
                                                   sequence_tokens)

SMALL_CHUNK = 512  # the logprob_chunk_tokens a fix proposes
ROUND = 128  # a proposed micro_batch_tokens is a multiple of this (when at least twice it)


@dataclass
class Budget:
    """The trainer's budget in bytes (None: unknown), where it comes from, and whether the user
    set it (``trainer.memory_budget_gb``) or it was derived from the memory available."""

    bytes: float | None
    source: str
    explicit: bool


def trainer_budget(cfg, est: Estimate, have: float | None, source: str) -> Budget:
    """``trainer.memory_budget_gb``, or what is available (``have``, from ``source``) less the
    estimates of every worker but the first trainer."""
    if cfg.trainer.memory_budget_gb is not None:
        return Budget(cfg.trainer.memory_budget_gb * GB, f"trainer.memory_budget_gb = {cfg.trainer.memory_budget_gb:g}",
                      True)
    if have is None:
        return Budget(None, "the memory available is unknown", False)
    others = [w for w in est.parts if w != "trainer"]
    if not others:
        return Budget(have, f"{source}: {have / GB:.2f} GB", False)
    rest = sum(est.worker(w) for w in others)
    return Budget(have - rest, f"{source}: {have / GB:.2f} GB, less {rest / GB:.2f} GB for the "
                  f"{'other workers' if len(others) > 1 else others[0]}", False)


def _need(cfg, m: ModelShape, seq: int, micro_batch_tokens: int | None = None, **switches) -> float:
    return sum(run_trainer_parts(cfg, m, micro_batch_fill(cfg, seq, micro_batch_tokens), **switches).values())


def largest_micro_batch(cfg, m: ModelShape, seq: int, budget: float, **switches) -> int | None:
    """The largest ``trainer.micro_batch_tokens`` (up to the config's) whose trainer estimate fits
    in ``budget`` bytes, rounded down to a multiple of 128; None when even one sequence of ``seq``
    tokens does not fit. ``switches``: ``checkpointing``, ``chunk`` (``trainer_parts``)."""
    if _need(cfg, m, seq, 1, **switches) > budget:
        return None
    lo, hi = 1, cfg.trainer.micro_batch_tokens
    while lo < hi:  # the estimate grows with the micro-batch
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if _need(cfg, m, seq, mid, **switches) <= budget else (lo, mid - 1)
    return lo // ROUND * ROUND if lo >= 2 * ROUND and lo < cfg.trainer.micro_batch_tokens else lo


def _switches(cfg, tokens: int) -> list[tuple[str, dict]]:
    """The memory switches that are off (or large) in ``cfg`` and would lower the estimate."""
    t, out = cfg.trainer, []
    if not t.gradient_checkpointing:
        out.append(("trainer.gradient_checkpointing = true", {"checkpointing": True}))
    if t.world_size == 1 and t.logprob_chunk_tokens > SMALL_CHUNK and tokens > SMALL_CHUNK:
        out.append((f"trainer.logprob_chunk_tokens = {SMALL_CHUNK}", {"chunk": SMALL_CHUNK}))
    if len(out) == 2:
        out.append((f"{out[0][0]} and {out[1][0]}", {**out[0][1], **out[1][1]}))
    return out


def trainer_fixes(cfg, m: ModelShape, seq: int, budget: float) -> list[str]:
    """The settings that bring the trainer's estimate within ``budget`` bytes, each with its
    estimate: the largest micro-batch, each switch that fits by itself (else both switches with
    the largest micro-batch under them); none when not even one sequence fits."""
    t = cfg.trainer
    out = []
    n = largest_micro_batch(cfg, m, seq, budget)
    if n is not None and n < t.micro_batch_tokens:
        out.append(f"trainer.micro_batch_tokens = {n} (about {_need(cfg, m, seq, n) / GB:.2f} GB)")
    switches = _switches(cfg, micro_batch_fill(cfg, seq))
    singles = switches[:2] if len(switches) == 3 else switches
    fitting = [(name, kw) for name, kw in singles if _need(cfg, m, seq, **kw) <= budget]
    for name, kw in fitting:
        out.append(f"{name} (about {_need(cfg, m, seq, **kw) / GB:.2f} GB)")
    if not fitting and switches:  # neither alone: both, with a smaller micro-batch if need be
        name, kw = switches[-1]
        n = largest_micro_batch(cfg, m, seq, budget, **kw)
        if n == t.micro_batch_tokens:
            out.append(f"{name} (about {_need(cfg, m, seq, **kw) / GB:.2f} GB)")
        elif n is not None:
            out.append(f"{name} with trainer.micro_batch_tokens = {n} (about {_need(cfg, m, seq, n, **kw) / GB:.2f} GB)")
    return out


def trainer_fix(cfg, m: ModelShape, seq: int, budget: Budget) -> str:
    """What brings a trainer over its budget within it, in words with the estimates."""
    last = "raise trainer.memory_budget_gb" if budget.explicit else "free some memory"
    fixes = trainer_fixes(cfg, m, seq, budget.bytes)
    if fixes:
        return f"to fit, set {', or '.join(fixes)}, or {last}"
    least = min(_need(cfg, m, seq, 1, checkpointing=True, chunk=SMALL_CHUNK), _need(cfg, m, seq, 1))
    return (f"no micro-batch fits: one sequence of {seq} tokens needs about {least / GB:.2f} GB even with "
            f"gradient checkpointing; train LoRA adapters (trainer.lora_rank) or use a smaller model, or {last}")


def trainer_refusal(cfg, m: ModelShape, seq: int, est: Estimate, budget: Budget) -> str | None:
    """The line that refuses a CPU trainer over its budget, or None when it fits (or the budget is
    unknown, or the trainer is on a GPU)."""
    if budget.bytes is None or on_gpu(cfg.trainer.device) or est.worker("trainer") <= budget.bytes:
        return None
    parts = ", ".join(f"{k} {v / GB:.2f}" for k, v in est.parts["trainer"].items() if v)
    return (f"the trainer needs about {est.worker('trainer') / GB:.2f} GB with trainer.micro_batch_tokens = "
            f"{cfg.trainer.micro_batch_tokens} ({parts}) but its budget is {max(budget.bytes, 0) / GB:.2f} GB "
            f"({budget.source}); {trainer_fix(cfg, m, seq, budget)}")


def _room(budget: Budget, est: Estimate) -> bool:
    """Whether the trainer's budget is worth checking: set by the user, or derived and larger than
    an idle process (else the other workers take all the memory: the whole run's check speaks)."""
    return budget.bytes is None or budget.explicit or budget.bytes > est.parts["trainer"]["base"]


def _run_fix(est: Estimate, cfg) -> str:
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
    """Refuse (``InputError``) a run whose trainer exceeds its budget, or whose workers together
    exceed the memory available, unless ``runtime.check_memory`` is off (then a warning)."""
    m = ModelShape.read(model)
    est = estimate(cfg, model, prompt_tokens)
    have, source = available_bytes()
    budget = trainer_budget(cfg, est, have, source)
    if log is not None:
        log.info("memory estimate: %s; %.2f GB in all, %s available (%s); trainer budget %s (%s)",
                 "; ".join(est.lines()), est.total() / GB, f"{have / GB:.2f} GB" if have is not None else "unknown",
                 source, f"{budget.bytes / GB:.2f} GB" if budget.bytes is not None else "unknown", budget.source)
        if budget.explicit and on_gpu(cfg.trainer.device):
            log.warning("trainer.memory_budget_gb is not checked for a trainer on a GPU")
    msg = trainer_refusal(cfg, m, sequence_tokens(cfg, m, prompt_tokens), est, budget) if _room(budget, est) else None
    if msg is None and have is not None and est.total() > have:
        msg = (f"the run needs about {est.total() / GB:.1f} GB of memory ({'; '.join(est.lines())}) but "
               f"{have / GB:.1f} GB is available ({source}); {_run_fix(est, cfg)}")
    if msg is None:
        return est
    if getattr(cfg.runtime, "check_memory", True):
        raise InputError(f"{msg}, or set runtime.check_memory = false to start anyway")
    if log is not None:
        log.warning("%s (runtime.check_memory = false: starting anyway)", msg)
    return est


def dry_run_lines(cfg, model: str | Path) -> list[str]:
    """The estimate and the trainer's budget as TOML comments, for ``tokenflow train --dry-run``."""
    m = ModelShape.read(model)
    est = estimate(cfg, model)
    have, source = available_bytes()
    budget = trainer_budget(cfg, est, have, source)
    refusal = None
    out = ["# memory estimate (peak resident, host): " + f"{est.total() / GB:.2f} GB in all"]
    out += [f"#   {line}" for line in est.lines()]
    out.append(f"#   available: {have / GB:.2f} GB ({source})" if have is not None else "#   available: unknown")
    if on_gpu(cfg.trainer.device):
        out.append("#   trainer budget: not checked (the trainer is on a GPU)")
    elif budget.bytes is None:
        out.append(f"#   trainer budget: unknown ({budget.source})")
    elif not _room(budget, est):
        out.append(f"#   trainer budget: none left ({budget.source})")
    else:
        seq = sequence_tokens(cfg, m)
        refusal = trainer_refusal(cfg, m, seq, est, budget)
        out.append(f"#   trainer budget: {max(budget.bytes, 0) / GB:.2f} GB ({budget.source}); the trainer's "
                   f"{est.worker('trainer') / GB:.2f} GB with trainer.micro_batch_tokens = "
                   f"{cfg.trainer.micro_batch_tokens} {'fits' if refusal is None else 'does not fit'}")
        if refusal is not None:
            out.append(f"#   trainer: {trainer_fix(cfg, m, seq, budget)}")
    if refusal is None and have is not None and est.total() > have:
        out.append(f"#   does not fit: {_run_fix(est, cfg)}")
    return out
