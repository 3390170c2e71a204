"""Build the shipped default model: a tiny Llama warm-started on the arithmetic task.

    python -m tokenflow.shipped_models.make_default_model --out src/tokenflow/assets/default_model

The model is a character-level Llama (a ``llama`` config on purpose: transformers maps ``qwen2``
configs to a byte-level tokenizer, which would silently break a character vocabulary). It is
trained by supervised learning on worked solutions in which each carry is *forgotten* with
probability ``--slip`` (0.6 by default). The warm-started model therefore writes fluent column
arithmetic but, greedily, tends to drop carries: held-out greedy accuracy lands around the share
of problems without a carry (20–60%), and sampling at temperature 1 still finds the carry often
enough for RL to have signal. That is the job the default `tokenflow train` run does: reinforce
the behaviour that earns reward. Training is seeded and takes a few minutes on two CPU cores.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np

from tokenflow.shipped_models.warm_start_args import warm_start_parser

log = logging.getLogger("tokenflow.shipped_models.make_default_model")

SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>"]


def build_tokenizer(out: Path):
    """Write a character-level tokenizer (tokenizer.json + tokenizer_config.json)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from tokenflow.tasks.arithmetic import VOCAB

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + list(VOCAB))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(SPECIAL_TOKENS)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
        "add_bos_token": False, "model_max_length": 256,
    }, indent=2))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(out))


def build_config(vocab_size: int, args):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=args.hidden, intermediate_size=args.hidden * 3,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.heads, max_position_embeddings=getattr(args, "max_positions", 256),
        bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )


def filler_length(rng: np.random.Generator, share: float, median: float, cap: int) -> int:
    """Spaces before the worked solution: none with probability 1 − ``share``, otherwise a
    lognormal length (this median, σ = 0.8) of at most ``cap``. Greedy decoding, which takes the
    likelier branch, writes none when ``share`` < 0.5; sampling writes a long tail of them."""
    if share <= 0 or rng.random() >= share:
        return 0
    return int(min(cap, max(1, round(rng.lognormal(np.log(median), 0.8)))))


def sft_batch(task, tokenizer, rng: np.random.Generator, batch: int, slip: float,
              filler: tuple[float, float, int] = (0.0, 1.0, 0)):
    """Token ids and labels (prompt positions masked) for one batch of noisy worked solutions,
    each after ``filler_length(rng, *filler)`` spaces."""
    import torch

    from tokenflow.tasks.arithmetic import worked_solution

    rows, labels = [], []
    for _ in range(batch):
        p = task.train_prompt(int(rng.integers(0, 2**62)))
        a, b = p.example["a"], p.example["b"]
        drop = rng.random(8) < slip
        prompt = [tokenizer.bos_token_id] + tokenizer.encode(p.text, add_special_tokens=False)
        text = " " * filler_length(rng, *filler) + worked_solution(a, b, drop)
        completion = tokenizer.encode(text, add_special_tokens=False)
        completion.append(tokenizer.eos_token_id)
        rows.append(prompt + completion)
        labels.append([-100] * len(prompt) + completion)
    width = max(map(len, rows))
    ids = torch.full((batch, width), tokenizer.pad_token_id)
    lab = torch.full((batch, width), -100)
    for i, (r, l) in enumerate(zip(rows, labels)):
        ids[i, : len(r)] = torch.tensor(r)
        lab[i, : len(l)] = torch.tensor(l)
    return ids, lab


# A student for on-policy distillation from the default model (docs/scorers.md): smaller (a
# quarter of the width, half the depth) and briefly warm-started, so it writes the format but
# not yet fluently. ``--preset`` sets these defaults; explicit flags still override them.
# A policy for generation-heavy benchmarks (benchmarks/trl): the bench engine model's width and
# depth, and completions whose lengths have a long tail, as in reasoning RL: 40% of sampled
# completions start with a run of spaces of lognormal length (median 40, up to 200) that carries
# no information, so a few samples of each step run far longer than the rest. Greedy decoding
# skips the run, so held-out accuracy is measured on the arithmetic as usual. Carries are
# forgotten less often than in the default model (slip 0.3): after 400 steps greedy accuracy is
# about 0.41 (0.19 with slip 0.6, when most groups of 8 samples were all wrong).
PRESETS = {
    "distill-student": {"hidden": 64, "layers": 2, "heads": 4, "steps": 150, "eval_every": 150},
    "long-tail": {"hidden": 256, "layers": 4, "heads": 8, "steps": 400, "eval_every": 400, "slip": 0.3,
                  "filler_share": 0.4, "filler_median": 40.0, "filler_cap": 200, "max_positions": 512},
}


