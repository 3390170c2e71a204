"""Loading the causal LM and running it on a packed micro-batch.

The policy is any transformers ``AutoModelForCausalLM``. Its parameters stay in float32 (the
optimizer's master weights); ``dtype = "bfloat16"`` runs the forward under autocast. With
``fp32_lm_head`` the output projection runs outside autocast in float32, because the log-probs
that importance ratios are built from are most sensitive to precision there. A CPU trainer
keeps the memory its steps free (`keep_freed_memory`).
"""

from __future__ import annotations

import ctypes
import inspect
import logging
import sys
import types
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F

from tokenflow.trainer.batch import MicroBatch

log = logging.getLogger(__name__)


def load_causal_lm(model, *, trust_remote_code: bool, attn_implementation: str, device: torch.device):
    """A path or hub-style name is loaded with transformers; a ready model is used (and trained)
    in place. Either way the parameters end up float32 on ``device``."""
    if isinstance(model, (str, Path)):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(
            str(model), dtype=torch.float32, attn_implementation=attn_implementation,
            trust_remote_code=trust_remote_code)
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "get_output_embeddings"):
        raise TypeError(f"expected a transformers causal LM or a path to one, got {type(model).__name__}")
    return model.to(device=device, dtype=torch.float32)


def _fp32_linear_forward(self, x: torch.Tensor) -> torch.Tensor:
    with torch.autocast(device_type=x.device.type, enabled=False):
        return F.linear(x.float(), self.weight.float(), None if self.bias is None else self.bias.float())


def use_fp32_lm_head(model) -> None:
    """Make the output projection compute in float32 under autocast. Only the instance's forward
    changes, so parameter names (and checkpoints) are untouched."""
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise TypeError(f"trainer.fp32_lm_head needs an nn.Linear output layer, got {type(head).__name__}")
    if getattr(model.config, "final_logit_softcapping", None):
        log.warning("fp32_lm_head: the model soft-caps its logits after the head; that part still "
                    "runs in the autocast dtype")
    head.forward = types.MethodType(_fp32_linear_forward, head)


