"""The code task's tests run in the scorer against the model's functions in the sandbox: calls
with arguments, several functions, exceptions, results fed into later calls (another round),
containers and the values that cannot cross (objects of the model's own)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
pytestmark = pytest.mark.timeout(60)

SOLUTION = '''
def add(a, b):
    return a + b
def pair(x):
    return (x, [x, {"k": {x}}])
def fail(x):
    raise ValueError(x)
class Box:
    pass
def box():
    return Box()
'''


@pytest.fixture(scope="module")
def reward():
    spec = importlib.util.spec_from_file_location("code_task_reward_calls", ROOT / "examples/code_task/reward.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("test, passes", [
    ("assert add(2, 3) == 5", True),
    ("assert add(a=2, b=3) == 5 and add('x', 'y') == 'xy'", True),
    ("assert add(2, 3) == 6", False),
    ("assert pair(4) == (4, [4, {'k': {4}}])", True),
    ("assert isinstance(pair(1), tuple)", True),
    ("assert all(add(i, i) == 2 * i for i in range(3))", True),
    ("assert add(add(1, 2), add(3, 4)) == 10", True),  # dependent calls: a second round
    ("try:\n    fail(1)\nexcept ValueError:\n    pass\nelse:\n    assert False", True),
    ("assert box() == box()", False),  # the model's objects do not cross the boundary
    ("assert nothing_here() == 1", False),
])
@pytest.mark.slow
def test_a_test_passes_exactly_when_its_assertions_hold(reward, test, passes):
    got = reward.score("", f"```python\n{SOLUTION}```", {"tests": [test]})["reward"]
    assert got == (1.0 if passes else 0.0)


def test_a_solution_that_does_not_import_scores_zero(reward):
    assert reward.score("", "```python\nimport no_such_module\n```", {"tests": ["assert solve() == 1"]})["reward"] == 0.0
