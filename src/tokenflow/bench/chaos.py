"""`tokenflow bench chaos`: kill a run at seeded random moments, resume it each time, check the result.

    tokenflow bench chaos --kills 20 --json

One run (the default task, small; or a given config) is started as `tokenflow train`, and SIGKILLed
again and again: the whole process tree, the engine alone, the trainer alone, or a scorer worker
alone, at a moment drawn from ``--seed`` (during start-up, or some way into a step). After a
single worker is killed, the run must stop by itself within ``runtime.worker_timeout_s``, naming
that worker and giving a resume command; after every kill, that command (``--resume``) is run.
A kill counts only once it has landed (a run that finished first is not killed): the run is then
extended (``--run.steps`` raised) and the bench keeps killing until ``--kills`` have landed, however
fast the machine. Once they have, the last resume runs to the end, and the reference run (never
killed) is run to the same final step. Then:

    prompts lost / repeated      prompts.jsonl + the summary's in-flight ids: exactly 0..max, once each
    metric rows duplicated       one training row and at most one evaluation row per step
    checkpoints                  every checkpoint verifies against its manifest; no staging folder left
    /dev/shm left                entries named after either run (segments and semaphores)
    final weights                against a run with the same config that was never killed

Both runs are synchronous (``rollout.max_staleness = 0``) with one thread per worker: the same
seeded computation, the same tokens. The weights are not bit-equal: the engine's log-probs round
differently with a different batch composition, about one float32 ulp (1.2e-7 at |w| ≈ 1); the
check allows the issue's 1e-6. Exit status 0 when every check holds.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from tokenflow.bench.chaos_procs import TOLERANCE, alive, children, start_train, steps_done, wait_until

log = logging.getLogger(__name__)

# The chaos run's folder is the bench's own, made from the user's config: resuming it runs the
# code that config names (a reward file) as the first run did (docs/robustness.md).
TRUSTED = ["--trust-run-config"]

KINDS = ("tree", "engine", "trainer", "scorer")
# The default task, small: a kill lands every few seconds of progress.
SMALL = ["--rollout.prompts_per_step", "4", "--rollout.group_size", "4", "--run.eval_limit", "8",
         "--sampling.max_tokens", "64", "--metrics.sinks", '["jsonl"]', "--trainer.lr", "3e-4"]


def register(subparsers) -> None:
    p = subparsers.add_parser("chaos", help="SIGKILL a run at random moments, resume it, check nothing was lost")
    p.add_argument("config", nargs="?", help="TOML config (default: the embedded arithmetic run, made small)")
    p.add_argument("--kills", type=int, default=8, help="how many SIGKILLs (default 8)")
    p.add_argument("--seed", type=int, default=0, help="seed of the kill schedule (what, and when)")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"what to kill, among {','.join(KINDS)}")
    p.add_argument("--steps", type=int, default=None, help="run.steps (default: 2 × kills + 6)")
    p.add_argument("--worker-timeout", type=float, default=60.0,
                   help="runtime.worker_timeout_s: how long a run may take to stop after a worker dies")
    p.add_argument("--heal", action="store_true",
                   help="kill trainer, engines and scorers of ONE run, which must heal itself and finish without a "
                        "resume (runtime.max_worker_restarts; bench/chaos_heal.py)")
    p.add_argument("--at-checkpoint", action="store_true",
                   help="--heal: trainer kills strike while a checkpoint is being taken (saved or written in the "
                        "background), a checkpoint every 2 steps")
    p.add_argument("--ref-seeds", type=int, default=3,
                   help="--heal: unkilled runs (seeds 0..N-1) whose final accuracies bound the healed run's")
    p.add_argument("--output-dir", help="where the two run folders go (default runs/bench-chaos-<time>)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run, _allow_overrides=True)


# ---- processes ----------------------------------------------------------------------------------------
def _workers(proc: subprocess.Popen, run_dir: Path) -> dict[str, int] | None:
    """This invocation's processes by role (None until it has written workers.json)."""
    try:
        w = json.loads((run_dir / "workers.json").read_text())
    except (OSError, ValueError):
        return None
    if w.get("orchestrator") != proc.pid:
        return None  # still the previous invocation's file
    # Scorer workers from /proc: pebble replaces one that a timeout killed, and workers.json
    # only knows the first ones.
    roles = {k: v for k, v in w.items() if not k.startswith("scorer")}
    scorers = [p for p in children(proc.pid) if p not in roles.values()]
    return {**roles, **{f"scorer{i}": p for i, p in enumerate(scorers)}}


