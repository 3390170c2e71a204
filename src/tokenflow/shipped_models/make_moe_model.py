"""Build the shipped tiny mixture-of-experts policy by upcycling the default model.

    python -m tokenflow.shipped_models.make_moe_model --out src/tokenflow/assets/default_moe_model

Sparse upcycling: the default model (a tiny Llama warm-started on the arithmetic task, see
`make_default_model`) becomes a Mixtral — the same attention, and in every layer ``--experts``
copies of its feed-forward block behind a freshly drawn router choosing the top ``--top-k``.
Mixtral renormalises the k gate weights to sum to 1, so identical copies would compute exactly
the dense model; each copy is perturbed by ``--expert-noise`` (relative) so the experts differ
and the routing matters from the first step, and ``--sft-steps`` of the default model's
supervised warm start (noisy worked solutions) let router and experts settle together. The
result starts near the default model's held-out accuracy and leaves RL the same headroom.

Weights are stored in bfloat16 to keep the asset small; trainer and engine load them into their
own precision (float32 on the CPU).
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import numpy as np

log = logging.getLogger("tokenflow.shipped_models.make_moe_model")


def upcycle(dense, experts: int, top_k: int, expert_noise: float, router_std: float, seed: int):
    """A Mixtral with ``dense``'s weights: attention, norms and embeddings as they are, each
    layer's MLP copied into ``experts`` perturbed experts, routers drawn from N(0, router_std)."""
    import torch
    from transformers import AutoModelForCausalLM, MixtralConfig

    c = dense.config
    cfg = MixtralConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, head_dim=c.hidden_size // c.num_attention_heads,
        max_position_embeddings=c.max_position_embeddings, rms_norm_eps=c.rms_norm_eps,
        rope_parameters=dict(c.rope_parameters), tie_word_embeddings=c.tie_word_embeddings,
        bos_token_id=c.bos_token_id, eos_token_id=c.eos_token_id, pad_token_id=c.pad_token_id,
        num_local_experts=experts, num_experts_per_tok=top_k, sliding_window=None,
        router_aux_loss_coef=0.0, architectures=["MixtralForCausalLM"],
    )
    moe = AutoModelForCausalLM.from_config(cfg)
    gen = torch.Generator().manual_seed(seed)
    src = dense.state_dict()
    with torch.no_grad():
        for name, p in moe.state_dict().items():
            if name in src:
                p.copy_(src[name])
                continue
            layer = name.split(".mlp.")[0]
            if name.endswith("mlp.gate.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * router_std)
                continue
            if name.endswith("experts.gate_up_proj"):
                base = torch.cat([src[f"{layer}.mlp.gate_proj.weight"], src[f"{layer}.mlp.up_proj.weight"]])
            elif name.endswith("experts.down_proj"):
                base = src[f"{layer}.mlp.down_proj.weight"]
            else:
                raise KeyError(f"upcycling does not know where {name} comes from")
            noise = 1 + expert_noise * torch.randn((experts, *base.shape), generator=gen)
            p.copy_(base.unsqueeze(0) * noise)
    return moe


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("src/tokenflow/assets/default_moe_model"))
    ap.add_argument("--dense", type=Path, default=None, help="dense model to upcycle (default: the shipped one)")
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--expert-noise", type=float, default=0.05)
    ap.add_argument("--router-std", type=float, default=0.1)
    ap.add_argument("--sft-steps", type=int, default=0)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--slip", type=float, default=0.6, help="probability of forgetting a carry (as the default)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=4321)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tokenflow.evaluation import greedy_accuracy
    from tokenflow.model_store import shipped_model_path
    from tokenflow.tasks.arithmetic import ArithmeticTask
    from tokenflow.shipped_models.make_default_model import save_warm_started, sft_batch

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    dense_dir = args.dense or shipped_model_path("default")
    dense = AutoModelForCausalLM.from_pretrained(dense_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(dense_dir)
    moe = upcycle(dense, args.experts, args.top_k, args.expert_noise, args.router_std, args.seed)
    n_params = sum(p.numel() for p in moe.parameters())
    log.info("upcycled %s into a %d-expert top-%d Mixtral: %.2fM parameters", dense_dir, args.experts,
             args.top_k, n_params / 1e6)
    eval_task, sft_task = ArithmeticTask(seed=0), ArithmeticTask(seed=args.seed)
    history = [{"step": 0, "eval_accuracy": greedy_accuracy(moe, tokenizer, eval_task)}]
    log.info("upcycled held-out greedy accuracy %.3f", history[0]["eval_accuracy"])
    t0 = time.time()
    if args.sft_steps:
        opt = torch.optim.AdamW(moe.parameters(), lr=args.lr, weight_decay=0.0)
        moe.train()
        for step in range(1, args.sft_steps + 1):
            ids, lab = sft_batch(sft_task, tokenizer, rng, args.batch, args.slip)
            loss = moe(input_ids=ids, labels=lab, use_cache=False).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(moe.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if step % 50 == 0:
                log.info("sft step %d loss %.4f (%.0fs)", step, loss.item(), time.time() - t0)
        moe.eval()
        history.append({"step": args.sft_steps, "eval_accuracy": greedy_accuracy(moe, tokenizer, eval_task)})
        log.info("after %d SFT steps: held-out greedy accuracy %.3f", args.sft_steps, history[-1]["eval_accuracy"])
    save_warm_started(moe.to(torch.bfloat16), tokenizer, args.out, history, t0, {
        "task": "arithmetic", "upcycled_from": "default_model" if args.dense is None else str(args.dense),
        "family": "mixtral", "experts": args.experts, "top_k": args.top_k, "expert_noise": args.expert_noise,
        "router_std": args.router_std, "sft_steps": args.sft_steps, "lr": args.lr, "seed": args.seed,
        "parameters": n_params})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
