"""One training client's model: forward, forward_backward, optim_step, state save and load.

The model is the trainer's (`tokenflow.trainer.model.loading.load_causal_lm`: float32, the
folder ``model.path`` names) with fresh LoRA adapters (`tokenflow.trainer.model.lora`) or, for
full fine-tuning, every parameter trainable. Gradients accumulate over ``forward_backward``
calls until ``optim_step`` applies AdamW with the caller's parameters and clears them, as the
SDK documents. Log-probs come from `tokenflow.trainer.logprobs.chunked_token_logprobs`, so no
micro-batch materialises more than ``logprob_chunk`` rows of full-vocabulary logits.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import torch

from tokenflow.tinker import losses
from tokenflow.tinker.errors import user_error
from tokenflow.tinker.wire import Datum

log = logging.getLogger(__name__)

LORA_ALPHA = 32
"""LoRA scale numerator (scale = alpha / rank), the value hosted Tinker documents."""
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


@dataclass
class Lora:
    rank: int
    seed: int | None = None
    train_unembed: bool = True
    train_mlp: bool = True
    train_attn: bool = True


class TrainingModel:
    """A model being trained by one client. Not thread-safe: the service calls it from one thread."""

    def __init__(self, folder: str, lora: Lora | None, *, micro_batch_tokens: int = 2048,
                 logprob_chunk: int = 512, recompute: bool = True, dtype: str = "float32") -> None:
        from tokenflow.trainer.model.loading import enable_checkpointing, load_causal_lm, use_fp32_lm_head

        self.folder, self.lora = folder, lora
        self.micro_batch_tokens, self.logprob_chunk = micro_batch_tokens, logprob_chunk
        model = load_causal_lm(folder, trust_remote_code=False, attn_implementation="sdpa",
                               device=torch.device("cpu"))
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.max_len = int(getattr(model.config, "max_position_embeddings", 0) or 0) or None
        # bfloat16: the products under autocast (master weights, gradients and Adam stay float32),
        # as tokenflow's trainer does; the output head and log-softmax stay float32.
        self.bf16 = dtype == "bfloat16"
        if self.bf16:
            use_fp32_lm_head(model)
        if recompute:  # activations of a 2,048-token micro-batch: ~2 GB instead of ~9 GB (SmolLM2)
            enable_checkpointing(model)
        if lora is not None:
            model = self._with_adapters(model, lora)
        self.model = model
        self.model.train()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer: torch.optim.AdamW | None = None
        self.steps = 0

    @staticmethod
    def _with_adapters(model, lora: Lora):
        from types import SimpleNamespace

        from tokenflow.trainer.model.lora import add_lora

        if lora.rank < 1 or lora.rank > 1024:
            raise user_error(f"lora_config.rank must be between 1 and 1024, got {lora.rank}")
        present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
        targets = [m for m in (ATTN if lora.train_attn else ()) + (MLP if lora.train_mlp else ()) if m in present]
        tied = bool(getattr(model.config, "tie_word_embeddings", False))
        if lora.train_unembed and not tied:
            targets.append("lm_head")
        if not targets:
            raise user_error("lora_config trains nothing: set train_attn, train_mlp or train_unembed")
        if lora.seed is not None:
            torch.manual_seed(lora.seed)
        # The trainer's own wrapping (tokenflow.trainer.model.lora), with the SDK's choices.
        return add_lora(model, SimpleNamespace(lora_rank=lora.rank, lora_alpha=LORA_ALPHA, lora_dropout=0.0,
                                               lora_target_modules=targets))

    # -- forward -------------------------------------------------------------------------------

    def check(self, data: list[Datum], loss_fn: str) -> None:
        """A user error naming the field for anything the model cannot take."""
        need = losses.required_inputs(loss_fn)
        for i, d in enumerate(data):
            missing = [k for k in need if k not in d.inputs]
            if missing:
                raise user_error(f"data[{i}].loss_fn_inputs lacks {missing} (loss_fn {loss_fn!r} takes {list(need)})")
            extra = sorted(set(d.inputs) - set(need))
            if extra:
                raise user_error(f"data[{i}].loss_fn_inputs has {extra}, which loss_fn {loss_fn!r} does not take")
            for name in need:
                if d.inputs[name].ndim != 1:
                    raise user_error(f"data[{i}].loss_fn_inputs[{name!r}] must be 1-D (one value per position)")
            for name, arr in (("model_input", d.tokens), ("loss_fn_inputs['target_tokens']", d.inputs["target_tokens"])):
                bad = (arr < 0) | (arr >= self.vocab_size)
                if bad.any():
                    raise user_error(f"data[{i}].{name} holds token id {int(arr[bad][0])}, outside the "
                                     f"model's vocabulary [0, {self.vocab_size})")
            if self.max_len and d.tokens.size > self.max_len:
                raise user_error(f"data[{i}] has {d.tokens.size} tokens; the model takes at most {self.max_len}")

    def run(self, data: list[Datum], loss_fn: str, config: dict, *, backward: bool
            ) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
        """Per datum ``{"logprobs", "elementwise_loss"}``, and the metrics (``loss:sum`` ...).
        With ``backward`` the gradient of the summed loss is added to the parameters' ``.grad``."""
        self.check(data, loss_fn)
        outputs: list[dict[str, np.ndarray] | None] = [None] * len(data)
        total, clipped, counted = 0.0, 0, 0
        for batch in self._micro_batches(data):
            with torch.set_grad_enabled(backward):
                logp = self._logprobs([data[i] for i in batch])
                loss_sum = logp.new_zeros(())
                for row, i in enumerate(batch):
                    d = data[i]
                    n = d.tokens.size
                    lp = logp[row, :n]
                    inputs = {k: torch.tensor(v, dtype=torch.float32)
                              for k, v in d.inputs.items() if k != "target_tokens"}
                    per, extra = losses.per_token(loss_fn, config, lp, inputs)
                    loss_sum = loss_sum + per.sum()
                    if "clipped" in extra:
                        clipped += int(extra["clipped"].sum())
                        counted += n
                    outputs[i] = {"logprobs": lp.detach().numpy().astype(np.float32),
                                  "elementwise_loss": per.detach().numpy().astype(np.float32)}
                if backward:
                    loss_sum.backward()
                total += float(loss_sum.detach())
        metrics = {"loss:sum": total}
        if counted:
            metrics["clip_fraction:mean"] = clipped / counted
        return outputs, metrics  # type: ignore[return-value]

    def _micro_batches(self, data: list[Datum]) -> list[list[int]]:
        """Datums by length, packed while rows × longest ≤ micro_batch_tokens (a longer datum alone)."""
        order = sorted(range(len(data)), key=lambda i: data[i].tokens.size)
        batches, cur, widest = [], [], 0
        for i in order:
            n = data[i].tokens.size
            if cur and max(widest, n) * (len(cur) + 1) > self.micro_batch_tokens:
                batches.append(cur)
                cur, widest = [], 0
            cur.append(i)
            widest = max(widest, n)
        if cur:
            batches.append(cur)
        return batches

    def _logprobs(self, batch: list[Datum]) -> torch.Tensor:
        """[rows, widest] log p(target_tokens) (zeros past each row's end)."""
        from tokenflow.trainer.logprobs import chunked_token_logprobs

        width = max(d.tokens.size for d in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        targets = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for r, d in enumerate(batch):
            n = d.tokens.size
            ids[r, :n] = torch.from_numpy(d.tokens)
            targets[r, :n] = torch.from_numpy(d.inputs["target_tokens"].astype(np.int64))
            mask[r, :n] = 1
        base = self.base_model
        decoder = base.get_decoder() if hasattr(base, "get_decoder") else base.model
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            hidden = decoder(input_ids=ids, attention_mask=mask).last_hidden_state
            keep = mask.reshape(-1).bool()
            flat = hidden.reshape(-1, hidden.shape[-1])[keep]
            head = base.get_output_embeddings()  # float32 under autocast too (use_fp32_lm_head)
            lp, _ = chunked_token_logprobs(flat, head, targets.reshape(-1)[keep], torch.ones(int(keep.sum())),
                                           chunk=self.logprob_chunk, with_entropy=False)
        out = lp.new_zeros(len(batch) * width)
        out = out.index_put((keep.nonzero().squeeze(-1),), lp)
        return out.reshape(len(batch), width)

    @property
    def base_model(self):
        return self.model.get_base_model() if self.lora is not None else self.model

    # -- optimizer -----------------------------------------------------------------------------

    def optim_step(self, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
                   grad_clip_norm: float) -> dict[str, float]:
        for name, v in (("learning_rate", lr), ("eps", eps), ("weight_decay", weight_decay), ("grad_clip_norm", grad_clip_norm)):
            if not math.isfinite(v) or v < 0:
                raise user_error(f"adam_params.{name} must be a finite number ≥ 0, got {v}")
        for name, v in (("beta1", beta1), ("beta2", beta2)):
            if not 0 <= v < 1:
                raise user_error(f"adam_params.{name} must be in [0, 1), got {v}")
        if self.optimizer is None:
            self.optimizer = torch.optim.AdamW(self.params, lr=lr, betas=(beta1, beta2), eps=eps,
                                               weight_decay=weight_decay, foreach=True)
        for group in self.optimizer.param_groups:
            group.update(lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay)
        grads = [p.grad for p in self.params if p.grad is not None]
        norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))) if grads else 0.0
        if grad_clip_norm > 0 and grads:
            torch.nn.utils.clip_grad_norm_(self.params, grad_clip_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        return {"grad_norm:mean": norm, "learning_rate:mean": lr}

    # -- weights -------------------------------------------------------------------------------

    def sampler_weights(self) -> dict[str, torch.Tensor]:
        """The weights an engine loads, under Hugging Face names (LoRA merged in), copied."""
        from tokenflow.trainer.model.lora import merged_weights

        if self.lora is not None:
            return {k: v.detach().clone() for k, v in merged_weights(self.model)}
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def sampler_snapshot(self) -> tuple[dict | None, dict | None, float]:
        """(full weights, adapters, scale) for a sampler snapshot: adapters alone under LoRA."""
        if self.lora is not None:
            return None, self.trainable_state(), LORA_ALPHA / self.lora.rank
        return self.sampler_weights(), None, 1.0

    def trainable_state(self) -> dict[str, torch.Tensor]:
        from tokenflow.trainer.model.lora import adapter_state

        if self.lora is not None:
            return adapter_state(self.model)
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        from tokenflow.trainer.model.lora import load_adapter_state

        if self.lora is not None:
            load_adapter_state(self.model, state)
        else:
            self.model.load_state_dict(state)

    def state(self, with_optimizer: bool) -> dict:
        out = {"weights": self.trainable_state(), "steps": self.steps}
        if with_optimizer and self.optimizer is not None:
            out["optimizer"] = self.optimizer.state_dict()
        return out

    def load_state(self, state: dict, with_optimizer: bool) -> None:
        self.load_trainable_state(state["weights"])
        self.steps = int(state.get("steps", 0))
        for p in self.params:
            p.grad = None
        self.optimizer = None
        if with_optimizer and "optimizer" in state:
            groups = state["optimizer"]["param_groups"][0]
            self.optimizer = torch.optim.AdamW(self.params, lr=groups["lr"], betas=tuple(groups["betas"]),
                                               eps=groups["eps"], weight_decay=groups["weight_decay"], foreach=True)
            self.optimizer.load_state_dict(state["optimizer"])
