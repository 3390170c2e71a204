"""The TRL side of benchmarks/trl: one GRPOTrainer run, in TRL's own environment.

Run by ``run.py`` with the TRL environment's interpreter and ``PYTHONPATH=<repo>/src`` (only
tokenflow's tasks are imported: the prompt stream and the reward, so both sides train on the same
prompts, in the same order, with the same reward). Without ``--config`` the task is arithmetic
with the preset's batch; with ``--config FILE`` (a tokenflow config, e.g.
examples/laptop_math/config.toml) its dataset task, chat template, system prompt, batch,
temperature, learning rate schedule and precision. Writes into
``--out``: ``model/`` (the trained policy with its tokenizer), ``checkpoints/step_N/`` at the
requested steps, and ``result.json`` (wall times, per-step times, completion tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--prompts-per-step", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=0.2)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--task-seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--micro-batches", type=int, default=1,
                    help="train each step's completions in this many micro-batches (gradient accumulation)")
    ap.add_argument("--save-steps", default="", help="comma-separated steps to save a checkpoint at")
    ap.add_argument("--config", type=Path, default=None,
                    help="a tokenflow config file: its dataset task and batch, sampling, schedule, precision")
    return ap.parse_args(argv)


def from_config(args, tokenizer):
    """(rows, reward, settings) for a tokenflow config's dataset task. The prompts are rendered
    through the chat template to text that tokenizes back to exactly tokenflow's prompt ids
    (checked); the batch, temperature, schedule and precision replace the arithmetic defaults."""
    import tomllib

    from tokenflow.tasks.prompts import chat_prompt_ids
    from tokenflow.tasks.dataset import DatasetTask

    cfg = tomllib.loads(args.config.read_text())
    task_cfg, rollout = cfg.get("task", {}), cfg.get("rollout", {})
    args.prompts_per_step = rollout.get("prompts_per_step", args.prompts_per_step)
    args.group_size = rollout.get("group_size", args.group_size)
    args.temperature = cfg.get("sampling", {}).get("temperature", args.temperature)
    trainer = cfg.get("trainer", {})
    if trainer.get("schedule", "constant") != "constant" or trainer.get("warmup_steps", 0):
        raise SystemExit(f"{args.config}: only a constant learning rate without warmup is mirrored here")
    task = DatasetTask(task_cfg["train_path"], task_cfg["reward"], eval_path=task_cfg.get("eval_path"),
                       prompt_field=task_cfg.get("prompt_field", "prompt"), seed=task_cfg.get("seed", 0))
    system = task_cfg.get("system_prompt")
    rows = []
    for i in range(args.steps * args.prompts_per_step):
        p = task.train_prompt(i)
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": p.text}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        # GRPOTrainer tokenizes a text prompt as tokenizer(text=...): the same ids as tokenflow's?
        if tokenizer(text=text)["input_ids"] != chat_prompt_ids(tokenizer, p.text, system):
            raise SystemExit(f"prompt {i} rendered as text does not tokenize back to tokenflow's ids")
        rows.append({"prompt": text, "prompt_id": i, "example": json.dumps(p.example)})

    def score(prompt, completion, example):
        out = task.reward_fn(prompt, completion, json.loads(example))
        return float(out["reward"] if isinstance(out, dict) else out)

    dtype = trainer.get("dtype", "float32")
    if dtype == "native":  # as tokenflow resolves it on this machine (tokenflow.precision)
        from tokenflow.precision import native_dtype

        dtype = native_dtype(trainer.get("device", "auto"))
    settings = {"schedule": "constant", "bf16": dtype == "bfloat16", "task": str(args.config)}
    return rows, score, settings


def main(argv=None) -> int:
    t_process = time.perf_counter()
    args = parse(argv)
    import torch

    torch.set_num_threads(args.threads)
    import datasets
    import transformers
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from tokenflow.tasks.arithmetic import ArithmeticTask, arithmetic_reward

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if args.config is not None:
        rows, score, settings = from_config(args, tokenizer)
    else:
        task = ArithmeticTask(seed=args.task_seed)
        bos = tokenizer.bos_token or ""
        # TRL tokenizes text prompts without adding BOS; tokenflow's engine gets BOS + text.
        rows = [{"prompt": bos + p.text, "prompt_id": i, "example": json.dumps(p.example)}
                for i, p in ((i, task.train_prompt(i)) for i in range(args.steps * args.prompts_per_step))]

        def score(prompt, completion, example):
            return arithmetic_reward(prompt, completion, json.loads(example))

        settings = {"schedule": "cosine_with_min_lr", "bf16": False, "task": "arithmetic"}
    settings.update(prompts_per_step=args.prompts_per_step, group_size=args.group_size, temperature=args.temperature)
    dataset = datasets.Dataset.from_list(rows)
    counted = {"completion_tokens": 0, "samples": 0}
    step_prompts: list[list[int]] = []  # each batch's prompt ids (positions in the stream), in order

    def reward(prompts, completions, prompt_id, example, completion_ids=None, **_):
        step_prompts.append(list(dict.fromkeys(prompt_id)))
        counted["samples"] += len(completions)
        counted["completion_tokens"] += sum(len(c) for c in completion_ids) if completion_ids is not None else 0
        return [score(p, c, e) for p, c, e in zip(prompts, completions, example)]

    save_at = {int(s) for s in args.save_steps.split(",") if s}
    marks: list[dict] = []

    class Clock(TrainerCallback):
        """Per-step wall times from the start of training, and checkpoints at the asked steps."""

        def on_train_begin(self, *_, **__):
            self.t0 = time.perf_counter()

        def on_step_end(self, _args, state, control, model=None, **__):
            mark = {"step": state.global_step, "wall_s": time.perf_counter() - self.t0}
            if state.global_step in save_at:
                path = args.out / "checkpoints" / f"step_{state.global_step:06d}"
                model.save_pretrained(path)
                tokenizer.save_pretrained(path)
                mark["checkpoint"] = str(path)
            marks.append(mark)

    batch = args.prompts_per_step * args.group_size
    if args.micro_batches < 1 or batch % args.micro_batches:
        raise SystemExit(f"--micro-batches {args.micro_batches} must divide the {batch} completions of a step")
    config = GRPOConfig(
        output_dir=str(args.out / "trainer"), seed=args.seed, data_seed=args.seed, use_cpu=True,
        # One generation batch of prompts x group completions per optimizer step, trained in
        # --micro-batches pieces: TRL's "dapo" loss divides by the generation batch's token count,
        # so the accumulated gradient is the one-piece gradient (float32 on a CPU without bfloat16
        # units does not fit 64 completions of SmolLM2 in 24 GB).
        max_steps=args.steps, per_device_train_batch_size=batch // args.micro_batches,
        gradient_accumulation_steps=args.micro_batches, steps_per_generation=args.micro_batches,
        num_generations=args.group_size, shuffle_dataset=False,
        max_completion_length=args.max_tokens, temperature=args.temperature, top_p=1.0, top_k=0,
        learning_rate=args.lr, lr_scheduler_type=settings["schedule"],
        lr_scheduler_kwargs={"min_lr_rate": args.min_lr_ratio} if settings["schedule"] != "constant" else {},
        warmup_steps=0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=args.grad_clip,
        beta=0.0, num_iterations=1, epsilon=args.clip, loss_type="dapo", scale_rewards="group",
        logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True,
        # bf16: autocast over float32 weights, as tokenflow's trainer.dtype = "bfloat16" (the
        # example's "native" is that where the CPU has bfloat16 units, float32 elsewhere)
        dataloader_num_workers=0, bf16=settings["bf16"], fp16=False,
        # tokenflow trains without activation checkpointing; TRL turns it on by default, which on
        # a model this small only costs time.
        gradient_checkpointing=False,
    )
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[Clock()])
    t0 = time.perf_counter()
    trainer.train()
    train_wall = time.perf_counter() - t0
    trainer.model.save_pretrained(args.out / "model")
    tokenizer.save_pretrained(args.out / "model")
    result = {
        "side": "trl", "steps": args.steps, "train_wall_s": train_wall,
        "process_wall_s": time.perf_counter() - t_process,
        "completion_tokens": counted["completion_tokens"], "samples": counted["samples"],
        "marks": marks, "step_prompts": step_prompts, "settings": settings, "threads": args.threads, "micro_batches": args.micro_batches, "load_average": list(os.getloadavg()),
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
        "log_history": trainer.state.log_history,
    }
    (args.out / "result.json").write_text(json.dumps(result, indent=2, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