# ---- one kill ----------------------------------------------------------------------------------------
def _one_kill(kind: str, rng: random.Random, args: list[str], run_dir: Path, log_path: Path, steps: int,
              worker_timeout: float) -> dict:
    proc = start_train(args, log_path)
    rec = {"kind": kind, "killed": False}
    workers: dict = {}

    def ready() -> bool:
        nonlocal workers
        workers = _workers(proc, run_dir) or {}
        return bool(workers) and (kind != "scorer" or any(k.startswith("scorer") for k in workers))

    if not wait_until(ready, 600, proc):
        return {**rec, **_ended_by_itself(proc, log_path)}
    if rng.random() < 0.25:  # during start-up: models loading, the baseline evaluation
        rec["moment"] = "start-up"
        wait_until(lambda: False, rng.uniform(0.0, 3.0), proc)
    else:  # some way into a step: generating, scoring, training, syncing or checkpointing
        # A worker killed after the last training step may not be needed any more (the run can
        # end without it), so kills aim at least two steps before the end; a whole tree too,
        # since the end of a run (final evaluation, checkpoint, exit) takes about a second now.
        target = min(steps_done(run_dir) + rng.choice((1, 1, 2)), steps - 2)
        rec["moment"] = f"step {target}+"
        wait_until(lambda: steps_done(run_dir) >= target, 900, proc)
        wait_until(lambda: False, rng.uniform(0.0, 1.5), proc)
    if proc.poll() is not None or (kind != "tree" and steps_done(run_dir) >= steps):
        return {**rec, **_ended_by_itself(proc, log_path)}  # too late for this kill: not counted
    rec["step_at_kill"] = steps_done(run_dir)
    pids = dict(workers, **(_workers(proc, run_dir) or {}))
    if kind == "tree":
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        rec["killed"] = True
    else:
        target_pid = pids["scorer0"] if kind == "scorer" else pids[kind]
        os.kill(target_pid, signal.SIGKILL)
        rec["killed"] = True
        t0 = time.monotonic()
        try:
            proc.wait(timeout=worker_timeout)
            rec["exit_s"] = round(time.monotonic() - t0, 2)
        except subprocess.TimeoutExpired:
            rec["hang"] = True
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        tail = log_path.read_text(errors="replace")[-4000:]
        rec["named"] = f"the {kind}" in tail and "died" in tail
        rec["resume_advised"] = f"tokenflow train --resume {run_dir}" in tail
        rec["exit_code"] = proc.returncode
    # Workers notice an orphaned state within about a second; anything left after that lingers.
    time.sleep(3.0)
    left = [p for p in pids.values() if p != proc.pid and alive(p)]
    rec["stragglers"] = len(left)
    for p in left:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return rec


def _ended_by_itself(proc: subprocess.Popen, log_path: Path) -> dict:
    code = proc.wait()
    out = {"ended_by_itself": code}
    if code != 0:
        out["error"] = log_path.read_text(errors="replace")[-2000:]
    return out


# ---- the bench ---------------------------------------------------------------------------------------
def _config(args, overrides: list[str]):
    from tokenflow.config.loading import load_config
    from tokenflow.config.root import TrainConfig
    from tokenflow.config.presets import default_config_path

    steps = args.steps or 2 * args.kills + 6  # a kill lands every one or two steps of progress
    base = [] if args.config else list(SMALL)
    forced = ["--rollout.max_staleness", "0", "--metrics.progress", "false", "--run.steps", str(steps),
              "--runtime.worker_timeout_s", str(args.worker_timeout)]
    if args.heal:
        from tokenflow.bench.chaos_heal import forced as heal_forced

        forced += heal_forced(args, overrides)
    else:  # each kill stops the run, and a resume continues it
        forced += ["--runtime.max_worker_restarts", "0"]
        if not any(o.startswith("--run.checkpoint_every") for o in overrides):
            forced += ["--run.checkpoint_every", "1"]
    return load_config(TrainConfig, args.config or default_config_path(), [*base, *overrides, *forced])


