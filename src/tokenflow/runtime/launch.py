"""Start, resume and finish a training run (what `tokenflow train` does, callable from Python).

    from tokenflow.config.loading import load_config
    from tokenflow.config.root import TrainConfig
    from tokenflow.runtime.launch import train
    summary = train(load_config(TrainConfig, "run.toml"), "runs/my-run")
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from tokenflow.metrics import trace
from tokenflow.metrics import phases
from tokenflow.metrics.safe_files import write_atomic
from tokenflow.metrics.sinks import dumps_strict
from tokenflow.model_store import resolve_model_path
from tokenflow.runtime.run.run_dir import RunDir

log = logging.getLogger(__name__)


def default_run_dir(cfg) -> Path:
    if cfg.run.output_dir:
        return Path(cfg.run.output_dir)
    name = cfg.run.name or time.strftime("run-%Y%m%d-%H%M%S")
    return Path("runs") / name


def _write_json(path: Path, data: dict) -> None:
    write_atomic(path, dumps_strict(data, indent=2))


def _make_backend(cfg, engine_model: str, trainer_model: str, version: int, resume_dir, trace_dir):
    if cfg.runtime.backend == "ray":
        from tokenflow.runtime.backends.ray.backend import RayBackend

        return RayBackend(cfg, engine_model, trainer_model, engine_version=version,
                          resume_dir=resume_dir, trace_dir=trace_dir).start()
    from tokenflow.runtime.backends.local.backend import LocalBackend

    return LocalBackend(cfg, engine_model, trainer_model, engine_version=version,
                        resume_dir=resume_dir, trace_dir=trace_dir).start()


class RunFinished(Exception):
    """``--resume`` of a run that already reached its last step (nothing is changed)."""

    def __init__(self, summary: dict, run_dir: Path) -> None:
        super().__init__(f"run {run_dir} already finished ({summary.get('steps')} steps); nothing to do. "
                         f"Its summary is in {run_dir / 'summary.json'}")
        self.summary = summary


def _fork_context(cfg):
    """The fork-server context the local backend's workers start from, or None (spawn, Ray)."""
    if cfg.runtime.backend != "local" or cfg.runtime.start_method != "forkserver":
        return None
    from tokenflow.runtime.backends.local.start import available, context

    return context("forkserver") if available("forkserver") else None


def _import_run_modules() -> None:
    """What this process imports to run the orchestrator (none of it torch), imported now: with
    a fork server the preflight waits for its imports, and this costs nothing then."""
    import tokenflow.metrics.sinks  # noqa: F401
    import tokenflow.runtime.backends.local.backend  # noqa: F401
    import tokenflow.runtime.orchestrator.orchestrator  # noqa: F401
    import tokenflow.scoring.pool  # noqa: F401
    import tokenflow.scoring.stage  # noqa: F401

    try:  # the TensorBoard sink's writer (protobuf)
        import tensorboard.compat.proto.event_pb2  # noqa: F401
        import tensorboard.summary.writer.event_file_writer  # noqa: F401
    except ImportError:
        pass


def prepare(cfg, model: str):
    """Everything a run needs that can be wrong in the user's input, checked before the run folder
    or any process exists (``tokenflow.runtime.run.preflight``): (task, tokenizer)."""
    from tokenflow.runtime.run import preflight
    from tokenflow.tasks import build_task

    preflight.check_model_folder(model)
    preflight.check_precision(cfg)
    ctx = _fork_context(cfg)
    if ctx is not None:
        _import_run_modules()  # while the fork server imports the workers' modules
    # The task and its reward need no tokenizer: checked before waiting for one (the fork
    # server's imports), so a bad dataset or reward function is reported in about a second.
    task = build_task(cfg.task)
    episodes = bool(getattr(cfg.task, "env", None))  # scored by the environment, prompted by reset
    if not episodes:
        preflight.check_reward(task)
    tokenizer = preflight.load_tokenizer(model, ctx)
    preflight.check_memory(cfg, model, task, tokenizer)
    if episodes:
        if getattr(cfg.task, "agent", None):  # agent samples: played by the agent function
            preflight.check_agent(cfg.task.agent, tokenizer)
        else:
            preflight.check_environment(task, tokenizer)
        return task, tokenizer
    preflight.check_prompts_encode(task, lambda text: tokenizer.encode(text, add_special_tokens=False))
    if cfg.task.chat_template:  # then every prompt is encoded through it (tokenflow.tasks.prompts.prompt_encoder)
        preflight.check_chat_prompt(task, tokenizer, cfg.task)
    return task, tokenizer


