#!/usr/bin/env python
"""Mutation testing of tokenflow's core modules, one module at a time (docs/mutation.md).

    pip install -e ".[test,mutation]"
    python scripts/mutation.py                 # every module in pyproject's [tool.tokenflow.mutation.modules]
    python scripts/mutation.py overlong layout  # some of them
    python scripts/mutation.py --list          # the modules and their tests

Each module runs in its own folder, ``.mutation/<module>/`` (git-ignored), holding links to
``src/``, ``tests/`` and ``examples/`` and a pyproject.toml whose ``[tool.mutmut]`` mutates only
that module and runs only the fast tests listed for it (``-m "not slow"``). mutmut copies the
sources into ``mutants/`` there, runs the tests once to learn which test executes which function,
then runs, for every mutant, the tests that executed the mutated function (a fork per mutant:
torch and the tests are imported once). Results stay in that folder and mutmut reuses what still
applies (it retries mutants whose code or tests changed); delete ``.mutation/<module>`` to start
again. mutmut's live progress goes to ``.mutation/<module>/run.log``.

It writes ``.mutation/report.md``: per module, mutants killed / survived / timed out / not
run by any listed test / equivalent (pyproject's [tool.tokenflow.mutation.equivalent], each with
its reason), the kill rate of the non-equivalent ones, and the diff of every mutant not killed. Not run in CI; on a
shared 2-core machine a small module takes a few minutes, all of them well under an hour.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / ".mutation"
LINKED = ("src", "tests", "examples")
# mutmut's statuses (mutmut 3.8: `mutmut results --all true`), and which count as killed.
KILLED = {"killed", "caught by type check"}
TIMEOUT = {"timeout"}
SURVIVED = {"survived"}
NO_TESTS = {"no tests"}


def load_modules() -> tuple[dict, dict]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return data["tool"]["tokenflow"]["mutation"]["modules"], data


def load_equivalent(data: dict) -> dict[str, str]:
    """Mutants that behave exactly as the original (no test can kill them), each with the reason:
    pyproject's [tool.tokenflow.mutation.equivalent]. mutmut numbers a function's mutants in
    order, so an edit of that function can renumber them: the report flags a listed name that
    now survives for a reason other than the one given, by its diff."""
    return data["tool"]["tokenflow"]["mutation"].get("equivalent", {})


def module_pyproject(data: dict, entry: dict) -> str:
    """The repository's pyproject.toml with [tool.mutmut] narrowed to one module and its tests."""
    import tomli_w

    source = entry["source"]
    only = [f"{source}/*"] if (ROOT / source).is_dir() else [source]
    tests = [t for t in entry["tests"] if (ROOT / t).exists()]
    if not tests:
        raise SystemExit(f"none of the tests listed for {source} exist: {entry['tests']}")
    tool = {k: v for k, v in data["tool"].items() if k != "tokenflow"}  # the equivalents are the runner's
    tool["mutmut"] = {**tool["mutmut"], "only_mutate": only, "pytest_add_cli_args_test_selection": tests}
    return tomli_w.dumps({**data, "tool": tool})


def prepare(name: str, entry: dict, data: dict) -> Path:
    folder = WORK / name
    folder.mkdir(parents=True, exist_ok=True)
    for sub in LINKED:
        link = folder / sub
        if not link.is_symlink():
            if link.exists():
                shutil.rmtree(link)
            link.symlink_to(ROOT / sub, target_is_directory=True)
    # mutmut fingerprints its own config: other sources or tests reset its results, and new test
    # functions get their stats collected; a kept result is re-tested only when named (`survivors`).
    (folder / "pyproject.toml").write_text(module_pyproject(data, entry))
    return folder


def mutmut_env() -> dict[str, str]:
    # mutmut puts mutants/src first on the path itself; a PYTHONPATH to the sources would not hurt
    # (it removes it) but is dropped to be plain about where the code comes from.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MUTANT_UNDER_TEST")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def run_mutmut(folder: Path, *args: str, capture: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mutmut", *args], cwd=folder, env=mutmut_env(), text=True,
                          capture_output=capture)


def results(folder: Path) -> dict[str, str]:
    out = run_mutmut(folder, "results", "--all", "true", capture=True)
    if out.returncode != 0:
        raise SystemExit(f"mutmut results failed in {folder}:\n{out.stderr[-2000:]}")
    found = {}
    for line in out.stdout.splitlines():
        m = re.match(r"\s+(\S+): (.+)$", line)
        if m:
            found[m.group(1)] = m.group(2).strip()
    return found


def survivors(folder: Path) -> list[str]:
    """Mutants not killed so far (survived or run by no test): the ones to try again."""
    return sorted(m for m, s in results(folder).items() if s in SURVIVED | NO_TESTS)


# `mutmut show NAME` for many names in one interpreter (a process per name costs seconds each).
_DIFFS = """
import json, sys
from mutmut.mutation.diff_apply import find_mutant, get_diff_for_mutant
out = {}
for name in json.loads(sys.stdin.read()):
    try:
        out[name] = get_diff_for_mutant(name, path=find_mutant(name).path).strip()
    except Exception as e:  # noqa: BLE001  (reported in place of the diff)
        out[name] = f"(no diff: {type(e).__name__}: {e})"
print(json.dumps(out))
"""