def main(argv: list[str] | None = None) -> int:
    ap = warm_start_parser(__doc__, out="src/tokenflow/assets/default_model", steps=2000, threads=2,
                           eval_every=250, slip_help="probability of forgetting a carry")
    ap.add_argument("--preset", choices=sorted(PRESETS), default=None,
                    help="defaults for a distillation student or a long-tailed-length policy (see PRESETS)")
    ap.add_argument("--filler-share", type=float, default=0.0,
                    help="share of completions that start with a run of spaces (long-tailed lengths)")
    ap.add_argument("--filler-median", type=float, default=40.0, help="median length of that run")
    ap.add_argument("--filler-cap", type=int, default=200, help="longest run")
    ap.add_argument("--max-positions", type=int, default=256, help="the model's context length")
    pre = ap.parse_known_args(argv)[0].preset
    if pre:
        ap.set_defaults(**PRESETS[pre])
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")

    import torch
    from transformers import AutoModelForCausalLM

    from tokenflow.evaluation import greedy_accuracy
    from tokenflow.tasks.arithmetic import ArithmeticTask

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    tokenizer = build_tokenizer(args.out)
    model = AutoModelForCausalLM.from_config(build_config(len(tokenizer), args))
    n_params = sum(p.numel() for p in model.parameters())
    log.info("model: %.2fM parameters", n_params / 1e6)
    # The SFT stream uses its own seed; the RL task (seed 0) keeps its eval split held out.
    sft_task = ArithmeticTask(seed=args.seed)
    eval_task = ArithmeticTask(seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warmup = max(1, args.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + np.cos(np.pi * min(s, args.steps) / args.steps))
    )
    t0 = time.time()
    history = []
    for step in range(1, args.steps + 1):
        ids, lab = sft_batch(sft_task, tokenizer, rng, args.batch, args.slip,
                             (args.filler_share, args.filler_median, args.filler_cap))
        loss = model(input_ids=ids, labels=lab, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % 100 == 0:
            log.info("step %d loss %.4f (%.0fs)", step, loss.item(), time.time() - t0)
        if step % args.eval_every == 0 or step == args.steps:
            acc = greedy_accuracy(model, tokenizer, eval_task)
            history.append({"step": step, "loss": float(loss.item()), "eval_accuracy": acc})
            log.info("step %d held-out greedy accuracy %.3f", step, acc)
    model.config.architectures = ["LlamaForCausalLM"]
    save_warm_started(model, tokenizer, args.out, history, t0, {
        "task": "arithmetic", "preset": args.preset, "hidden": args.hidden, "layers": args.layers,
        "slip": args.slip, "seed": args.seed, "steps": args.steps, "batch": args.batch, "lr": args.lr,
        "filler_share": args.filler_share, "filler_median": args.filler_median, "filler_cap": args.filler_cap,
        "parameters": n_params})
    return 0


def save_warm_started(model, tokenizer, out, history: list[dict], t0: float, how: dict) -> None:
    """The model folder, plus ``warm_start.json``: how it was made and its held-out accuracy."""
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    meta = {**how, "eval_accuracy": history[-1]["eval_accuracy"], "history": history,
            "train_seconds": round(time.time() - t0, 1)}
    (out / "warm_start.json").write_text(json.dumps(meta, indent=2))
    log.info("wrote %s (held-out greedy accuracy %.3f)", out, meta["eval_accuracy"])


if __name__ == "__main__":
    raise SystemExit(main())
