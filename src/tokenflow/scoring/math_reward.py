"""The built-in math reward, ``task.reward = "math_verify"``: the model's final answer against the
example's ``"answer"``, compared as mathematics by the `math-verify` library (the ``math`` extra:
``pip install "tokenflow-rl[math]"``).

Both texts are parsed by math-verify (``\\boxed{}``, LaTeX such as ``\\frac{1}{2}``, plain
numbers and expressions, thousands separators, percentages; markdown bold around a number is
read through) and compared by value. So ``1,000`` is 1000, ``\\frac{1}{2}`` is 0.5, and
"The answer is 1000.5" is not 1000. A percentage matches both its number and its fraction
(math-verify's rule): ``50%`` is correct for an answer of 50 and of 0.5.

The reward is 1.0 when correct and 0.0 otherwise; two components are logged beside it
(``reward/format_mean``, ``reward/correct_mean``): ``format``, whether an answer could be parsed
from the completion at all, and ``correct``.

Each parse and the comparison run under math-verify's own time bound (``PARSE_TIMEOUT_S``,
``VERIFY_TIMEOUT_S``; a SIGALRM, so only on a process's main thread, which is where the scorer
pool calls rewards): a completion that sends sympy into a long simplification is scored 0 on
time, and the worker goes on. Called from another thread, the library cannot set an alarm; the
call then runs unbounded and the caller's own bound applies (the scorer pool's
``runtime.score_timeout_s`` kills its worker).

The answer is read from the example's ``"answer"`` field (the dataset task's convention; a
number or a string). For another column, wrap it in a reward of your own::

    from tokenflow.scoring.math_reward import math_verify_reward

    def score(prompt, completion, example):
        return math_verify_reward(prompt, completion, {"answer": example["solution"]})
"""

from __future__ import annotations

import threading

ANSWER_FIELD = "answer"
PARSE_TIMEOUT_S = 2
"""Seconds math-verify may spend parsing one text (whole seconds: it sets an alarm)."""
VERIFY_TIMEOUT_S = 2
"""Seconds math-verify may spend on one comparison."""


def _library():
    try:
        import math_verify
    except ImportError:
        raise ImportError('task.reward = "math_verify" needs the math-verify library: '
                          'pip install "tokenflow-rl[math]"') from None
    return math_verify


def _bound(seconds: int) -> int | None:
    # math-verify's bound is a SIGALRM, which only the main thread may set.
    return seconds if threading.current_thread() is threading.main_thread() else None


def math_verify_reward(prompt: str, completion: str, example: dict) -> dict[str, float]:
    """1.0 when the completion's answer equals ``example["answer"]`` by value, else 0.0; with the
    components ``format`` (an answer was parsed) and ``correct``. See the module docstring."""
    mv = _library()
    if ANSWER_FIELD not in example:
        raise KeyError(f'the example has no "{ANSWER_FIELD}" field (it has {", ".join(sorted(example)) or "none"}); '
                       'task.reward = "math_verify" compares against it')
    gold = mv.parse(str(example[ANSWER_FIELD]), parsing_timeout=_bound(PARSE_TIMEOUT_S))
    if not gold:
        raise ValueError(f"the example's answer {example[ANSWER_FIELD]!r} cannot be parsed as mathematics")
    answer = mv.parse(completion, parsing_timeout=_bound(PARSE_TIMEOUT_S))
    correct = bool(answer) and mv.verify(gold, answer, timeout_seconds=_bound(VERIFY_TIMEOUT_S))
    return {"reward": float(correct), "format": float(bool(answer)), "correct": float(correct)}
