"""``task.name = "reasoning_gym"``: any procedural dataset of the reasoning-gym library, by name
(the ``envs`` extra: ``pip install "tokenflow-rl[envs]"``).

One dataset (``[task.options] dataset = "basic_arithmetic"`` with ``config = {...}``, the
dataset's own config keywords) or a weighted mixture (``datasets = {name = {weight = w,
config = {...}}, ...}``). The prompt is the dataset's question; the reward is the dataset's own
``score_answer`` on the answer extracted from the completion by ``options.answer``
(`ANSWER_RULES`), logged with the components ``format`` (an answer could be extracted) and
``correct`` (the score).

The stream is procedural and resume-exact: the prompt at index ``i`` is a pure function of
``(task.seed, i)``. reasoning-gym builds item ``j`` of a dataset from ``Random(seed + j)`` and
some datasets precompute ``size`` items when built, so the stream is cut into chunks of
``CHUNK`` items, each a dataset of its own whose seed is hashed from (task seed, stream,
dataset, chunk). A mixture picks the dataset of index ``i`` from a generator seeded with
``(task seed, i)``, so each dataset's share is its weight's. The held-out prompts come from a
stream of their own, and a training item whose question is held out is redrawn, so no held-out
question is ever trained on (the library's small problem spaces repeat questions across seeds).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import random
import re
from collections import OrderedDict
from functools import lru_cache

from tokenflow.errors import InputError
from tokenflow.tasks.base import Prompt

CHUNK = 1000
"""Items per generated dataset; a chunk is built when the stream first reaches it."""
MAX_REDRAWS = 64
"""Redraws of a training item whose question is held out before giving up (a problem space
that small cannot feed training; the error says so)."""
_CACHED_CHUNKS = 16


class ReasoningGymError(InputError):
    """Options reasoning-gym refuses: an unknown dataset, a config its dataset does not take."""


def _library():
    try:
        import reasoning_gym
    except ImportError:
        raise ReasoningGymError('task.name = "reasoning_gym" needs the reasoning-gym library: '
                                'pip install "tokenflow-rl[envs]"') from None
    return reasoning_gym


# ---- answer extraction ----------------------------------------------------------------------------
def _tags(text: str) -> str | None:
    """The last ``<answer>...</answer>``: reasoning-gym's own convention, what the default
    system prompt asks for."""
    found = re.findall(r"<answer>(.*?)</answer>", text, flags=re.DOTALL)
    return found[-1].strip() if found else None


def _last_line(text: str) -> str | None:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None


def _boxed(text: str) -> str | None:
    """The last ``\\boxed{...}``, braces inside it balanced."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j].strip()
    return None


def _whole(text: str) -> str | None:
    return text.strip() or None


def _last_number(text: str) -> str | None:
    """The last integer or decimal (sign included): for numeric datasets and models too small to
    follow a format (SmolLM2-135M never writes answer tags)."""
    found = re.findall(r"-?\d+(?:\.\d+)?", text)
    return found[-1] if found else None


ANSWER_RULES = {"tags": _tags, "last_line": _last_line, "boxed": _boxed, "whole": _whole,
                "last_number": _last_number}
"""``options.answer``: how the answer is read out of a completion. ``tags`` (default): the last
``<answer>...</answer>``; ``last_line``: the last non-empty line; ``boxed``: the last
``\\boxed{...}``; ``whole``: the whole completion, stripped; ``last_number``: the last number."""


def extract_answer(completion: str, rule: str = "tags") -> str | None:
    """The answer in ``completion`` by ``rule`` (`ANSWER_RULES`), or None when there is none."""
    return ANSWER_RULES[rule](completion)


# ---- scoring (in the scorer processes) ---------------------------------------------------------------
@lru_cache(maxsize=64)
def _scoring_dataset(name: str, config_json: str):
    # score_answer reads the entry (and at most the dataset's config), not the items: one item
    # is enough, and cheap for datasets that precompute theirs.
    return _library().create_dataset(name, **json.loads(config_json), seed=0, size=1)


def reasoning_gym_reward(prompt: str, completion: str, example: dict) -> dict[str, float]:
    """The dataset's ``score_answer`` on the extracted answer; components ``format`` (an answer
    was extracted) and ``correct`` (the score, which some datasets give partial credit in)."""
    answer = extract_answer(completion, example.get("answer_rule", "tags"))
    if answer is None:
        return {"reward": 0.0, "format": 0.0, "correct": 0.0}
    dataset = _scoring_dataset(example["dataset"], json.dumps(example["config"], sort_keys=True))
    score = float(dataset.score_answer(answer, example["entry"]) or 0.0)
    return {"reward": score, "format": 1.0, "correct": score}


# ---- the task -----------------------------------------------------------------------------------------
def _seed(*parts) -> int:
    """A 31-bit seed from ``parts`` (reasoning-gym adds the item index to it; some datasets seed
    numpy's legacy generator, which wants < 2**32)."""
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:4], "little") % 2**31


def _components(options: dict) -> list[tuple[str, dict, float]]:
    """(dataset, config, weight) of each dataset the options name."""
    if "dataset" in options:
        return [(options["dataset"], dict(options.get("config") or {}), 1.0)]
    return [(name, dict(spec.get("config") or {}), float(spec.get("weight", 1.0)))
            for name, spec in options["datasets"].items()]


