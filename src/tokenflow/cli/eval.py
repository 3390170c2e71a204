"""`tokenflow eval CHECKPOINT`: held-out greedy accuracy of a model, a checkpoint or a run."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "eval", help="held-out greedy accuracy of a model, checkpoint or run folder",
        description="Evaluate greedy accuracy on the task's held-out split. CHECKPOINT is a model "
                    "folder, a checkpoint folder (checkpoints/step_000010) or a run folder (its latest "
                    "checkpoint and its task). Overrides such as --task.name apply to the task.")
    p.add_argument("checkpoint", help='model / checkpoint / run folder, or a model name: "default", '
                                      '"default-tool", "default-moe", "smollm2-135m-instruct"')
    p.add_argument("--config", default=None,
                   help="a config file whose task, sampling and engine sections apply (default: the run "
                        "folder's config, else the preset's); e.g. the base model on a run's task")
    p.add_argument("--limit", type=int, default=None, help="evaluate at most this many prompts")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for the engine")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--trust-run-config", action="store_true",
                   help="run the code a run folder's config names (task.reward, task.env, task.agent, "
                        "scorer.token files or modules); without it such a config is refused (give --config "
                        "or --task.KEY overrides of your own instead)")
    p.set_defaults(func=run, _allow_overrides=True)


def locate(path: str) -> tuple[str, Path | None]:
    """(model folder, run folder or None) for a model, checkpoint or run folder."""
    from tokenflow.model_store import MODEL_NAMES, resolve_model_path
    from tokenflow.runtime.run.run_dir import RunDir

    if path in MODEL_NAMES:
        return resolve_model_path(path), None
    p = Path(path)
    if (p / "config.toml").is_file() and (p / "checkpoints").is_dir():
        ckpt = RunDir(p).latest_checkpoint()
        if ckpt is None:
            raise SystemExit(f"error: run folder {p} has no complete checkpoint yet")
        return str(ckpt / "model"), p
    if (p / "model" / "config.json").is_file():
        run = p.parent.parent if p.parent.name == "checkpoints" else None
        return str(p / "model"), run
    if (p / "config.json").is_file():
        return str(p), None
    raise SystemExit(f"error: {p} is not a model folder, a checkpoint or a run folder")


def generate_with_progress(engine, max_tokens: int, stop: tuple[str, ...]):
    """A greedy ``generate`` for ``accuracy_of`` that shows a progress bar on stderr: every prompt
    is queued at once (continuous batching as in ``Engine.generate``), then the engine steps."""
    from tokenflow.engine import SamplingParams
    from tokenflow.runtime.view.progress import Progress

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, stop=stop)

    def generate(prompt_ids: list[list[int]]) -> list[str]:
        index = {engine.add_request(p, params): i for i, p in enumerate(prompt_ids)}
        texts = [""] * len(prompt_ids)
        bar = Progress(len(prompt_ids), description="eval", unit="prompt")
        done = 0
        try:
            while done < len(prompt_ids):
                finished = [r for r in engine.step() if r.request_id in index]
                for r in finished:
                    texts[index[r.request_id]] = r.text or ""
                if finished:
                    done += len(finished)
                    bar.update(done, {})
        finally:
            bar.close()
        return texts

    return generate


def episode_accuracy(engine, task, cfg, limit: int | None) -> float:
    """Held-out success of greedy multi-turn episodes (an environment task): the share of
    episodes whose reward (rubric + step rewards) is at least
    ``CORRECT_REWARD`` (0.5), as the runtime's evaluation."""
    from tokenflow.engine import SamplingParams
    from tokenflow.rollout import CORRECT_REWARD
    from tokenflow.runtime.drivers.episodes import EpisodeSpec, run_episodes
    from tokenflow.runtime.view.progress import Progress
    from tokenflow.scoring.episodes import episode_reward
    from tokenflow.scoring.pool import normalise_reward, scored_text

    prompts = task.eval_prompts()[:limit]
    e = cfg.episode
    agent = getattr(cfg.task, "agent", None)
    specs = [EpisodeSpec(cfg.task.env, p.example, e.max_turns, e.max_total_tokens, e.step_timeout_s,
                         agent=agent, agent_timeout_s=e.agent_timeout_s, options=dict(cfg.task.options))
             for p in prompts]
    params = SamplingParams(temperature=0.0, max_tokens=cfg.sampling.max_tokens, stop=tuple(cfg.sampling.stop))
    bar = Progress(len(prompts), description="eval", unit="agent run" if agent else "episode")
    if agent:  # the agent plays each example through a session, as in training
        from tokenflow.runtime.drivers.agents import run_agents as run_episodes
    try:
        groups = run_episodes(engine, specs, params, on_progress=lambda done: bar.update(done, {}))
    finally:
        bar.close()
    wins = 0
    for p, rows in zip(prompts, groups):
        if rows[-1].failed:
            continue
        reward = normalise_reward(episode_reward(p.text, [scored_text(r) for r in rows], p.example)[-1])
        wins += reward["reward"] >= CORRECT_REWARD
    return wins / max(1, len(prompts))


