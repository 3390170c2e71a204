"""Build the shipped tool model: a tiny Llama that calls a calculator in plain text.

    python -m tokenflow.shipped_models.make_tool_model --out src/tokenflow/assets/tool_model

The model is the default model's architecture (a character-level Llama, `make_default_model`)
with a vocabulary of printable ASCII, a newline and role tokens, and a short chat template that
renders tools and messages compactly and preserves prefixes::

    <bos><tools>add(a,b) mul(a,b)<eot><user>47*83+29<eot><assistant>mul(47,83)<eot><tool>3901<eot>...

It is warm-started by supervised learning on `CalculatorEnv` episodes (``tokenflow.envs.calculator``)
rendered into token ids by `ChatBridge` exactly as a rollout is: prompt ids, each assistant turn's
ids ending with the turn-end token ``<eot>`` (the only ids with a loss), environment ids. The
demonstrations call ``mul`` then, for ``a*b+c``, ``add`` and answer — except that with probability
``--slip`` (0.6) they answer the product at once, forgetting ``+c``. Greedily the model therefore
answers one-step questions (~40% of them) and forgets the addition on the others; sampling still
calls ``add`` often enough for RL to learn it. `warm_start.json` records the held-out success of
greedy episodes (played by the built-in engine through
`tokenflow.envs.episode.play_reference_episodes`) and the mean number of model turns.
"""

from __future__ import annotations

import asyncio
import json
import logging
import string
import time
from pathlib import Path

import numpy as np

from tokenflow.shipped_models.make_default_model import build_config, save_warm_started
from tokenflow.shipped_models.warm_start_args import warm_start_parser

log = logging.getLogger("tokenflow.shipped_models.make_tool_model")

# <eot> is id 2, where the default model's config puts EOS: the model's end of turn is its EOS.
SPECIAL_TOKENS = ["<pad>", "<bos>", "<eot>", "<unk>", "<system>", "<user>", "<assistant>", "<tool>", "<tools>"]
CHARS = [c for c in string.printable if c not in "\t\r\x0b\x0c"]  # printable ASCII and "\n"

# One line per statement, joined: no template whitespace reaches the output. Tools render as
# name(param,...), tool calls as the plain format's name(value,...) (tojson, as the parser reads).
CHAT_TEMPLATE = "".join([
    "{{- bos_token -}}",
    "{%- if tools -%}<tools>",
    "{%- for t in tools -%}{{ t.function.name }}({{ t.function.parameters.properties | list | join(',') }})",
    "{%- if not loop.last %} {% endif -%}{%- endfor -%}<eot>{%- endif -%}",
    "{%- for m in messages -%}",
    "{%- if m.role not in ['system', 'user', 'assistant', 'tool'] -%}",
    "{{- raise_exception('this template knows the roles system, user, assistant and tool, not ' + m.role) -}}",
    "{%- endif -%}",
    "{{- '<' + m.role + '>' -}}",
    "{%- if m.content is string -%}{{- m.content -}}{%- endif -%}",
    "{%- for tc in m.tool_calls or [] -%}",
    "{%- set f = tc.function if tc.function is defined else tc -%}",
    "{%- if m.content or not loop.first -%}{{- '\\n' -}}{%- endif -%}",
    "{{- f.name + '(' + (f.arguments.values() | map('tojson') | join(',')) + ')' -}}",
    "{%- endfor -%}",
    "{{- '<eot>' -}}",
    "{%- endfor -%}",
    "{%- if add_generation_prompt -%}<assistant>{%- endif -%}",
])


