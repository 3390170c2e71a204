"""Reward for examples/code_task: the model's function, run against the row's unit tests in the
sandbox; the reward is the fraction of tests passed.

The program is the completion's fenced code block, or its text when it defines a function. The
shipped tiny model knows only digits and ``+ = , >``, so for it the completion is *compiled* into
a function: each worked step ``7+5=12`` becomes ``assert 7+5 == 12`` (the model's arithmetic is
checked as it ran) and the text after ``>`` is the returned expression. A malformed completion
is a program that does not import: reward 0.

A program the sandbox had to stop (time, memory, file size, output, processes) raises
:class:`SandboxViolation`, so the scorer marks the sample failed with the reason, instead of
scoring a program that never finished; set ``violation_reward`` in a row to score it instead.
The reward also reports ``sandbox_contained`` (1 when the network and file-system containment
took effect), logged as ``reward/sandbox_contained_mean``.
"""

from __future__ import annotations

import json
import re
import secrets

from tokenflow.scoring.sandbox import Sandbox, SandboxLimits

_sandbox: Sandbox | None = None
_LIMITS = SandboxLimits(wall_s=5.0, cpu_s=2, memory_mb=512, file_mb=4, processes=16, output_bytes=64 << 10)
_FENCE = re.compile(r"```(?:python)?\n(.*?)```", re.S)

# Runs the tests in the sandbox. The nonce arrives on stdin before the model's code is imported,
# so the verdict line cannot be printed by the model's code without reading it first.
HARNESS = """import json, os, sys
sys.path.insert(0, os.getcwd())  # python -I leaves the script's folder off sys.path
nonce = sys.stdin.readline().strip()
tests = json.loads(sys.stdin.readline())
try:
    import solution
except BaseException as e:
    print(nonce, json.dumps({"passed": 0, "error": type(e).__name__}))
    raise SystemExit(0)
passed = 0
for test in tests:
    try:
        exec(test, vars(solution).copy())
        passed += 1
    except BaseException:
        pass
print(nonce, json.dumps({"passed": passed}))
"""


class SandboxViolation(RuntimeError):
    pass


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


def score(prompt: str, completion: str, example: dict) -> dict:
    tests = example["tests"]
    program = program_from_completion(completion, example.get("entry_point", "solve"))
    nonce = secrets.token_hex(8)
    box = sandbox()
    result = box.run(HARNESS, stdin=f"{nonce}\n{json.dumps(tests)}\n", files={"solution.py": program})
    contained = float(box.isolated)
    verdict = None
    for line in result.stdout.splitlines():
        if line.startswith(nonce + " "):
            verdict = json.loads(line[len(nonce) + 1:])
    if verdict is None or not result.ok:
        if "violation_reward" in example:
            return {"reward": float(example["violation_reward"]), "sandbox_contained": contained}
        raise SandboxViolation(f"sandbox stopped the program: {result.reason}")
    return {"reward": verdict["passed"] / len(tests), "sandbox_contained": contained}