def run(args, overrides: list[str] | None = None) -> int:
    from tokenflow.config.loading import ConfigError, load_config
    from tokenflow.config.root import TrainConfig
    from tokenflow.config.presets import default_config_path
    from tokenflow.errors import InputError

    try:
        model, run_dir = locate(args.checkpoint)
    except InputError as e:  # a model name whose folder cannot be built
        print(f"error: {e}", file=sys.stderr)
        return 2
    config = args.config or (run_dir / "config.toml" if run_dir is not None else default_config_path())
    try:
        cfg = load_config(TrainConfig, config, overrides or [])
        if not args.config and run_dir is not None:  # the folder's own config: data, not the user's word
            from tokenflow.runtime.run.folder_code import refuse_folder_code

            refuse_folder_code(cfg, overrides or [], config, args.trust_run_config)
    except (ConfigError, InputError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from tokenflow.engine.factory import make_engine
    from tokenflow.evaluation import Evaluation, evaluate
    from tokenflow.tasks import build_task
    from tokenflow.tasks.prompts import prompt_encoder

    try:  # before the engine: a task its library refuses (an unknown dataset) is one line, at once
        task = build_task(cfg.task)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    engine_cfg = cfg.engine.model_copy(update={"threads": args.threads or cfg.engine.threads})
    engine = make_engine(model, engine_cfg)
    limit = args.limit or cfg.run.eval_limit
    n = len(task.eval_prompts()[:limit])
    if getattr(cfg.task, "env", None):
        result = Evaluation(episode_accuracy(engine, task, cfg, limit), n)
    else:
        result = evaluate(generate_with_progress(engine, cfg.sampling.max_tokens, tuple(cfg.sampling.stop)),
                          engine.tokenizer, task, limit, encode=prompt_encoder(engine.tokenizer, cfg.task))
    scored = getattr(task, "eval_source", f"{task.name} held-out split")
    if args.json:
        print(json.dumps({"model": model, "task": task.name, "eval_set": scored, "prompts": n,
                          "accuracy": result.accuracy, "components": result.components,
                          "accuracy_given": result.accuracy_given}))
        return 0
    from rich.console import Console

    # The command's result, on stdout through the console UI: no markup, no highlighting, and
    # lines never wrapped (scripts read them).
    console = Console(highlight=False, soft_wrap=True)
    console.print(f"{scored}: greedy accuracy {result.accuracy:.4f} on {n} prompts ({model})", markup=False)
    for name, mean in result.components.items():  # the reward's own parts, when it returns a dict
        line = f"  {name}: mean {mean:.4f}"
        if name in result.accuracy_given:
            given = result.accuracy_given[name]
            line += "; accuracy where it is 1: " + ("-" if given is None else f"{given:.4f}")
        console.print(line, markup=False)
    return 0