def diffs(folder: Path, mutants: list[str]) -> dict[str, str]:
    if not mutants:
        return {}
    out = subprocess.run([sys.executable, "-c", _DIFFS], cwd=folder, env=mutmut_env(), text=True,
                         input=json.dumps(mutants), capture_output=True)
    if out.returncode != 0:
        return {m: f"(no diff: {out.stderr[-300:]})" for m in mutants}
    return json.loads(out.stdout.splitlines()[-1])


def summarize(name: str, entry: dict, folder: Path, seconds: float | None,
              equivalent: dict[str, str]) -> tuple[str, dict]:
    status = results(folder)
    count = lambda kinds: sum(1 for s in status.values() if s in kinds)  # noqa: E731
    killed, timeout, no_tests = count(KILLED), count(TIMEOUT), count(NO_TESTS)
    equiv = {m for m, s in status.items() if s in SURVIVED and m in equivalent}
    survived = count(SURVIVED) - len(equiv)
    other = len(status) - killed - timeout - survived - len(equiv) - no_tests
    killable = killed + timeout + survived + no_tests  # a mutant no test runs is not killed either
    rate = (killed + timeout) / killable if killable else float("nan")
    figures = {"module": name, "source": entry["source"], "mutants": len(status), "killed": killed,
               "timeout": timeout, "survived": survived, "equivalent": len(equiv), "no_tests": no_tests,
               "other": other, "kill_rate": rate, "seconds": seconds}
    lines = [f"## {name}: `{entry['source']}`", "",
             f"tests: {', '.join(f'`{t}`' for t in entry['tests'])}", "",
             f"{len(status)} mutants: {killed} killed, {timeout} timed out (counted killed), {survived} survived, "
             f"{len(equiv)} equivalent (listed in pyproject), {no_tests} not run by any listed test, {other} other; "
             f"kill rate {rate:.1%} of the non-equivalent ones"
             + (f"; {seconds / 60:.1f} min" if seconds is not None else ""), ""]
    shown = sorted(m for m, s in status.items() if s not in KILLED | TIMEOUT)
    text = diffs(folder, shown)
    for mutant in shown:
        label = f"equivalent: {equivalent[mutant]}" if mutant in equiv else status[mutant]
        lines += [f"### `{mutant}`: {label}", "", "```diff", text.get(mutant, "(no diff)"), "```", ""]
    return "\n".join(lines), figures


def main(argv: list[str] | None = None) -> int:
    modules, data = load_modules()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("modules", nargs="*", help=f"of {', '.join(modules)} (default: all)")
    p.add_argument("--list", action="store_true", help="print the modules and their tests, run nothing")
    p.add_argument("--max-children", type=int, default=2, help="mutants tested at once (default 2)")
    p.add_argument("--report-only", action="store_true", help="write the report from the results already there")
    args = p.parse_args(argv)
    unknown = [m for m in args.modules if m not in modules]
    if unknown:
        p.error(f"unknown module(s) {unknown}; known: {', '.join(modules)}")
    chosen = args.modules or list(modules)
    if args.list:
        for name in chosen:
            print(f"{name:>10}: {modules[name]['source']}  <-  {' '.join(modules[name]['tests'])}")
        return 0
    try:
        import mutmut  # noqa: F401
    except ImportError:
        print('error: mutation testing needs mutmut: pip install -e ".[mutation]"', file=sys.stderr)
        return 2
    equivalent = load_equivalent(data)
    sections, table = [], []
    for name in chosen:
        modules, data = load_modules()  # read again: an edit made while earlier modules ran applies
        equivalent = load_equivalent(data)
        folder = prepare(name, modules[name], data)
        seconds = None
        if not args.report_only:
            print(f"== {name}: mutmut in {folder.relative_to(ROOT)}", flush=True)
            start = time.monotonic()
            log = folder / "run.log"
            with open(log, "w") as out:  # mutmut's live progress, kept out of this output
                run = subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", str(args.max_children)],
                                     cwd=folder, env=mutmut_env(), stdout=out, stderr=subprocess.STDOUT, text=True)
                # mutmut keeps a verdict until its function changes; a test added to kill a survivor
                # is only tried on the survivors named again.
                again = [m for m in survivors(folder) if m not in equivalent] if run.returncode == 0 else []
                if again:
                    run = subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children",
                                          str(args.max_children), *again],
                                         cwd=folder, env=mutmut_env(), stdout=out, stderr=subprocess.STDOUT, text=True)
            seconds = time.monotonic() - start
            if run.returncode != 0:
                print(f"mutmut run failed for {name} (exit {run.returncode}); see {log.relative_to(ROOT)}",
                      file=sys.stderr)
                return 1
        text, figures = summarize(name, modules[name], folder, seconds, equivalent)
        sections.append(text)
        table.append(figures)
    head = ["# Mutation report", "",
            "| module | mutants | killed | timeout | survived | equivalent | no tests | kill rate | minutes |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    head += [f"| {f['module']} | {f['mutants']} | {f['killed']} | {f['timeout']} | {f['survived']} | "
             f"{f['equivalent']} | {f['no_tests']} | {f['kill_rate']:.1%} | "
             f"{'-' if f['seconds'] is None else round(f['seconds'] / 60, 1)} |" for f in table]
    WORK.mkdir(exist_ok=True)
    report = WORK / "report.md"
    report.write_text("\n".join(head) + "\n\n" + "\n".join(sections) + "\n")
    print("\n".join(head))
    print(f"\nreport: {report.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