def build_tokenizer(out: Path):
    """Write a character-level tokenizer with role tokens and the chat template; return it loaded."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoTokenizer

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(SPECIAL_TOKENS)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<bos>", "eos_token": "<eot>", "pad_token": "<pad>", "unk_token": "<unk>",
        "add_bos_token": False, "model_max_length": 256, "chat_template": CHAT_TEMPLATE,
    }, indent=2))
    return AutoTokenizer.from_pretrained(str(out))


def demonstration(example: dict, rng: np.random.Generator, slip: float) -> list[str]:
    """The assistant turns of one demonstrated episode (the last is the answer)."""
    a, b, c = example["a"], example["b"], example["c"]
    turns = [f"mul({a},{b})"]
    if c is None or rng.random() < slip:  # a*b, or a*b+c with the addition forgotten
        return turns + [str(a * b)]
    return turns + [f"add({a * b},{c})", str(a * b + c)]


async def demonstration_row(env_cls, example: dict, texts: list[str], bridge) -> tuple[list[int], list[int]]:
    """Token ids of one demonstrated episode and its loss mask (1 on the assistant's ids), built
    as a rollout is: prompt ids, each turn's ids + turn end, the environment ids after it."""
    env = env_cls()
    messages, _ = env.reset(example)
    ids = bridge.prompt_ids(messages)
    mask = [0] * len(ids)
    end = bridge.turn_end_ids[0]
    for text in texts:
        turn = bridge.tokenizer.encode(text, add_special_tokens=False) + [end]
        ids += turn
        mask += [1] * len(turn)
        raw = {"role": "assistant", "content": text}
        message = env.parse(raw)
        result = await env.step(raw)
        if result.done:
            break
        env_ids = bridge.environment_ids(result.observations, assistant=message)
        ids += env_ids
        mask += [0] * len(env_ids)
    env.close()
    return ids, mask


def build_rows(n: int, seed: int, slip: float, bridge) -> list[tuple[list[int], list[int]]]:
    from tokenflow.envs.calculator import CalculatorEnv

    rng = np.random.default_rng(seed)

    async def rows():
        out = []
        for i in range(n):
            example = CalculatorEnv.train_example(i, seed)
            out.append(await demonstration_row(CalculatorEnv, example, demonstration(example, rng, slip), bridge))
        return out

    return asyncio.run(rows())


def batch_tensors(rows, pad_id: int):
    import torch

    width = max(len(r) for r, _ in rows)
    ids = torch.full((len(rows), width), pad_id)
    labels = torch.full((len(rows), width), -100)
    for i, (r, m) in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
        labels[i, :len(r)] = torch.tensor([t if keep else -100 for t, keep in zip(r, m)])
    return ids, labels


def play_episodes(model, tokenizer, examples: list[dict], temperature: float = 0.0, max_tokens: int = 24):
    """Play episodes with the built-in engine (greedily by default); returns the trajectories."""
    from tokenflow.engine import EngineConfig, SamplingParams
    from tokenflow.engine.builtin.llm_engine import Engine
    from tokenflow.envs.calculator import CalculatorEnv
    from tokenflow.envs.episode import play_reference_episodes

    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    engine = Engine.from_config(model.config, state, EngineConfig(device="cpu", dtype="float32", threads=1),
                                tokenizer=tokenizer)

    context = engine.max_model_len

    def generate(prompts, stop):
        params = [SamplingParams(temperature=temperature, max_tokens=min(max_tokens, context - len(p)),
                                 stop_token_ids=stop, seed=len(p) * 7919 + i) for i, p in enumerate(prompts)]
        return [list(group[0].completion_ids) for group in engine.generate(prompts, params)]

    try:
        return asyncio.run(play_reference_episodes(CalculatorEnv, examples, tokenizer, generate,
                                                   max_len=context - 1))
    finally:
        engine.close()


def measure(model, tokenizer, examples: list[dict], temperature: float = 0.0) -> dict:
    """Held-out success of episodes (greedy by default), mean model turns, and the same per
    question shape."""
    from tokenflow.envs.calculator import CalculatorEnv

    trajs = play_episodes(model, tokenizer, examples, temperature)
    scores = CalculatorEnv.rubric.score([t.episode for t in trajs])
    ok = np.array([s["correct"] for s in scores])
    turns = np.array([t.episode.turns for t in trajs])
    two = np.array([ex["c"] is not None for ex in examples])
    return {"eval_success": float(ok.mean()), "mean_model_turns": float(turns.mean()),
            "success_a_times_b": float(ok[~two].mean()), "success_a_times_b_plus_c": float(ok[two].mean()),
            "malformed_per_episode": float(np.mean([s["malformed"] for s in scores]))}


def main(argv: list[str] | None = None) -> int:
    ap = warm_start_parser(__doc__, out="src/tokenflow/assets/tool_model", steps=1200, threads=1, eval_every=400,
                           slip_help="probability of answering a*b+c without the addition")
    ap.add_argument("--episodes", type=int, default=10000, help="demonstrated episodes (SFT rows)")
    ap.add_argument("--num-eval", type=int, default=256)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")

    import torch
    from transformers import AutoModelForCausalLM

    from tokenflow.envs.bridge import ChatBridge
    from tokenflow.envs.calculator import CalculatorEnv

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    t0 = time.time()
    tokenizer = build_tokenizer(args.out)
    bridge = ChatBridge(tokenizer, CalculatorEnv.tools)
    if not bridge.preserves_prefixes():
        raise RuntimeError(f"the tool model's template must preserve prefixes: {bridge.prefix_check().reason}")
    # Demonstrations come from a stream seeded apart from the RL task's (task.seed 0), whose
    # held-out split is what is measured.
    rows = build_rows(args.episodes, args.seed, args.slip, bridge)
    log.info("%d demonstrated episodes (%.0f tokens each) in %.0fs", len(rows),
             np.mean([len(r) for r, _ in rows]), time.time() - t0)
    held_out = CalculatorEnv.eval_examples(0, args.num_eval)
    model = AutoModelForCausalLM.from_config(build_config(len(tokenizer), args))
    n_params = sum(p.numel() for p in model.parameters())
    log.info("model: %.3fM parameters", n_params / 1e6)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warmup = max(1, args.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + np.cos(np.pi * min(s, args.steps) / args.steps)))
    rng = np.random.default_rng(args.seed + 1)
    history = []
    for step in range(1, args.steps + 1):
        ids, labels = batch_tensors([rows[i] for i in rng.integers(0, len(rows), args.batch)], tokenizer.pad_token_id)
        loss = model(input_ids=ids, labels=labels, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % 100 == 0:
            log.info("step %d loss %.4f (%.0fs)", step, loss.item(), time.time() - t0)
        if step % args.eval_every == 0 or step == args.steps:
            model.eval()
            figures = measure(model, tokenizer, held_out)
            model.train()
            history.append({"step": step, "loss": float(loss.item()), "eval_accuracy": figures["eval_success"],
                            **figures})
            log.info("step %d held-out greedy success %.3f, %.2f model turns per episode", step,
                     figures["eval_success"], figures["mean_model_turns"])
    model.config.architectures = ["LlamaForCausalLM"]
    last = history[-1]
    # What RL starts from: one sample per held-out question at temperature 1.
    model.eval()
    sampled = measure(model, tokenizer, held_out, temperature=1.0)
    log.info("held-out success sampling at temperature 1: %.3f (a*b+c: %.3f)", sampled["eval_success"],
             sampled["success_a_times_b_plus_c"])
    save_warm_started(model, tokenizer, args.out, history, t0, {
        "task": "env", "env": "tokenflow.envs.calculator:CalculatorEnv", "slip": args.slip, "seed": args.seed,
        "episodes": args.episodes, "steps": args.steps, "batch": args.batch, "lr": args.lr, "hidden": args.hidden,
        "layers": args.layers, "parameters": n_params, "threads": args.threads,
        "eval_success": last["eval_success"], "mean_model_turns": last["mean_model_turns"],
        "sampled_t1": sampled,
        "eval": f"greedy episodes on CalculatorEnv.eval_examples(seed=0, n={args.num_eval}), built-in engine"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
