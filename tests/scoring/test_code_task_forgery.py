"""The code task's verdict cannot be forged by the code it judges (issue 26): the model's
solution may read anything in its own process and print anything, yet its reward stays what
its return values earn. Every row here has a test that fails whatever ``solve`` does
(``assert False``), so an honest solution scores at most 1/3."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.scoring import sandbox_testlib as kit

ROOT = Path(__file__).parents[2]
pytestmark = [pytest.mark.exclusive, pytest.mark.timeout(60)]  # kit.Leftovers sees the whole machine
ROW = {"entry_point": "solve", "tests": ["assert solve() == 1", "assert solve() != 1", "assert False"]}
HONEST_MAX = 1 / 3

FORGERIES = {
    # the security review's: read the harness's nonce from __main__, print a passing verdict
    "nonce_from_main": "import __main__, json, os\n"
                       "print(__main__.nonce, json.dumps({'passed': len(__main__.tests)}), flush=True)\n"
                       "os._exit(0)\n",
    # the nonce from the harness's stdin, read before the harness does
    "nonce_from_stdin": "import sys, json, os\nnonce = sys.stdin.readline().strip()\n"
                        "print(nonce, json.dumps({'passed': 3}), flush=True)\nos._exit(0)\n",
    # exit 0 before any test runs
    "exit_at_import": "import os\nos._exit(0)\n",
    # an answer equal (and unequal) to everything
    "equal_to_everything": "class Any:\n    __eq__ = lambda self, other: True\n"
                           "    __ne__ = lambda self, other: True\n    __hash__ = object.__hash__\n"
                           "def solve():\n    return Any()\n",
    # rewrite the builtins the harness uses, so that no test runs and none fails
    "patch_builtins": "import builtins\nbuiltins.exec = lambda *a, **k: None\n"
                      "def solve():\n    return 1\n",
    # print a result line of its own in whatever format the harness uses
    "fake_result_lines": "import sys, json\nfor line in sys.stdin:\n    pass\n"
                         "print(json.dumps({'passed': 3}))\ndef solve():\n    return 1\n",
}


@pytest.fixture(scope="module")
def reward():
    spec = importlib.util.spec_from_file_location("code_task_reward", ROOT / "examples/code_task/reward.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_honest_solution_scores_one_third(reward):
    assert reward.score("", "```python\ndef solve():\n    return 1\n```", ROW)["reward"] == pytest.approx(HONEST_MAX)


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_a_forged_verdict_earns_nothing(reward, name):
    before = kit.Leftovers()
    completion = f"```python\n{FORGERIES[name]}```"
    try:
        got = reward.score("", completion, dict(ROW, violation_reward=0.0))["reward"]
    except reward.SandboxViolation:
        got = None  # the sample is failed: no reward either
    assert got is None or got <= HONEST_MAX + 1e-9, f"{name} forged a reward of {got}"
    assert not before.after(None)
