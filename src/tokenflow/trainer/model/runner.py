"""Running the policy (or the reference) on a packed micro-batch.

Parameters stay in float32 (the optimizer's master weights); ``trainer.dtype = "bfloat16"`` runs
the forward under autocast. The logits are computed at the target positions only, and, where the
model allows it, the output head runs on a gathered set of rows (``supports_rows``), in chunks
for the log-probs (``chunked_token_logprobs``).
"""

from __future__ import annotations

import inspect
from contextlib import nullcontext

import torch

from tokenflow.trainer.batch import MicroBatch
from tokenflow.trainer.shared_prompts import attn_implementation, model_mask, sharing_blocker


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
        self.sharing_blocker = sharing_blocker(model)
        """Why this model cannot run rows with shared prompts (`shared_prompts`), or None."""

    def attention_mask(self, mb: MicroBatch) -> torch.Tensor | None:
        """The micro-batch's own mask (shared prompts) as the model's attention takes it, or None:
        transformers then builds it from the position ids."""
        if mb.attention_mask is None:
            return None
        if self.sharing_blocker:
            raise ValueError(f"this micro-batch shares prompts, which this model cannot run: {self.sharing_blocker}")
        return model_mask(mb.attention_mask, attn_implementation(self.model))

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
                                 attention_mask=self.attention_mask(mb), use_cache=False, **kwargs)
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
                                       attention_mask=self.attention_mask(mb), use_cache=False)
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
