"""Running one side of the comparison: TRL's GRPOTrainer, or tokenflow (async or synchronous).

Each run goes in a subprocess of its own and returns a :class:`RunResult`: the training window's
wall time, the process's wall time, completion tokens trained on, and (step, wall time, model
folder) points for the accuracy curve. Scoring is separate (:func:`evaluate`): every model
folder, from either side, is scored by the same ``tokenflow eval`` on the same held-out prompts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRL_VENV = ROOT / ".venv-trl"
REQUIREMENTS = Path(__file__).with_name("requirements.txt")
TORCH = "torch==2.13.0"  # installed first and alone: the CPU wheel where the machine has no GPU


@dataclass(frozen=True)
class Workload:
    name: str
    model: str
    """A model folder, or "default" (the shipped model)."""
    max_tokens: int
    description: str
    lr: float = 3e-4
    """Peak learning rate, both sides (cosine to 0.1 × it, or constant with ``config``)."""
    config: str | None = None
    """A tokenflow config file (relative to the repository) whose task, batch, sampling, precision
    and schedule both sides take (``smollm2``: examples/laptop_math); None: the arithmetic task
    with the preset's settings (16 prompts × 8, temperature 1, cosine to 0.1 × lr, float32)."""


@dataclass
class RunResult:
    side: str
    seed: int
    steps: int
    train_wall_s: float
    process_wall_s: float
    completion_tokens: int
    points: list[dict] = field(default_factory=list)
    """[{"step", "wall_s", "model"}], step 0 (the starting model) first."""
    extra: dict = field(default_factory=dict)


# ---- environments ---------------------------------------------------------------------------------

def trl_python(venv: Path = TRL_VENV) -> Path | None:
    """The TRL environment's interpreter, if that environment has been built (with TRL in it)."""
    python = venv / "bin" / "python"
    if not python.exists():
        return None
    ok = subprocess.run([str(python), "-c", "import trl"], capture_output=True).returncode == 0
    return python if ok else None