def train(cfg, run_dir: str | Path, *, resume: bool = False) -> dict:
    """Run (or resume) training; returns the summary also written to ``summary.json``.

    Resuming a folder that holds no checkpoint yet (the run died before its first one) starts it
    again from step 0 with its stored config; resuming a finished run raises ``RunFinished``.
    ``run_dir`` must be new, empty or a run folder (`tokenflow.runtime.run.folder_guard`:
    ``RunFolderError`` otherwise, before anything is written)."""
    from tokenflow.runtime.run.folder_guard import claim_for_new_run, claim_for_resume
    from tokenflow.runtime.run.resources import release_segments, run_resources

    rd = RunDir(run_dir)
    (claim_for_resume if resume else claim_for_new_run)(rd.root)
    if resume:
        done = rd.finished(cfg.run.steps)
        if done is not None:
            raise RunFinished(done, rd.root)
    from tokenflow.runtime.backends.local import start as worker_start

    phases.reset(keep=("cli_main", "config_loaded"))  # an earlier run's marks (tests, benches)
    if cfg.runtime.backend == "local" and cfg.runtime.start_method == "forkserver":
        worker_start.warm("forkserver")  # the fork server imports the workers' modules while we check
    else:
        worker_start.stop()  # one `tokenflow train` warmed before reading the config
    model = resolve_model_path(cfg.model.path)
    phases.mark("preflight_start")
    task, tokenizer = prepare(cfg, model)
    phases.mark("preflight_end")
    rd.create()
    with run_resources(rd.root) as tag:
        try:
            return _train(cfg, rd, model, task, tokenizer, resume)
        finally:
            if cfg.runtime.backend == "local":
                release_segments(tag)  # every worker has stopped by now


def _train(cfg, rd: RunDir, model: str, task, tokenizer, resume: bool) -> dict:
    from tokenflow.config.loading import to_toml
    from tokenflow.metrics.sinks import build_logger
    from tokenflow.runtime.orchestrator.orchestrator import Orchestrator
    from tokenflow.scoring.pool import ScorerPool
    from tokenflow.scoring.stage import build_scoring

    engine_model = trainer_model = model
    version, resume_dir, resume_state = 0, None, None
    rd.clean_staging()
    ckpt = rd.latest_checkpoint() if resume else None
    if ckpt is not None:
        resume_state = RunDir.load_checkpoint(ckpt)
        version = resume_state[0]["step"]
        rd.truncate_after(version)
        engine_model = trainer_model = str(ckpt / "model")
        if cfg.trainer.lora_rank is not None:  # the adapters resume on the base, not the merged model
            trainer_model = model
        resume_dir = str(ckpt)
        from tokenflow.runtime.run.preflight import load_tokenizer

        tokenizer = load_tokenizer(trainer_model, _fork_context(cfg))
        log.info("resuming %s from step %d", rd.root, version)
    else:
        if resume:
            log.warning("%s holds no complete checkpoint: the run starts again from step 0", rd.root)
        rd.reset()
        write_atomic(rd.config, to_toml(cfg))
    phases.mark("run_folder_ready")
    trace_dir = str(rd.trace_dir) if cfg.metrics.trace else None
    trace.configure(trace_dir, "orchestrator")
    reward_spec = task.reward_spec
    if getattr(cfg.task, "env", None):  # multi-turn: the environment's rubric scores whole episodes
        from tokenflow.scoring.episodes import REWARD_SPEC as reward_spec
    backend = scorer = logger = None
    if cfg.scorer.sandbox_fallback:  # read by Sandbox() in the scorer processes started below
        os.environ["TOKENFLOW_SANDBOX_FALLBACK"] = "1"
    try:
        # Workers first: their start-up is the longest, and the rest happens while they load.
        phases.mark("workers_spawn_start")
        backend = _make_backend(cfg, engine_model, trainer_model, version, resume_dir, trace_dir)
        phases.mark("workers_spawned")
        if cfg.runtime.backend == "ray":
            from tokenflow.runtime.backends.ray.scoring import RayScorerPool

            scorer = RayScorerPool(reward_spec, cfg)
        else:
            scorer = ScorerPool(reward_spec, cfg.runtime.scorer_workers, cfg.runtime.score_timeout_s)
        scorer = build_scoring(scorer, cfg, trainer_model)  # + teacher / PRM / token scorers, if set
        phases.mark("scorer_started")
        logger = build_logger(cfg.metrics, rd.root, rd.root.name, cfg.model_dump(mode="json"),
                              resume_step=version + 1 if resume_state is not None else None)
        phases.mark("logger_ready")
        scorers = {f"scorer{i}": pid for i, pid in enumerate(scorer.worker_pids())}
        _write_json(rd.workers, {"orchestrator": os.getpid(), **{w.name: w.pid for w in backend.all_workers},
                                 **scorers})
        orchestrator = Orchestrator(cfg, rd, backend, task, tokenizer, scorer, logger, resume_state)
        summary = orchestrator.run()
        phases.mark("run_end")
    finally:
        if backend is not None:
            backend.shutdown()
        phases.mark("workers_stopped")
        if scorer is not None:
            scorer.close()
        phases.mark("scorer_closed")
        if logger is not None:
            logger.close()
        phases.mark("logger_closed")
        trace.flush()
    summary["run_dir"] = str(rd.root)
    phases.mark("shutdown_end")
    summary["phases"] = {"process_start": phases.process_start(),
                         "marks": phases.relative(orchestrator.worker_marks)}
    _write_json(rd.summary, summary)
    if trace_dir:
        trace.configure(None, "orchestrator")  # stop tracing this process once the run is over
        n = trace.merge(trace_dir, rd.root / "trace.json")
        log.info("wrote %s (%d events)", rd.root / "trace.json", n)
    return summary
