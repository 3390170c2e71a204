"""Reward for examples/code_task: the model's function against the row's unit tests; the reward
is the fraction of tests passed.

The tests run here, in the scorer, not next to the model's code: a test such as
``assert solve(3) == 7`` is executed with ``solve`` standing for the model's function in the
sandbox. Each call it makes is sent to worker.py, which runs there with the model's
``solution.py`` and returns what the function returned, as plain values (values.py). So the
verdict is computed where the model's code cannot reach: printing a forged verdict, exiting 0
before the tests, returning an object equal to everything or patching the harness's builtins
changes nothing but the values its functions are seen to return. (A test whose calls depend on
earlier results takes another round in the sandbox, up to ``ROUNDS``.) Tests therefore call the
solution's functions with plain values and compare what comes back; a name a test reads that is
not a builtin stands for a function of the solution.

The program is the completion's fenced code block, or its text when it defines a function. The
shipped tiny model knows only digits and ``+ = , >``, so for it the completion is *compiled* into
a function: each worked step ``7+5=12`` becomes ``assert 7+5 == 12`` (the model's arithmetic is
checked as it ran) and the text after ``>`` is the returned expression. A malformed completion
is a program that does not import: reward 0.

A program the sandbox had to stop (time, memory, file size, output, processes) raises
:class:`SandboxViolation`, so the scorer marks the sample failed with the reason, instead of
scoring a program that never finished; set ``violation_reward`` in a row to score it instead.
The reward also reports ``sandbox_contained`` (1 when every containment layer took effect),
logged as ``reward/sandbox_contained_mean``.
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import json
import re
from pathlib import Path

from tokenflow.scoring.sandbox import Sandbox, SandboxLimits

_HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("code_task_values", _HERE / "values.py")
values = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(values)
WORKER = (_HERE / "worker.py").read_text()
VALUES_SOURCE = (_HERE / "values.py").read_text()

_sandbox: Sandbox | None = None
_LIMITS = SandboxLimits(wall_s=5.0, cpu_s=2, memory_mb=512, file_mb=4, processes=16, output_bytes=64 << 10,
                        workdir_mb=16, workdir_files=256)
_FENCE = re.compile(r"```(?:python)?\n(.*?)```", re.S)
ROUNDS = 3


class SandboxViolation(RuntimeError):
    pass


class _Pending(Exception):
    """A test called the model's function with arguments not yet sent to the sandbox."""


def sandbox() -> Sandbox:
    global _sandbox
    if _sandbox is None:  # one probe per scorer process
        _sandbox = Sandbox(_LIMITS)
    return _sandbox


def program_from_completion(completion: str, entry_point: str) -> str:
    fenced = _FENCE.search(completion)
    if fenced:
        return fenced.group(1)
    if "def " in completion:
        return completion
    steps, _, answer = completion.rpartition(">")
    lines = [f"def {entry_point}():"]
    for step in filter(None, steps.split(",")):
        lhs, _, rhs = step.partition("=")
        lines.append(f"    assert {lhs} == {rhs}")
    lines.append(f"    return {answer.strip()}")
    return "\n".join(lines) + "\n"


class _Remote:
    """Stands for the model's function ``name`` inside a test: answers from the sandbox's
    results, or records the call for the next round."""

    def __init__(self, name: str, answers: dict, wanted: dict) -> None:
        self.name, self.answers, self.wanted = name, answers, wanted

    def __call__(self, *args, **kwargs):
        key = json.dumps([self.name, values.encode(args), values.encode(kwargs)])
        if key not in self.answers:
            self.wanted[key] = None
            raise _Pending(key)
        answer = self.answers[key]
        if "raise" in answer:
            kind = getattr(builtins, str(answer["raise"]), None)
            is_error = isinstance(kind, type) and issubclass(kind, Exception)
            raise (kind if is_error else RuntimeError)(f"the solution raised {answer['raise']}")
        return values.decode(answer["value"])


def _free_names(test: str) -> set[str]:
    """Names a test reads that are neither builtins nor its own: the model's functions."""
    tree = ast.parse(test)
    assigned = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return {name for name in read - assigned if not hasattr(builtins, name)}


def _run_tests(tests: list[str], answers: dict, wanted: dict) -> tuple[int, bool]:
    """(tests passed, whether some test still waits for calls)."""
    passed, pending = 0, False
    for test in tests:
        scope = {name: _Remote(name, answers, wanted) for name in _free_names(test)}
        try:
            exec(compile(test, "<test>", "exec"), scope)  # the row's own test, on plain values
            passed += 1
        except _Pending:
            pending = True
        except Exception:  # noqa: BLE001 - a failing assertion or error fails the test
            pass
    return passed, pending


def _ask(box: Sandbox, program: str, calls: list[str], answers: dict) -> bool:
    """Run the wanted calls in the sandbox; False when the solution did not import."""
    request = [json.loads(key) for key in calls]
    result = box.run(WORKER, stdin=json.dumps(request) + "\n",
                     files={"solution.py": program, "values.py": VALUES_SOURCE})
    if not result.ok:
        raise SandboxViolation(f"sandbox stopped the program: {result.reason}")
    reply = {}
    for line in result.stdout.splitlines():
        if line.startswith("RESULTS "):
            try:
                reply = json.loads(line[len("RESULTS "):])
            except ValueError:
                reply = {}
    if "import_error" in reply:
        return False
    got = reply.get("results") if isinstance(reply.get("results"), list) else []
    for key, answer in zip(calls, got + [None] * (len(calls) - len(got))):
        # no answer (the program left early, or replied in a shape of its own): the call failed
        answers[key] = answer if isinstance(answer, dict) and ("value" in answer or "raise" in answer) \
            else {"raise": "RuntimeError"}
    return True


def score(prompt: str, completion: str, example: dict) -> dict:
    tests = example["tests"]
    program = program_from_completion(completion, example.get("entry_point", "solve"))
    box = sandbox()
    contained = float(box.isolated)
    answers: dict = {}
    try:
        for _ in range(ROUNDS):
            wanted: dict = {}
            passed, pending = _run_tests(tests, answers, wanted)
            if not pending or not _ask(box, program, list(wanted), answers):
                break
        else:
            passed, _ = _run_tests(tests, answers, {})
    except SandboxViolation:
        if "violation_reward" in example:
            return {"reward": float(example["violation_reward"]), "sandbox_contained": contained}
        raise
    return {"reward": passed / len(tests), "sandbox_contained": contained}