def run(args, overrides: list[str] | None = None) -> int:
    from tokenflow.bench import chaos_checks as checks
    from tokenflow.config.loading import ConfigError, to_toml

    try:
        cfg = _config(args, overrides or [])
    except ConfigError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    kinds = [k for k in args.kinds.split(",") if k]
    if not kinds or any(k not in KINDS for k in kinds):
        print(f"error: --kinds takes a comma-separated subset of {','.join(KINDS)}", file=sys.stderr)
        return 2
    out = Path(args.output_dir or f"runs/bench-chaos-{time.strftime('%Y%m%d-%H%M%S')}")
    if out.exists() and any(out.iterdir()):
        print(f"error: {out} exists; choose another --output-dir", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.toml").write_text(to_toml(cfg))
    if args.heal:
        from tokenflow.bench import chaos_heal

        result = chaos_heal.run(args, out / "config.toml", out)
        if args.json:
            print(json.dumps(result, default=str))
        else:
            chaos_heal.print_table(result)
        return 0 if result["ok"] else 1
    steps, t_start = cfg.run.steps, time.monotonic()
    ref, chaos, chaos_log = out / "reference", out / "chaos", out / "chaos.log"

    rng = random.Random(args.seed)
    schedule = [kinds[i % len(kinds)] for i in range(args.kills)]
    rng.shuffle(schedule)
    records, steps, failed = _kill_until_landed(schedule, rng, out, chaos, chaos_log, steps, args)
    finished = False
    if not failed:
        log.info("bench chaos: final resume → %s (%d steps)", chaos, steps)
        finished = start_train(["--resume", str(chaos), *TRUSTED, "--run.steps", str(steps)], chaos_log).wait() == 0
    log.info("bench chaos: reference run (never killed, %d steps) → %s", steps, ref)
    proc = start_train([str(out / "config.toml"), "--output-dir", str(ref), "--run.steps", str(steps)],
                  out / "reference.log")
    if proc.wait() != 0:
        print(f"error: the reference run failed; see {out / 'reference.log'}", file=sys.stderr)
        return 1
    result = _checks(checks, out, ref, chaos, records, steps, args, finished)
    result["wall_s"] = round(time.monotonic() - t_start, 1)
    (out / "chaos.json").write_text(json.dumps({**result, "kills_detail": records}, indent=2))
    if args.json:
        print(json.dumps(result))
    else:
        _print_table(result)
    return 0 if result["ok"] else 1


def _kill_until_landed(schedule: list[str], rng: random.Random, out: Path, chaos: Path, chaos_log: Path,
                       steps: int, args) -> tuple[list[dict], int, bool]:
    """Kill the chaos run until every kill of ``schedule`` has landed: (records, final steps, failed).

    A kill that comes too late (the run finished first, as on a fast machine) does not count;
    the run is extended by enough steps for the kills left, and resumed. A run that fails by
    itself (exit != 0 without a kill) ends the attempt: the checks report it."""
    records, landed = [], 0
    for _ in range(4 * len(schedule)):  # a bound, never reached while kills keep landing
        if landed == len(schedule):
            break
        kind = schedule[landed]
        first = not chaos.exists()
        cmd = [str(out / "config.toml"), "--output-dir", str(chaos)] if first else ["--resume", str(chaos), *TRUSTED]
        rec = _one_kill(kind, rng, [*cmd, "--run.steps", str(steps)], chaos, chaos_log, steps, args.worker_timeout)
        records.append(rec)
        if rec["killed"]:
            landed += 1
        elif rec.get("ended_by_itself") == 0:
            steps += max(4, 2 * (len(schedule) - landed))
            rec["extended_to"] = steps
        else:
            log.warning("bench chaos: the run failed by itself: %s", rec)
            return records, steps, True
        log.info("bench chaos: %s (%d of %d kills landed)", rec, landed, len(schedule))
    return records, steps, False


def _checks(checks, out: Path, ref: Path, chaos: Path, records: list[dict], steps: int, args, finished: bool) -> dict:
    from tokenflow.runtime.run.run_dir import RunDir

    killed = [r for r in records if r["killed"]]
    singles = [r for r in killed if r["kind"] != "tree"]
    result = {
        "kills": len(killed), "kills_requested": args.kills, "seed": args.seed, "steps": steps,
        "kill_attempts": len(records), "extensions": sum("extended_to" in r for r in records),
        "kills_by_kind": {k: sum(r["kind"] == k for r in killed) for k in KINDS},
        "hangs": sum(bool(r.get("hang")) for r in singles),
        "max_exit_s": max((r.get("exit_s", 0.0) for r in singles), default=0.0),
        "worker_timeout_s": args.worker_timeout,
        "unnamed_deaths": sum(not r.get("named") for r in singles),
        "no_resume_advice": sum(not r.get("resume_advised") for r in singles),
        "stragglers": sum(r.get("stragglers", 0) for r in killed),
        "unexpected_exits": sum(1 for r in records if r.get("ended_by_itself") not in (None, 0)),
        "completed": finished,
    }
    if finished:
        result.update(checks.prompt_accounting(chaos))
        result.update(checks.metric_rows(chaos, steps))
        result.update(checks.checkpoints(chaos))
        a, b = RunDir(ref).latest_checkpoint(), RunDir(chaos).latest_checkpoint()
        result["weights_max_abs_diff"] = checks.weights_diff(a, b) if a and b else float("inf")
        result["weights_match"] = result["weights_max_abs_diff"] <= TOLERANCE
    result["shm_left"] = len(checks.shm_left(ref, chaos))
    result["ok"] = bool(
        finished and result["kills"] == args.kills and result["hangs"] == 0 and result["unnamed_deaths"] == 0
        and result["no_resume_advice"] == 0 and result["stragglers"] == 0 and result["unexpected_exits"] == 0
        and result["prompts_lost"] == 0 and result["prompts_repeated"] == 0
        and result["ledger_steps_missing"] == 0 and result["ledger_steps_repeated"] == 0
        and result["metric_rows_duplicated"] == 0 and result["metric_steps_missing"] == 0
        and result["checkpoints_bad"] == 0 and result["staging_left"] == 0
        and result["shm_left"] == 0 and result["weights_match"])
    result["output_dir"] = str(out)
    return result


def _print_table(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"bench chaos: {r['kills']} kills (seed {r['seed']}), {r['steps']} steps, "
                    f"{r['wall_s']:.0f} s", show_header=True)
    t.add_column("check")
    t.add_column("value", justify="right")
    t.add_column("goal", justify="right")
    by_kind = ", ".join(f"{k} {n}" for k, n in r["kills_by_kind"].items())
    rows = [("kills", f"{r['kills']} ({by_kind})", str(r["kills_requested"])),
            ("run stopped by itself after a worker died, slowest", f"{r['max_exit_s']:.1f} s",
             f"< {r['worker_timeout_s']:g} s"),
            ("hangs", r["hangs"], 0), ("deaths not named / no resume command",
                                       f"{r['unnamed_deaths']} / {r['no_resume_advice']}", "0 / 0"),
            ("worker processes left behind", r["stragglers"], 0),
            ("completed after the last resume", r["completed"], True)]
    if r["completed"]:
        rows += [("prompts lost", r["prompts_lost"], 0), ("prompts repeated", r["prompts_repeated"], 0),
                 ("metric rows duplicated", r["metric_rows_duplicated"], 0),
                 ("steps missing (ledger / metrics)", f"{r['ledger_steps_missing']} / {r['metric_steps_missing']}", "0 / 0"),
                 ("checkpoints that fail their manifest", f"{r['checkpoints_bad']} of {r['checkpoints']}", 0),
                 ("final weights vs never-killed run, max |Δ|", f"{r['weights_max_abs_diff']:.3g}", f"≤ {TOLERANCE:g}")]
    rows.append(("/dev/shm entries left", r["shm_left"], 0))
    for name, value, goal in rows:
        t.add_row(name, str(value), str(goal))
    console = Console()
    console.print(t)
    console.print("all checks hold" if r["ok"] else "SOME CHECKS FAILED", style="bold")
