"""The test tree mirrors the code: ``tests/<package>/`` for ``src/tokenflow/<package>/``, the
runtime's tests in one folder per room (``tests/runtime/<room>/``; end-to-end runs of the whole
loop in ``tests/runtime/`` itself), a top-level module's tests at the top (``tests/test_buffer.py``
for ``tokenflow/buffer.py``). Shared helpers follow one habit: ``<topic>_testlib.py`` beside the
tests that use them, imported as ``tests.<folder>.<topic>_testlib``."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
RUNTIME = ROOT / "src" / "tokenflow" / "runtime"

# Not helpers: programs and data that something runs or loads by path, under their own names.
NOT_HELPERS = {
    # the sandbox attack programs and their in-sandbox driver (run by sandbox_testlib.py)
    "scoring/attack_syscalls.py", "scoring/attacks_privilege.py", "scoring/attacks_reach.py",
    "scoring/attacks_kernel.py",
    "scoring/sandbox_as_user.py", "scoring/sandbox_bait.py",
    "real_model/rewards.py",  # task.reward = "tests/real_model/rewards.py:answer_reward"
}


def test_shared_helpers_are_named_testlib():
    odd = sorted(str(p.relative_to(TESTS)) for p in TESTS.rglob("*.py")
                 if not p.name.startswith("test_") and p.name != "conftest.py"
                 and not p.name.endswith("_testlib.py") and "__pycache__" not in p.parts
                 and p.relative_to(TESTS).parts[:2] != ("plugins", "tokenflow_example_plugin")
                 and str(p.relative_to(TESTS)) not in NOT_HELPERS)
    assert odd == [], "name shared test helpers <topic>_testlib.py (or list a program or data file above)"


def test_runtime_test_folders_are_the_runtime_rooms():
    rooms = {p.name for p in RUNTIME.iterdir() if p.is_dir() and (p / "__init__.py").exists()} | {"launch"}
    folders = {p.name for p in (TESTS / "runtime").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders <= rooms, f"tests/runtime/ folders that are no runtime room: {sorted(folders - rooms)}"
