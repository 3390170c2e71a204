"""A plain synchronous RL loop in one process: the reference the async runtime is checked against.

    for each step: take the next prompts → generate → score → train → load the new weights

It shares the engine, the trainer, the task and the per-prompt seeds with the runtime, and none
of its machinery (no processes, no buffer, no weight transport), so with ``max_staleness = 0``
the runtime must reproduce its per-step rewards and losses exactly.
"""

from __future__ import annotations

import dataclasses

from tokenflow.buffer import DynamicSampling
from tokenflow.tasks.prompts import prompt_encoder
from tokenflow.runtime.orchestrator.seeds import request_seed
from tokenflow.runtime.orchestrator.step_metrics import batch_metrics
from tokenflow.scoring.pool import normalise_reward
from tokenflow.scoring.scorer_shapes import normalise_group, shape_of
from tokenflow.scoring.overlong import shape_overlong
from tokenflow.scoring.token_scorer_specs import SampleView, apply_token_scores, build_token_scorer


def run_sync_loop(cfg, model_path: str) -> list[dict[str, float]]:
    """Train ``cfg.run.steps`` steps synchronously; returns each step's metrics."""
    from transformers import AutoTokenizer

    from tokenflow.engine import SamplingParams
    from tokenflow.engine.factory import make_engine
    from tokenflow.tasks import build_task
    from tokenflow.trainer import Trainer

    task = build_task(cfg.task)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    token_scorers = []
    if cfg.scorer.any_token_scorer:  # built first: a scorer's engine sets torch's thread count
        from tokenflow.scoring.stage import check_token_scorers

        token_scorers = [(spec, build_token_scorer(spec)) for spec in check_token_scorers(cfg, model_path)]
    engine = make_engine(model_path, cfg.engine)
    trainer = Trainer(model_path, cfg.trainer, cfg.algorithm, tokenizer=tokenizer)
    s, r = cfg.sampling, cfg.rollout
    base = SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                          max_tokens=s.max_tokens, stop=tuple(s.stop), n=r.group_size)
    alg = cfg.algorithm
    sampler = DynamicSampling(alg.dynamic_sampling_max_batches * r.prompts_per_step) if alg.dynamic_sampling else None
    history = []
    cursor = 0
    for step in range(1, cfg.run.steps + 1):
        groups, dropped = [], 0
        # Dynamic sampling: top the step up with the next prompts until it holds prompts_per_step
        # groups that were not dropped (the runtime's admission does the same, group by group).
        while len(groups) < r.prompts_per_step:
            prompts = [task.train_prompt(cursor + i) for i in range(r.prompts_per_step - len(groups))]
            cursor += len(prompts)
            for p, group in zip(prompts, _generate_and_score(engine, tokenizer, task, token_scorers, cfg, base,
                                                             prompts, first_gid=cursor - len(prompts))):
                if sampler is not None and sampler.drop(group):
                    dropped += 1
                else:
                    groups.append(group)
        metrics = trainer.train_step([roll for g in groups for roll in g])
        if sampler is not None:
            sampler.batch_taken()
        metrics.update(batch_metrics(groups, dropped_groups=dropped if sampler is not None else None))
        engine.update_weights(trainer.named_weights(), trainer.version)
        history.append(metrics)
    return history


def _generate_and_score(engine, tokenizer, task, token_scorers, cfg, base, prompts, first_gid: int):
    """One group per prompt, generated with its per-prompt seed, scored, shaped."""
    params = [dataclasses.replace(base, seed=request_seed(cfg.run.seed, p.id)) for p in prompts]
    encode = prompt_encoder(tokenizer, cfg.task)
    groups = engine.generate([encode(p.text) for p in prompts], params)
    alg = cfg.algorithm
    for gid, (p, group) in enumerate(zip(prompts, groups), first_gid):
        if shape_of(task.reward_fn) == "group":
            outs = normalise_group(task.reward_fn(p.text, [r.text or "" for r in group], p.example), len(group))
        else:
            outs = [task.reward_fn(p.text, roll.text or "", p.example) for roll in group]
        for roll, out in zip(group, outs):
            roll.group_id, roll.prompt_id = gid, p.id
            rewards = normalise_reward(out)
            roll.rewards, roll.reward = rewards, rewards["reward"]
        samples = [SampleView.of(r) for r in group]
        apply_token_scores(group, [(spec, sc.score(p.text, samples, p.example)) for spec, sc in token_scorers])
        if alg.overlong_buffer_tokens is not None:
            shape_overlong(group, cfg.sampling.max_tokens, alg.overlong_buffer_tokens, alg.overlong_penalty)
    return groups
