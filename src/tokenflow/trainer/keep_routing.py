"""Keep Routing (rollout routing replay): the trainer routes each token to the experts the
engine used for it.

Engine and trainer compute near-identical router scores (different kernels, bfloat16 against
float32), and a near-tie broken the other way sends a token to other experts: the trainer then
scores a different network than the one that sampled, and the importance ratio π/μ carries
that error. The engine records each token's top-k expert ids (`Rollout.routed_experts`); with
``trainer.keep_routing = true`` every router of the policy keeps its own live gate scores
g = softmax(router(h)) but takes its top-k *set* from the record:

    weights = g.gather(-1, recorded)      (renormalised over the k where the family does)

so the forward is the engine's network, and the router still gets a gradient through g — the
gathered probabilities, never a post-top-k zeroed copy. Tokens without a record (padding,
rollouts from an engine that does not record) keep the trainer's own routing.

Prompt tokens are replayed too. The engine computes their routing in its prefill anyway; they
are most of a sequence's tokens, and every completion token attends to their keys and values,
so routing them differently would bring the mismatch back through attention. A prompt shared by
n samples is prefilled once, so the n rollouts carry identical prompt rows.

Whether or not it replays, the hook measures the router disagreement: the share of
(token, sparse layer) pairs whose top-k set in the trainer differs from the engine's
(``routing/disagreement``). Under staleness it also counts routing that moved with the weights.

The hooks sit on transformers' router modules (``mlp.gate`` of a sparse block: Qwen2/3-MoE,
Mixtral and the others of that layout), whose forward returns (logits, top-k weights, top-k ids).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


# transformers routers that score by softmax → top-k → optional renormalisation (the replay's
# arithmetic); other families (sigmoid scoring, grouped top-k, bias-corrected selection) are refused.
SOFTMAX_TOPK_ROUTERS = ("Qwen2MoeTopKRouter", "Qwen3MoeTopKRouter", "MixtralTopKRouter", "OlmoeTopKRouter")


def find_routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The router of every sparse layer, in layer order (the engine records in that order)."""
    return [m.gate for m in model.modules()
            if hasattr(m, "experts") and hasattr(getattr(m, "gate", None), "top_k")]


class RoutingReplay:
    """Forward hooks on a model's routers; `replaying` a micro-batch feeds them its record."""

    def __init__(self, model: torch.nn.Module, replay: bool) -> None:
        self.routers = find_routers(model)
        self.replay = replay
        other = sorted({type(r).__name__ for r in self.routers} - set(SOFTMAX_TOPK_ROUTERS))
        if replay and other:
            raise ValueError(f"trainer.keep_routing cannot replay {', '.join(other)}: it supports the softmax "
                             f"top-k routers of {', '.join(SOFTMAX_TOPK_ROUTERS)}; set keep_routing = false")
        self.top_k = self.routers[0].top_k if self.routers else 0
        self._plan: tuple[torch.Tensor, torch.Tensor] | None = None
        self._counted: set[int] = set()
        self.differ: torch.Tensor | int = 0
        self.compared: torch.Tensor | int = 0
        self._handles = [r.register_forward_hook(self._hook_for(i)) for i, r in enumerate(self.routers)]

    def __bool__(self) -> bool:
        return bool(self.routers)

    def take_counts(self) -> tuple[torch.Tensor | int, torch.Tensor | int]:
        """(token-layer pairs whose top-k sets differ, pairs compared) since the last call; tensors
        stay on their device (no synchronisation per micro-batch)."""
        out = (self.differ, self.compared)
        self.differ = self.compared = 0
        return out

    @contextmanager
    def replaying(self, experts: torch.Tensor | None, has: torch.Tensor | None):
        """Route the forward (and any recompute in its backward) by ``experts``
        [rows × width, moe_layers, k] where ``has`` [rows × width] is set."""
        if experts is None or not self.routers:
            yield
            return
        if experts.shape[1:] != (len(self.routers), self.top_k):
            raise ValueError(f"recorded routing is [tokens, {experts.shape[1]}, {experts.shape[2]}] but the policy "
                             f"has {len(self.routers)} sparse layers with top-{self.top_k}: the rollouts come "
                             "from another model")
        self._plan, self._counted = (experts.long(), has), set()
        try:
            yield
        finally:
            self._plan = None

    @torch.no_grad()
    def score_other_way(self, mb, score):
        """``score()`` (a forward of micro-batch ``mb``) routed the other way: by the trainer's own
        routers if this replays, by the record if not. Counts nothing."""
        replay = self.replay
        self.replay = not replay
        try:
            with self.replaying(mb.routing, mb.routing_has):
                return score()
        finally:
            self.replay = replay
            self.take_counts()

    def _hook_for(self, layer: int):
        def hook(module, args, output):
            if self._plan is None:
                return None
            experts, has = self._plan
            logits, scores, own = output
            if logits.shape[0] != experts.shape[0]:
                raise ValueError(f"router saw {logits.shape[0]} tokens but the routing record has "
                                 f"{experts.shape[0]}")
            recorded = experts[:, layer]
            if layer not in self._counted:  # not again in an activation-checkpoint recompute
                self._counted.add(layer)
                with torch.no_grad():
                    same = (own.sort(-1).values == recorded.sort(-1).values).all(-1)
                    self.differ = self.differ + (has & ~same).sum()
                    self.compared = self.compared + has.sum()
            if not self.replay:
                return None
            gates = torch.softmax(logits, dim=-1, dtype=torch.promote_types(logits.dtype, torch.float32))
            weights = gates.gather(-1, recorded)
            if getattr(module, "norm_topk_prob", True):  # Mixtral's router always renormalises
                weights = weights / weights.sum(-1, keepdim=True)
            weights = torch.where(has[:, None], weights.to(scores.dtype), scores)
            return logits, weights, torch.where(has[:, None], recorded, own)

        return hook
