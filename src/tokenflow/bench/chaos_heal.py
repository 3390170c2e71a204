"""`tokenflow bench chaos --heal`: SIGKILL the trainer, the engines and the scorers of ONE run again
and again; the run must heal itself (``runtime.max_worker_restarts``) and finish without a resume.

    tokenflow bench chaos --heal --kills 20 --json

The run (the default task, small, synchronous: ``rollout.max_staleness = 0``) is started once.
Each kill waits for the run to have recovered from the one before (a step finished after it),
then a random moment (0-1.5 s), then SIGKILLs the kind drawn from ``--seed``; with
``--at-checkpoint`` a trainer kill waits instead for a checkpoint being taken (its staging folder
exists: the trainer is saving or writing it in the background) and strikes then; it has landed when
the victim was alive, died, and the run still had steps to go. A machine fast enough to finish
the run before every kill has landed gets the whole run again, longer (steps × 1.5 × kills ÷
landed, up to three attempts, each in ``chaos<N>/``; the unkilled runs get the final length).
Then the run must end by itself with exit status 0, and:

    prompts lost / repeated     prompts.jsonl + the summary's in-flight ids: exactly 0..max, once each
    metric rows duplicated      one training row and at most one evaluation row per step
    checkpoints                 every checkpoint verifies; no staging folder left; /dev/shm empty
    accuracy                    final held-out accuracy within [min, max] of ``--ref-seeds`` unkilled runs
    weights                     against the unkilled run of the same seed (≤ 1e-6: a healed trainer
                                replays the same batches, a healed engine regenerates the same tokens)
    time lost per kill          from the kill to the first step finished after the replacement was
                                up (heal.jsonl), less the unkilled run's median step time; the
                                median over kills, and the whole run's extra time per kill

It writes ``chaos.json`` (every kill, and the run's ``heal.jsonl``) to its output folder and
exits 0 only when every check holds.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import statistics
import time
from pathlib import Path

from tokenflow.bench import chaos_checks as checks
from tokenflow.bench.chaos_procs import TOLERANCE, alive, children, start_train, steps_done, wait_until

log = logging.getLogger(__name__)

KINDS = ("trainer", "engine", "scorer")
MAX_ATTEMPTS = 3
EXTRA = ["--run.eval_limit", "32", "--runtime.restart_window_s", "0"]


def forced(args, overrides: list[str]) -> list[str]:
    """What --heal sets on top of the bench's config: enough steps for every kill to land on a
    running step, enough restarts for every kill, a checkpoint every 4 steps (so a new trainer
    replays up to 3)."""
    out = [*EXTRA, "--runtime.max_worker_restarts", str(args.kills + 1),
           "--run.steps", str(args.steps or 3 * args.kills + 10)]
    if not any(o.startswith("--run.checkpoint_every") for o in overrides):
        out += ["--run.checkpoint_every", "2" if args.at_checkpoint else "4"]
    return out


def _checkpoint_in_progress(run_dir: Path) -> bool:
    try:
        return any(p.name.startswith(".tmp-step_") for p in (run_dir / "checkpoints").iterdir())
    except OSError:
        return False


def _wait_for_checkpoint(run_dir: Path, proc, timeout: float) -> bool:
    """Poll (every millisecond: a tiny model's write is short) until a checkpoint is being taken."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if _checkpoint_in_progress(run_dir):
            return True
        time.sleep(0.001)
    return False


def _pid(kind: str, run_dir: Path, orchestrator: int) -> int | None:
    try:
        w = json.loads((run_dir / "workers.json").read_text())
    except (OSError, ValueError):
        return None
    if w.get("orchestrator") != orchestrator:
        return None
    if kind == "scorer":  # pebble may have replaced one itself: ask /proc
        roles = {p for name, p in w.items() if not name.startswith("scorer")}
        live = [p for p in children(orchestrator) if p not in roles]
        return live[0] if live else None
    pid = next((p for name, p in sorted(w.items()) if name.startswith(kind)), None)  # engine, engine0, ...
    return pid if pid and alive(pid) else None


def _kill_all(schedule: list[str], rng: random.Random, proc, run_dir: Path, steps: int, timeout: float,
              at_checkpoint: bool = False) -> list[dict]:
    records = []
    for kind in schedule:
        rec = {"kind": kind, "landed": False}
        records.append(rec)
        if not wait_until(lambda: _pid(kind, run_dir, proc.pid) is not None, timeout, proc):
            rec["why"] = "no live worker to kill"
            break
        wait = rng.uniform(0.0, 1.5)  # drawn either way: the schedule's other draws stay as they were
        if kind == "trainer" and at_checkpoint:
            _wait_for_checkpoint(run_dir, proc, timeout)
        else:
            wait_until(lambda: False, wait, proc)  # a random moment of a step
        pid, step = _pid(kind, run_dir, proc.pid), steps_done(run_dir)
        if pid is None or proc.poll() is not None or step >= steps - 2:
            rec["why"] = "the run was (nearly) done"
            break
        seen, t_kill = len(_read_heal(run_dir)), time.monotonic()
        os.kill(pid, signal.SIGKILL)
        rec.update(pid=pid, step_at_kill=step)
        if kind == "trainer" and at_checkpoint:  # still being taken once the trainer is dead: struck inside it
            rec["at_checkpoint"] = _checkpoint_in_progress(run_dir)
        dead = wait_until(lambda: not alive(pid), 10, proc) or not alive(pid)
        # Recovered: the replacement is up (its heal.jsonl row) and a step finished after that.
        event = "replaced" if kind == "scorer" else "ready"
        rec["healed"] = wait_until(lambda: any(r["worker"].startswith(kind) and r["event"] == event
                                          for r in _read_heal(run_dir)[seen:]), min(timeout, 60.0), proc)
        up = steps_done(run_dir)
        recovered = wait_until(lambda: steps_done(run_dir) > max(step, up), timeout, proc)
        rec["recovery_s"] = round(time.monotonic() - t_kill, 2)
        rec["landed"] = bool(dead and recovered)
        log.info("bench chaos --heal: %s", rec)
        if not rec["landed"]:
            break
    return records


def _step_times(run_dir: Path) -> list[float]:
    from tokenflow.metrics.sinks import read_jsonl

    return [r["time/step_s"] for r in read_jsonl(run_dir / "metrics.jsonl") if "time/step_s" in r]


def _final_accuracy(run_dir: Path) -> float | None:
    try:
        return json.loads((run_dir / "summary.json").read_text()).get("final_accuracy")
    except (OSError, ValueError):
        return None


def run(args, cfg_path: Path, out: Path) -> dict:
    """The healing bench on the config written to ``cfg_path``; returns the result."""
    from tokenflow.config.loading import load_config
    from tokenflow.config.root import TrainConfig
    from tokenflow.runtime.run.run_dir import RunDir

    steps = load_config(TrainConfig, cfg_path).run.steps
    t_start = time.monotonic()
    rng = random.Random(args.seed)
    kinds = [k for k in KINDS if k in args.kinds.split(",")] or list(KINDS)
    schedule = [kinds[i % len(kinds)] for i in range(args.kills)]
    rng.shuffle(schedule)
    too_short = []
    for attempt in range(1, MAX_ATTEMPTS + 1):
        # A fast machine can finish the run before every kill has landed: then the whole run is
        # done again, longer (the unkilled references get the same number of steps).
        chaos, chaos_log = out / f"chaos{'' if attempt == 1 else attempt}", out / f"chaos{'' if attempt == 1 else attempt}.log"
        proc = start_train([str(cfg_path), "--output-dir", str(chaos), "--run.steps", str(steps)], chaos_log)
        t0 = time.monotonic()
        records = _kill_all(list(schedule), rng, proc, chaos, steps, args.worker_timeout * 4, args.at_checkpoint)
        try:
            code = proc.wait(timeout=1800)
        except Exception:  # noqa: BLE001 - a run that does not end is a failed check, and is ended here
            os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait()
        chaos_wall = time.monotonic() - t0
        n = sum(r["landed"] for r in records)
        if n == args.kills or not records or records[-1].get("why") != "the run was (nearly) done" \
                or attempt == MAX_ATTEMPTS:
            break
        longer = int(steps * 1.5 * args.kills / max(n, 1)) + 10
        log.warning("bench chaos --heal: the run ended after %d of %d kills; again with %d steps", n, args.kills, longer)
        too_short.append({"dir": str(chaos), "steps": steps, "kills_landed": n, "exit_code": code})
        steps = longer
    refs = []
    for seed in range(args.ref_seeds):
        ref = out / f"reference-seed{seed}"
        log.info("bench chaos --heal: unkilled run, seed %d → %s", seed, ref)
        t1 = time.monotonic()
        p = start_train([str(cfg_path), "--output-dir", str(ref), "--run.seed", str(seed), "--run.steps", str(steps)],
                        out / f"reference-seed{seed}.log")
        refs.append({"seed": seed, "exit": p.wait(), "wall_s": round(time.monotonic() - t1, 1),
                     "final_accuracy": _final_accuracy(ref), "dir": ref})
    landed = [r for r in records if r["landed"]]
    result = {
        "kills": len(landed), "kills_requested": args.kills, "seed": args.seed, "steps": steps,
        "kills_by_kind": {k: sum(r["kind"] == k for r in landed) for k in KINDS},
        "kills_at_checkpoint": sum(bool(r.get("at_checkpoint")) for r in landed),
        "finished_by_itself": code == 0, "exit_code": code, "resumes": 0, "attempts": attempt,
        "too_short_attempts": too_short,
    }
    heal_rows = _read_heal(chaos)
    result["replacements"] = sum(r["event"] == "replaced" for r in heal_rows)
    if code == 0:
        result.update(checks.prompt_accounting(chaos))
        result.update(checks.metric_rows(chaos, steps))
        result.update(checks.checkpoints(chaos))
    result["shm_left"] = len(checks.shm_left(chaos, *[r["dir"] for r in refs]))
    result["stragglers"] = _stragglers(chaos, heal_rows, records)
    ref_acc = [r["final_accuracy"] for r in refs if r["exit"] == 0 and r["final_accuracy"] is not None]
    acc = _final_accuracy(chaos)
    result.update(final_accuracy=acc, reference_accuracies=ref_acc,
                  accuracy_within_spread=bool(acc is not None and len(ref_acc) == args.ref_seeds
                                              and min(ref_acc) <= acc <= max(ref_acc)))
    same_seed = next((r for r in refs if r["seed"] == 0 and r["exit"] == 0), None)
    a = RunDir(same_seed["dir"]).latest_checkpoint() if same_seed else None
    b = RunDir(chaos).latest_checkpoint() if code == 0 else None
    result["weights_max_abs_diff"] = checks.weights_diff(a, b) if a and b else float("inf")
    step_median = statistics.median(_step_times(same_seed["dir"])) if same_seed else 0.0
    lost = [max(0.0, r["recovery_s"] - step_median) for r in landed]
    result.update(
        reference_step_s_median=round(step_median, 3),
        lost_s_per_kill_median=round(statistics.median(lost), 2) if lost else None,
        lost_s_per_kill_median_by_kind={k: round(statistics.median(v), 2) for k in KINDS
                                        if (v := [max(0.0, r["recovery_s"] - step_median)
                                                  for r in landed if r["kind"] == k])},
        trainer_restart_s_median=_trainer_restart_median(heal_rows),
        checkpoint_every=load_config(TrainConfig, cfg_path).run.checkpoint_every,
        chaos_wall_s=round(chaos_wall, 1), reference_wall_s=same_seed["wall_s"] if same_seed else None,
        extra_wall_s_per_kill=round((chaos_wall - same_seed["wall_s"]) / len(landed), 2)
        if same_seed and landed else None)
    result["ok"] = bool(
        result["kills"] == args.kills and code == 0 and result["prompts_lost"] == 0
        and result["prompts_repeated"] == 0 and result["ledger_steps_missing"] == 0
        and result["ledger_steps_repeated"] == 0 and result["metric_rows_duplicated"] == 0
        and result["metric_steps_missing"] == 0 and result["checkpoints_bad"] == 0
        and result["staging_left"] == 0 and result["shm_left"] == 0 and result["stragglers"] == 0
        and result["accuracy_within_spread"] and result["weights_max_abs_diff"] <= TOLERANCE
        and (not args.at_checkpoint or result["kills_at_checkpoint"] >= min(5, result["kills_by_kind"]["trainer"]))
    ) if code == 0 else False
    result["wall_s"] = round(time.monotonic() - t_start, 1)
    result["output_dir"] = str(out)
    (out / "chaos.json").write_text(json.dumps({**result, "kills_detail": records, "heal": heal_rows},
                                               indent=2, default=str))
    return result


def _read_heal(run_dir: Path) -> list[dict]:
    """The run's ``heal.jsonl`` (a line still being written is left for the next read)."""
    try:
        lines = (run_dir / "heal.jsonl").read_text().splitlines()
    except OSError:
        return []
    rows = []
    for line in lines:
        try:
            rows.append(json.loads(line))
        except ValueError:
            break
    return rows


def _trainer_restart_median(rows: list[dict]) -> float | None:
    """Seconds from a trainer's replacement being started to its replay being sent (it is up)."""
    spans, started = [], None
    for r in rows:
        if r["worker"] == "trainer" and r["event"] == "replaced":
            started = r["time"]
        elif r["worker"] == "trainer" and r["event"] == "ready" and started is not None:
            spans.append(r["time"] - started)
            started = None
    return round(statistics.median(spans), 2) if spans else None


def _stragglers(run_dir: Path, heal_rows: list[dict], records: list[dict]) -> int:
    """Processes of the run still alive after it exited (every pid it ever had)."""
    pids = {r["pid"] for r in [*heal_rows, *records] if r.get("pid")}
    try:
        pids |= set(json.loads((run_dir / "workers.json").read_text()).values())
    except (OSError, ValueError):
        pass
    time.sleep(2.0)
    left = [p for p in pids if alive(p)]
    for p in left:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(left)


def print_table(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"bench chaos --heal: {r['kills']} kills (seed {r['seed']}), {r['steps']} steps, "
                    f"{r['wall_s']:.0f} s", show_header=True)
    for col, justify in (("check", "left"), ("value", "right"), ("goal", "right")):
        t.add_column(col, justify=justify)
    by_kind = ", ".join(f"{k} {n}" for k, n in r["kills_by_kind"].items())
    rows = [("kills landed", f"{r['kills']} ({by_kind})", str(r["kills_requested"])),
            ("finished by itself, no resume", r["finished_by_itself"], True)]
    if r["kills_at_checkpoint"]:
        rows.append(("trainer kills inside a checkpoint", r["kills_at_checkpoint"], "≥ 5"))
    if r["finished_by_itself"]:
        rows += [("prompts lost / repeated", f"{r['prompts_lost']} / {r['prompts_repeated']}", "0 / 0"),
                 ("metric rows duplicated", r["metric_rows_duplicated"], 0),
                 ("checkpoints that fail their manifest", r["checkpoints_bad"], 0),
                 ("final accuracy vs unkilled seeds", f"{r['final_accuracy']} in {r['reference_accuracies']}",
                  "within"),
                 ("final weights vs unkilled run, max |Δ|", f"{r['weights_max_abs_diff']:.3g}", f"≤ {TOLERANCE:g}")]
    rows += [("time lost per kill, median", f"{r['lost_s_per_kill_median']} s", ""),
             ("trainer restart, median", f"{r['trainer_restart_s_median']} s", ""),
             ("/dev/shm left / processes left", f"{r['shm_left']} / {r['stragglers']}", "0 / 0")]
    for name, value, goal in rows:
        t.add_row(name, str(value), str(goal))
    console = Console()
    console.print(t)
    console.print("all checks hold" if r["ok"] else "SOME CHECKS FAILED", style="bold")
