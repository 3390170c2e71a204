"""Start, resume and finish a training run (what `tokenflow train` does, callable from Python).

    from tokenflow.config.loading import load_config
    from tokenflow.config.root import TrainConfig
    from tokenflow.runtime.launch import train
    summary = train(load_config(TrainConfig, "run.toml"), "runs/my-run")
"""

from __future__ import annotations

import json
import logging
import os
import time
from importlib import resources
from pathlib import Path

from tokenflow.metrics import trace
from tokenflow.runtime.run_dir import RunDir

log = logging.getLogger(__name__)


def default_model_path() -> Path:
    return Path(str(resources.files("tokenflow") / "assets" / "default_model"))


def default_config_path() -> Path:
    """The embedded default run: the shipped model on the arithmetic task, async, on the CPU."""
    return Path(str(resources.files("tokenflow") / "configs" / "arithmetic.toml"))


def resolve_model_path(path: str) -> str:
    if path == "default":
        p = default_model_path()
        if not (p / "model.safetensors").is_file():
            raise FileNotFoundError(
                f"the default model is missing from {p}; rebuild it with "
                "`python -m tokenflow.tools.make_default_model --out src/tokenflow/assets/default_model`")
        return str(p)
    if not Path(path).is_dir():
        raise FileNotFoundError(f"model.path {path!r} is not a folder with a Hugging Face model "
                                "(config.json, model.safetensors, tokenizer files)")
    return path


def default_run_dir(cfg) -> Path:
    if cfg.run.output_dir:
        return Path(cfg.run.output_dir)
    name = cfg.run.name or time.strftime("run-%Y%m%d-%H%M%S")
    return Path("runs") / name


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def _make_backend(cfg, engine_model: str, trainer_model: str, version: int, resume_dir, trace_dir):
    if cfg.runtime.backend == "ray":
        from tokenflow.runtime.ray_backend import RayBackend

        return RayBackend(cfg, engine_model, trainer_model, engine_version=version,
                          resume_dir=resume_dir, trace_dir=trace_dir).start()
    from tokenflow.runtime.local import LocalBackend

    return LocalBackend(cfg, engine_model, trainer_model, engine_version=version,
                        resume_dir=resume_dir, trace_dir=trace_dir).start()


def train(cfg, run_dir: str | Path, *, resume: bool = False) -> dict:
    """Run (or resume) training; returns the summary also written to ``summary.json``."""
    from transformers import AutoTokenizer

    from tokenflow.config.loading import to_toml
    from tokenflow.metrics.sinks import build_logger
    from tokenflow.runtime.orchestrator import Orchestrator
    from tokenflow.scoring.pool import ScorerPool
    from tokenflow.scoring.stage import build_scoring
    from tokenflow.tasks import build_task

    rd = RunDir(run_dir).create()
    model = resolve_model_path(cfg.model.path)
    engine_model = trainer_model = model
    version, resume_dir, resume_state = 0, None, None
    if resume:
        ckpt = rd.latest_checkpoint()
        if ckpt is None:
            raise FileNotFoundError(f"{rd.root} holds no complete checkpoint to resume from")
        rd.clean_staging()
        resume_state = RunDir.load_checkpoint(ckpt)
        version = resume_state[0]["step"]
        rd.truncate_after(version)
        engine_model = trainer_model = str(ckpt / "model")
        if cfg.trainer.lora_rank is not None:  # the adapters resume on the base, not the merged model
            trainer_model = model
        resume_dir = str(ckpt)
        log.info("resuming %s from step %d", rd.root, version)
    else:
        rd.config.write_text(to_toml(cfg))
    trace_dir = str(rd.trace_dir) if cfg.metrics.trace else None
    trace.configure(trace_dir, "orchestrator")
    task = build_task(cfg.task)
    tokenizer = AutoTokenizer.from_pretrained(trainer_model)
    if cfg.runtime.backend == "ray":
        from tokenflow.runtime.ray_scoring import RayScorerPool

        scorer = RayScorerPool(task.reward_spec, cfg)
    else:
        scorer = ScorerPool(task.reward_spec, cfg.runtime.scorer_workers, cfg.runtime.score_timeout_s)
    scorer = build_scoring(scorer, cfg, trainer_model)  # + teacher / PRM / token scorers, if set
    logger = build_logger(cfg.metrics, rd.root, rd.root.name, cfg.model_dump(mode="json"),
                          resume_step=version + 1 if resume else None)
    backend = _make_backend(cfg, engine_model, trainer_model, version, resume_dir, trace_dir)
    _write_json(rd.workers, {"orchestrator": os.getpid(), **{w.name: w.pid for w in backend.all_workers}})
    try:
        orch = Orchestrator(cfg, rd, backend, task, tokenizer, scorer, logger, resume_state)
        summary = orch.run()
    finally:
        backend.shutdown()
        scorer.close()
        logger.close()
        trace.flush()
    summary["run_dir"] = str(rd.root)
    _write_json(rd.summary, summary)
    if trace_dir:
        trace.configure(None, "orchestrator")  # stop tracing this process once the run is over
        n = trace.merge(trace_dir, rd.root / "trace.json")
        log.info("wrote %s (%d events)", rd.root / "trace.json", n)
    return summary