def enable_checkpointing(model) -> None:
    """Recompute each decoder layer in the backward pass (non-reentrant checkpoint)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # the name from transformers 5.x on
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


class CausalLMRunner:
    """Runs one model on micro-batches and returns the logits at the target positions only
    (``logits_to_keep``), plus, on request, the final hidden states there (the value head's
    input, captured as the input of the output projection)."""

    def __init__(self, model, device: torch.device, dtype: str) -> None:
        self.model = model
        self.device = device
        self.autocast_dtype = torch.bfloat16 if dtype == "bfloat16" else None
        self.takes_logits_to_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        # Rows path: run the decoder, gather the target positions, apply the output head there.
        # Exact for models whose logits are just head(final hidden state).
        cfg = model.config
        scaled = any(getattr(cfg, k, None) for k in _LOGIT_POSTPROCESSING)
        self.supports_rows = hasattr(model, "get_decoder") and model.get_decoder() is not model and not scaled

    def autocast(self):
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def __call__(self, mb: MicroBatch, want_hidden: bool = False):
        if self.supports_rows:
            return self._rows(mb, want_hidden)
        if mb.num_rows != 1:
            raise ValueError("this model runs one packed row per micro-batch; build micro-batches with max_rows=1")
        captured: list[torch.Tensor] = []
        hook = None
        if want_hidden:
            hook = self.model.get_output_embeddings().register_forward_hook(
                lambda _m, args, _out: captured.append(args[0]))
        kwargs = {"logits_to_keep": mb.target_pos} if self.takes_logits_to_keep else {}
        try:
            with self.autocast():
                out = self.model(input_ids=mb.input_ids, position_ids=mb.position_ids,
                                 attention_mask=None, use_cache=False, **kwargs)
        finally:
            if hook is not None:
                hook.remove()
        logits = out.logits[0]
        hidden = captured[0][0] if captured else None
        if not self.takes_logits_to_keep:
            logits = logits[mb.target_pos]
            hidden = hidden[mb.target_pos] if hidden is not None else None
        return logits, hidden


    def _rows(self, mb: MicroBatch, want_hidden: bool):
        with self.autocast():
            hidden = self._target_hidden(mb)
            logits = self.model.get_output_embeddings()(hidden)
        return logits, (hidden if want_hidden else None)

    def _target_hidden(self, mb: MicroBatch) -> torch.Tensor:
        out = self.model.get_decoder()(input_ids=mb.input_ids, position_ids=mb.position_ids,
                                       attention_mask=None, use_cache=False)
        return out.last_hidden_state.reshape(-1, out.last_hidden_state.shape[-1])[mb.target_pos]

    # Chunked log-probs need the output head applied outside the model's forward (the rows path).
    chunkable = property(lambda self: self.supports_rows)

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    def logprobs(self, mb: MicroBatch, support, *, chunk: int, with_entropy: bool = True,
                 entropy_grad: bool = False, want_hidden: bool = False):
        """(log-probs [n], entropies [n] or None, hidden [n, H] or None) at the micro-batch's
        targets, as ``token_logprobs`` defines them; the output head runs ``chunk`` target rows
        at a time where the model allows it (``chunked_token_logprobs``)."""
        from tokenflow.trainer.logprobs import chunked_token_logprobs, token_logprobs

        if not self.chunkable:
            logits, hidden = self(mb, want_hidden)
            logp, ent = token_logprobs(logits, mb.targets, mb.temperature, support, with_entropy, entropy_grad)
            return logp, ent, hidden
        head = self.model.get_output_embeddings()

        def project(h):
            with self.autocast():
                return head(h)

        with self.autocast():
            hidden = self._target_hidden(mb)
        logp, ent = chunked_token_logprobs(hidden, project, mb.targets, mb.temperature, support, chunk=chunk,
                                           with_entropy=with_entropy, entropy_grad=entropy_grad)
        return logp, ent, (hidden if want_hidden else None)


# Config attributes of models that scale or cap logits after the output head.
_LOGIT_POSTPROCESSING = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def frozen_copy(model):
    """A frozen, eval-mode deep copy (the KL reference when none is named)."""
    import copy

    ref = copy.deepcopy(model)
    ref.eval()
    ref.requires_grad_(False)
    return ref


# Config keys whose positive value makes a train-mode forward random (dropout of any kind, and
# Mixtral-style router jitter); transformers spells them attention_dropout, hidden_dropout,
# resid_pdrop, embd_pdrop, attn_pdrop, activation_dropout, router_jitter_noise, ...
_NOISE_SUFFIXES = ("dropout", "pdrop", "jitter_noise")


def stochastic_parts(model) -> list[str]:
    """What makes ``model``'s train-mode forward random: positive dropout / jitter values in its
    config (nested configs included) and dropout modules with p > 0 (LoRA dropout, a value
    head's). Empty for a deterministic forward. Conservative: a key that a model never reads
    only costs the trainer an extra no-grad pass."""
    found: list[str] = []

    def scan(cfg: dict, prefix: str) -> None:
        for key, value in cfg.items():
            if isinstance(value, dict):
                scan(value, f"{prefix}{key}.")
            elif (str(key).endswith(_NOISE_SUFFIXES) and isinstance(value, (int, float))
                  and not isinstance(value, bool) and value > 0):
                found.append(f"config.{prefix}{key} = {value}")

    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "to_dict"):
        scan(config.to_dict(), "")
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p > 0:
            found.append(f"{name or 'model'} (dropout p = {module.p})")
    return found


# ---- host memory -------------------------------------------------------------------------------
# mallopt(3) parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4


def keep_freed_memory() -> bool:
    """Keep the memory a training step frees for the next step (``trainer.keep_host_memory``):
    glibc's trimming and its mmap for large blocks off in this process. True when done; False
    where the C library is not glibc (macOS, musl) and nothing changed.

    A step allocates and frees the same few GB of activations every time. glibc gives large
    freed blocks back to the kernel (``munmap``, trimming the top of the heap), so the next step
    touches fresh pages and pays a page fault per 4 KB; where faults are dear (a virtual machine:
    6-35 µs each here) that is seconds per step. SmolLM2-135M, 4,096 tokens under bfloat16
    autocast, one thread: the forward took 13-19 s while the heap grew (2M faults) and 4 s after
    (none). With both off, the heap grows to a step's peak once and is reused; the process keeps
    that peak resident (it reaches it every step anyway)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        # The process's own symbols, libc's among them (find_library would run ldconfig).
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # -1 disables trimming altogether; 0 disables mmap for large requests (mallopt(3)).
    done = mallopt(_M_TRIM_THRESHOLD, -1) == 1 and mallopt(_M_MMAP_MAX, 0) == 1
    if done:
        log.debug("host memory: trimming and mmap off (freed memory kept for the next step)")
    return done