def build_trl_venv(venv: Path = TRL_VENV) -> Path:
    """Create ``venv`` with the pinned versions of requirements.txt (torch first, alone)."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, TORCH], check=True)
    subprocess.run([*pip, "-r", str(REQUIREMENTS)], check=True)
    python = trl_python(venv)
    if python is None:
        raise SystemExit(f"built {venv}, but it cannot import trl")
    return python


def resolve_model(model: str) -> str:
    """A model folder: ``model`` itself, or the folder of a shipped name ("default",
    "smollm2-135m-instruct"; TRL's side loads folders only)."""
    from tokenflow.model_store import MODEL_NAMES, resolve_model_path

    return resolve_model_path(model) if model in MODEL_NAMES else model


def build_gen_heavy_model(out: Path, steps: int | None = None) -> Path:
    """The generation-heavy workload's policy, built once (a few minutes): `make_default_model
    --preset long-tail`, the bench engine model's width and depth (hidden 256, 4 layers, 8 heads;
    3.4M parameters on the arithmetic vocabulary, context 512), warm-started on worked solutions of
    which 40% start with a lognormal run of spaces, so sampled completion lengths have a long
    tail while greedy answers stay short."""
    if (out / "config.json").is_file():
        return out
    cmd = [sys.executable, "-m", "tokenflow.shipped_models.make_default_model", "--preset", "long-tail", "--out", str(out),
           "--threads", "2"] + (["--steps", str(steps), "--eval-every", str(steps)] if steps else [])
    _run(cmd, "building the generation-heavy model")
    return out


def _run(args: list[str], what: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``args``; on failure raise with the tail of its error output."""
    # From the repository root: a workload's config names its files relative to it.
    r = subprocess.run(args, env=_env(**(env_extra or {})), capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {r.returncode}): {' '.join(args)}\n{r.stderr[-3000:]}")
    return r


def _env(**extra) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    env.update(extra)
    return env


# ---- the sides ------------------------------------------------------------------------------------

def run_tokenflow(w: Workload, seed: int, steps: int, out: Path, *, staleness: int | None, save_every: int,
                  eval_limit: int | None) -> RunResult:
    """`tokenflow train` (the preset's run: 16 × 8 samples, lr cosine to 0.1×) on workload ``w``;
    ``staleness`` None keeps the preset's max_staleness."""
    args = [sys.executable, "-m", "tokenflow.cli.main", "train", *([w.config] if w.config else []),
            "--run.output_dir", str(out), "--run.steps", str(steps), "--run.seed", str(seed),
            "--model.path", w.model, "--sampling.max_tokens", str(w.max_tokens), "--trainer.lr", str(w.lr),
            "--run.checkpoint_every", str(save_every), "--run.keep_checkpoints", "1000",
            "--metrics.progress", "false", "--metrics.sinks", '["jsonl"]',
            # The starting model is scored with `tokenflow eval` like every other point (and TRL
            # evaluates nothing in its window): in the run it would share the engine with step 1.
            "--run.baseline_eval", "false"]
    if staleness is not None:
        args += ["--rollout.max_staleness", str(staleness)]
    if eval_limit:
        args += ["--run.eval_limit", str(eval_limit)]
    t0 = time.perf_counter()
    _run(args, f"tokenflow train (seed {seed}, max_staleness {'preset' if staleness is None else staleness})")
    process_wall = time.perf_counter() - t0
    summary = json.loads((out / "summary.json").read_text())
    staleness = summary["max_staleness"]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss/total" in r]
    tokens = sum(r["rollout/count"] * r["rollout/completion_len_mean"] for r in rows)
    points = [{"step": 0, "wall_s": 0.0, "model": resolve_model(w.model)}]
    wall_at = {r["step"]: r["time/wall_s"] for r in rows}
    for ckpt in sorted((out / "checkpoints").glob("step_*")):
        step = int(ckpt.name.split("_")[1])
        if step in wall_at and step < steps:
            points.append({"step": step, "wall_s": wall_at[step], "model": str(ckpt / "model")})
    final = sorted((out / "checkpoints").glob("step_*"))[-1]
    points.append({"step": steps, "wall_s": summary["train_wall_s"], "model": str(final / "model")})
    return RunResult("tokenflow-" + ("sync" if staleness == 0 else "async"), seed, summary["steps"],
                     summary["train_wall_s"], process_wall, int(tokens), points,
                     {"run_dir": str(out), "own_final_accuracy": summary["final_accuracy"],
                      "trainer_idle_frac": summary["trainer_idle_frac"], "engine_idle_frac": summary["engine_idle_frac"],
                      "max_staleness": staleness})


def run_trl(python: Path, w: Workload, seed: int, steps: int, out: Path, *, save_every: int,
            threads: int, micro_batches: int = 1) -> RunResult:
    """TRL's GRPOTrainer (trl_side.py) in the TRL environment, on workload ``w``."""
    saves = ",".join(str(s) for s in range(save_every, steps, save_every)) if save_every else ""
    args = [str(python), str(Path(__file__).with_name("trl_side.py")), "--model", resolve_model(w.model),
            "--out", str(out), "--steps", str(steps), "--seed", str(seed), "--max-tokens", str(w.max_tokens),
            "--lr", str(w.lr), "--threads", str(threads), "--save-steps", saves,
            "--micro-batches", str(micro_batches),
            *(["--config", str(ROOT / w.config)] if w.config else [])]
    t0 = time.perf_counter()
    # Threads that wait sleep instead of spinning: with spinning, two torch threads on a shared
    # machine took 17 s per step against 2.6 s (load average 4).
    _run(args, f"TRL GRPOTrainer (seed {seed})", env_extra={"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")})
    process_wall = time.perf_counter() - t0
    res = json.loads((out / "result.json").read_text())
    points = [{"step": 0, "wall_s": 0.0, "model": resolve_model(w.model)}]
    points += [{"step": m["step"], "wall_s": m["wall_s"], "model": m["checkpoint"]} for m in res["marks"] if "checkpoint" in m]
    points.append({"step": steps, "wall_s": res["train_wall_s"], "model": str(out / "model")})
    return RunResult("trl", seed, res["steps"], res["train_wall_s"], process_wall, res["completion_tokens"], points,
                     {"versions": res["versions"], "threads": threads, "settings": res["settings"],
                      # TRL's batches hold the stream's prompts, in order (it must not shuffle)
                      "prompts_in_stream_order": res["step_prompts"] == stream_ids(steps, res["settings"]["prompts_per_step"])})


def stream_ids(steps: int, per_step: int) -> list[list[int]]:
    """The prompt ids tokenflow's steps train on: the training stream's positions, in order."""
    return [list(range(s * per_step, (s + 1) * per_step)) for s in range(steps)]


# ---- scoring --------------------------------------------------------------------------------------

def evaluate(model: str, w: Workload, limit: int | None, cache: dict) -> float:
    """Held-out greedy accuracy by `tokenflow eval` (the workload's task: the arithmetic task's
    held-out split, or the config's held-out file through its chat template)."""
    key = (model, w.max_tokens, limit, w.config)
    if key not in cache:
        args = [sys.executable, "-m", "tokenflow.cli.main", "eval", model, "--json",
                *(["--config", w.config] if w.config else []), "--sampling.max_tokens", str(w.max_tokens)]
        if limit:
            args += ["--limit", str(limit)]
        out = _run(args, f"tokenflow eval {model}").stdout
        cache[key] = json.loads(out.strip().splitlines()[-1])["accuracy"]
    return cache[key]