def _check_components(components: list[tuple[str, dict, float]]) -> None:
    """Each dataset exists and takes its config (reasoning-gym's own validation included)."""
    rg = _library()
    from reasoning_gym.factory import DATASETS

    for name, config, _ in components:
        if name not in DATASETS:
            close = difflib.get_close_matches(name, list(DATASETS), n=3, cutoff=0.5)
            hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
            raise ReasoningGymError(
                f"task.options: reasoning-gym has no dataset {name!r}{hint}; it has {len(DATASETS)}, e.g. "
                f"{', '.join(sorted(DATASETS)[:8])}, ... (reasoning_gym.factory.DATASETS lists them)")
        try:
            rg.create_dataset(name, **config, seed=0, size=1)
        except TypeError as e:
            fields = sorted(f for f in DATASETS[name][1].__dataclass_fields__ if f not in ("seed", "size"))
            raise ReasoningGymError(f"task.options: the config of dataset {name!r} is refused ({e}); "
                                    f"it takes {', '.join(fields)}") from None
        except (AssertionError, ValueError) as e:
            raise ReasoningGymError(f"task.options: the config of dataset {name!r} is invalid "
                                    f"({e or 'its validate() failed'}); fix the values") from None


class ReasoningGymTask:
    """Prompts from reasoning-gym datasets, scored by their own scorers; see the module docstring."""

    reward_fn = staticmethod(reasoning_gym_reward)
    reward_spec = "tokenflow.tasks.reasoning_gym:reasoning_gym_reward"

    def __init__(self, options: dict, *, seed: int = 0, num_eval: int = 256, instruction: str | None = None) -> None:
        """``instruction``: text put before each question (the format instruction, for a model
        prompted without a chat template, hence without a system message)."""
        self.components = _components(options)
        _check_components(self.components)
        self.answer_rule = options.get("answer", "tags")
        self.seed, self.num_eval, self.instruction = seed, num_eval, instruction
        self.name = "reasoning_gym:" + "+".join(name for name, _, _ in self.components)
        total = sum(w for _, _, w in self.components)
        self._weights = [w / total for _, _, w in self.components]
        self._chunks: OrderedDict = OrderedDict()
        self._eval: list[Prompt] | None = None
        self._held_out: frozenset[str] | None = None

    def _chunk(self, stream: str, k: int, chunk: int):
        key = (stream, k, chunk)
        if key not in self._chunks:
            name, config, _ = self.components[k]
            self._chunks[key] = _library().create_dataset(
                name, **config, seed=_seed(self.seed, stream, name, chunk), size=CHUNK)
            if len(self._chunks) > _CACHED_CHUNKS:
                self._chunks.popitem(last=False)
        self._chunks.move_to_end(key)
        return self._chunks[key]

    def _item(self, stream: str, index: int) -> tuple[int, dict]:
        """(dataset number, reasoning-gym entry) at ``index`` of ``stream``: a pure function of
        (task seed, stream, index)."""
        k = 0
        if len(self.components) > 1:
            k = random.Random(f"{self.seed}/{stream}/{index}").choices(range(len(self.components)), self._weights)[0]
        chunk, j = divmod(index, CHUNK)
        return k, self._chunk(stream, k, chunk)[j]

    def _prompt(self, index: int, k: int, entry: dict) -> Prompt:
        name, config, _ = self.components[k]
        text = entry["question"] if not self.instruction else f"{self.instruction}\n\n{entry['question']}"
        return Prompt(id=index, text=text, example={"dataset": name, "config": config, "entry": entry,
                                                    "answer_rule": self.answer_rule})

    def eval_prompts(self) -> list[Prompt]:
        """``num_eval`` distinct questions from the held-out stream."""
        if self._eval is None:
            seen: set[str] = set()
            prompts: list[Prompt] = []
            i, budget = 0, 20 * self.num_eval + 1000
            while len(prompts) < self.num_eval:
                if i >= budget:
                    raise ReasoningGymError(
                        f"task.num_eval = {self.num_eval}, but {self.name} gave only {len(prompts)} distinct "
                        f"questions in {budget} draws; lower task.num_eval or widen the dataset's config")
                k, entry = self._item("eval", i)
                i += 1
                if entry["question"] not in seen:
                    seen.add(entry["question"])
                    prompts.append(self._prompt(len(prompts), k, entry))
            self._eval = prompts
        return self._eval

    def train_prompt(self, index: int) -> Prompt:
        held_out = self._held_out_questions()
        for redraw in range(MAX_REDRAWS):
            k, entry = self._item("train" if redraw == 0 else f"train-redraw{redraw}", index)
            if entry["question"] not in held_out:
                return self._prompt(index, k, entry)
        raise ReasoningGymError(f"{self.name}: {MAX_REDRAWS} draws for training prompt {index} were all held-out "
                                "questions; the config allows too few distinct problems: lower task.num_eval "
                                "or widen the dataset's config")

    def _held_out_questions(self) -> frozenset[str]:
        if self._held_out is None:
            self._held_out = frozenset(p.example["entry"]["question"] for p in self.eval_prompts())
        return self._held_out

    def num_train_prompts(self) -> int | None:
        return None


def from_config(cfg) -> ReasoningGymTask:
    """The registered factory (``task.name = "reasoning_gym"``). Without the chat template there
    is no system message, so the system prompt (the answer format) goes before each question."""
    instruction = None if cfg.chat_template else cfg.system_prompt
    return ReasoningGymTask(cfg.options, seed=cfg.seed, num_eval=cfg.num_eval, instruction=instruction)
