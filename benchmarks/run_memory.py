"""The peak memory of a whole command and every process it starts, counted as a laptop feels it.

    python benchmarks/run_memory.py [--every 0.5] [--json FILE] [--timeline FILE] -- tokenflow train examples/laptop_math/config.toml

Runs the command and, every ``--every`` seconds until it exits, sums the proportional set size
(PSS, ``/proc/PID/smaps_rollup``) over the command and all its descendants: memory shared between
processes (a fork server's pages, one file mapped twice) counts once, split between them, so the
sum is what the run takes from the machine. Prints the peak of that sum, when it happened, each
process's own peak PSS (named by its command line), and the wall time; exits with the command's
exit status. ``--timeline`` also writes every sample as a JSON line (seconds, the sum, each
process's PSS by pid), to see which process grows when. Linux only (it reads ``/proc``).

It is a script here rather than a ``tokenflow bench`` subcommand because it times any command,
including tokenflow runs from older checkouts (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def _children() -> dict[int, list[int]]:
    """Each process's children, from ``/proc/*/stat`` (field 4 is the parent's pid)."""
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # gone between listdir and open
        # the command name (field 2) may hold spaces and parentheses: split after its last ')'
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(name))
    return kids


def _tree(root: int) -> list[int]:
    kids, out, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


def _pss_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None  # exited, or not ours to read
    return None


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
        text = " ".join(a.decode(errors="replace") for a in args if a)
    except OSError:
        return str(pid)
    return f"{pid} {text[:100]}"


def watch(cmd: list[str], every: float, timeline=None) -> dict:
    start = time.monotonic()
    proc = subprocess.Popen(cmd)
    peak_kb, peak_at = 0, 0.0
    peaks: dict[int, int] = {}  # pid -> its own peak PSS (kB)
    names: dict[int, str] = {}  # pid -> command line, read once
    while True:
        done = proc.poll() is not None
        total, sample = 0, {}
        for pid in _tree(proc.pid):
            kb = _pss_kb(pid)
            if kb is None:
                continue
            total += kb
            sample[pid] = kb
            if pid not in names:
                names[pid] = _name(pid)
            peaks[pid] = max(peaks.get(pid, 0), kb)
        if timeline is not None:
            timeline.write(json.dumps({"t": round(time.monotonic() - start, 1), "gb": round(total / 2**20, 3),
                                       "pss_gb": {str(pid): round(kb / 2**20, 3) for pid, kb in sample.items()}}) + "\n")
            timeline.flush()
        if total > peak_kb:
            peak_kb, peak_at = total, time.monotonic() - start
        if done:
            break
        time.sleep(every)
    return {
        "returncode": proc.returncode,
        "wall_s": round(time.monotonic() - start, 1),
        "peak_pss_gb": round(peak_kb / 2**20, 3),
        "peak_at_s": round(peak_at, 1),
        "process_peaks_gb": {names[pid]: round(kb / 2**20, 3)
                             for pid, kb in sorted(peaks.items(), key=lambda kv: -kv[1])},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--every", type=float, default=0.5, help="seconds between samples (default 0.5)")
    p.add_argument("--json", help="also write the figures to this file")
    p.add_argument("--timeline", help="also write every sample to this file, a JSON line each")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="the command, after --")
    args = p.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        p.error("give the command to watch after --, e.g. -- tokenflow train CONFIG")
    if not os.path.exists("/proc/self/smaps_rollup"):
        p.error("this needs Linux's /proc/PID/smaps_rollup")
    timeline = open(args.timeline, "w") if args.timeline else None
    try:
        out = watch(cmd, args.every, timeline)
    finally:
        if timeline is not None:
            timeline.close()
    print(f"peak memory of the whole run: {out['peak_pss_gb']:.2f} GB (sum of PSS over "
          f"{len(out['process_peaks_gb'])} processes, at {out['peak_at_s']:.0f} s of "
          f"{out['wall_s']:.0f} s)", file=sys.stderr)
    for name, gb in list(out["process_peaks_gb"].items())[:8]:
        print(f"  {gb:6.2f} GB  {name}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out["returncode"]


if __name__ == "__main__":
    sys.exit(main())
