"""Property-based: every malformed input (config keys, types, ranges, conflicts, TOML, files,
reward modules, datasets, model folders) ends `tokenflow train` with one line naming the problem
and the fix, exit status 2, no traceback.

Cases go through the real entry point, ``tokenflow.cli.main.main``, in this process (fast); a few
go through a subprocess as well. The run itself is replaced by a tripwire: an input the checks
let through would start training, and that counts as a failure. The figures (cases tried,
passed, every distinct message) are printed and written to ``fuzz_messages.txt`` in the test's
tmp dir.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import typing
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

import tokenflow.runtime.launch as launch
from tokenflow.cli.main import main
from tokenflow.config.loading import to_toml
from tokenflow.config.root import TrainConfig

EXAMPLES = 400
# What a message must contain besides the problem: a way out (a key to set, a file to fix, a
# valid choice, a suggestion). Messages are read by people; this only checks one is offered.
FIX_WORDS = re.compile(r"\b(set|use|fix|check|give|add|remove|save|point|choose|did you mean|valid keys|"
                       r"should be|needs?|must|raise|lower|turn|unset|drop|name|write|wait|stop)\b", re.I)


def leaf_fields(model: type[BaseModel], prefix: str = ""):
    for name, f in model.model_fields.items():
        ann = f.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from leaf_fields(ann, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", ann, f.metadata


FIELDS = [f for f in leaf_fields(TrainConfig) if f[0] not in ("engine.version",)]
SECTIONS = sorted(TrainConfig.model_fields)
BOUNDED = [(k, a, m) for k, a, m in FIELDS if m]
LITERALS = [(k, typing.get_args(a)) for k, a, _ in FIELDS if typing.get_origin(a) is typing.Literal]


def _base(ann):
    args = [a for a in typing.get_args(ann) if a is not type(None)]
    return args[0] if typing.get_origin(ann) in (typing.Union, getattr(__import__("types"), "UnionType", None)) and args else ann


def wrong_value(ann) -> str:
    """A TOML value of the wrong type for a field annotated ``ann``."""
    base = _base(ann)
    if base is bool:
        return '"maybe"'
    if base in (int, float):
        return '"many"'
    if base is str:
        return "[1, 2]"
    if typing.get_origin(base) in (list, tuple):
        return "3"
    if base is dict or typing.get_origin(base) is dict:  # free-form tables (engine.vllm_options)
        return "3"
    return "{x = 1}"


def out_of_range(ann, meta) -> str:
    base = _base(ann)
    c = meta[0]
    for attr, shift in (("ge", -1), ("gt", 0), ("le", 1), ("lt", 0)):
        bound = getattr(c, attr, None)
        if bound is not None:
            v = bound + shift
            return str(int(v)) if base is int else repr(float(v))
    raise AssertionError(meta)


CONFLICTS = [
    ["--algorithm.clip_low", "0.5", "--algorithm.clip_high", "0.2"],
    ["--algorithm.advantage", "dr_grpo", "--algorithm.scale_std", "true"],
    ["--algorithm.is_mask_low", "2.0", "--algorithm.is_mask_high", "1.5"],
    ["--algorithm.behaviour_logprobs", "false", "--algorithm.tis_cap", "2.0"],
    ["--algorithm.kl_in_reward", "true", "--algorithm.kl_coef", "0"],
    ["--algorithm.kl_in_reward", "true", "--algorithm.kl_coef", "0.1", "--algorithm.advantage", "grpo"],
    ["--algorithm.value_clip", "0.2", "--algorithm.advantage", "grpo"],
    ["--trainer.rollouts_per_step", "7"],
    ["--sync.every", "3", "--rollout.max_staleness", "0"],
    ["--task.name", "dataset"],
    ["--task.name", "dataset", "--task.train_path", "x.jsonl"],
]

BROKEN_TOML = ["steps = ", "[run", "x = 'unterminated", "= 3", "steps = 1 2", "[run]\nsteps = 1\nsteps = 2",
               "a = [1, 2", "b = {c = }", "[[run]]\n[run]", "k = 0x", "d = 1979-13-45"]

# ---- cases: each is (kind, build) where build(dir) -> argv -------------------------------------------

ident = st.from_regex(r"[a-z][a-z_]{2,12}", fullmatch=True)




def _config_case(kind, argv):
    return kind, lambda d: list(argv)


def config_cases():
    fields = st.sampled_from(FIELDS)
    unknown = st.tuples(st.sampled_from(SECTIONS), ident).filter(
        lambda t: t[1] not in TrainConfig.model_fields[t[0]].annotation.model_fields).map(
        lambda t: _config_case("unknown key", [f"--{t[0]}.{t[1]}", "1"]))
    unknown_top = ident.filter(lambda k: k not in TrainConfig.model_fields).map(
        lambda k: _config_case("unknown section", [f"--{k}.value", "1"]))
    wrong_type = fields.map(lambda f: _config_case("wrong type", [f"--{f[0]}", wrong_value(f[1])]))
    out_range = st.sampled_from(BOUNDED).map(lambda f: _config_case("out of range", [f"--{f[0]}", out_of_range(f[1], f[2])]))
    bad_choice = st.tuples(st.sampled_from(LITERALS), ident).filter(lambda t: t[1] not in t[0][1]).map(
        lambda t: _config_case("not a choice", [f"--{t[0][0]}", t[1]]))
    conflict = st.sampled_from(CONFLICTS).map(lambda a: _config_case("conflicting values", a))
    return [unknown, unknown_top, wrong_type, out_range, bad_choice, conflict]


def _toml_case(kind, content: bytes):
    def build(d: Path):
        (d / "run.toml").write_bytes(content)
        return [str(d / "run.toml")]
    return kind, build


def toml_cases():
    base = to_toml(TrainConfig()).splitlines()
    broken = st.tuples(st.integers(0, len(base)), st.sampled_from(BROKEN_TOML)).map(
        lambda t: _toml_case("broken TOML", "\n".join(base[:t[0]] + [t[1]] + base[t[0]:]).encode()))
    not_utf8 = st.binary(min_size=1, max_size=20).map(lambda b: _toml_case("config not UTF-8", b"[run]\n\xff\xfe" + b))
    missing = ident.map(lambda n: ("missing config file", lambda d: [str(d / f"{n}.toml")]))
    wrong_value_in_file = st.sampled_from(FIELDS).map(lambda f: _toml_case(
        "wrong type in file", f"[{f[0].split('.')[0]}]\n{f[0].split('.', 1)[1]} = {wrong_value(f[1])}\n".encode()))
    return [broken, not_utf8, missing, wrong_value_in_file]


GOOD_ROWS = [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(10)]
REWARD_OK = "def reward(prompt, completion, example):\n    return float(completion.strip() == example.get('answer'))\n"
BAD_MODULES = {
    "syntax error": "def reward(prompt, completion, example)\n    return 1.0\n",
    "import fails": "import no_such_module_for_tokenflow_fuzz\n",
    "raises at import": "raise RuntimeError('configured wrong')\n",
    "not a function (int)": "reward = 3\n",
    "not a function (str)": "reward = 'reward'\n",
    "a class": "class reward:\n    pass\n",
    "missing function": "def rewards(prompt, completion, example):\n    return 1.0\n",
    "one parameter": "def reward(prompt):\n    return 1.0\n",
    "four parameters": "def reward(prompt, completion, example, extra):\n    return 1.0\n",
    "returns a string": "def reward(prompt, completion, example):\n    return '1.0'\n",
    "returns None": "def reward(prompt, completion, example):\n    return None\n",
    "dict without reward": "def reward(prompt, completion, example):\n    return {'score': 1.0}\n",
    "dict with a string": "def reward(prompt, completion, example):\n    return {'reward': 1.0, 'len': 'long'}\n",
}


def _dataset_argv(d: Path, data: Path, reward_spec: str | None = None):
    if reward_spec is None:
        (d / "ok_reward.py").write_text(REWARD_OK)
        reward_spec = f"{d / 'ok_reward.py'}:reward"
    return ["--task.name", "dataset", "--task.train_path", str(data), "--task.reward", reward_spec]


def reward_cases():
    def module_case(item):
        kind, source = item

        def build(d: Path):
            (d / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in GOOD_ROWS))
            f = d / f"r_{uuid.uuid4().hex[:8]}.py"
            f.write_text(source)
            return _dataset_argv(d, d / "data.jsonl", f"{f}:reward")
        return f"reward: {kind}", build

    def spec_case(spec):
        def build(d: Path):
            (d / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in GOOD_ROWS))
            return _dataset_argv(d, d / "data.jsonl", spec(d))
        return "reward: bad spec", build

    specs = st.sampled_from([lambda d: "no_colon_here", lambda d: "no_such_pkg_tokenflow_fuzz:reward",
                             lambda d: f"{d / 'absent.py'}:reward", lambda d: "json:no_such_function",
                             lambda d: "json:JSONDecoder"])
    return [st.just(module_case(item)) for item in sorted(BAD_MODULES.items())] + [specs.map(spec_case)]


def dataset_cases():
    rows = st.lists(st.sampled_from(GOOD_ROWS), min_size=3, max_size=12)

    def write(kind, maker, name="data.jsonl"):
        def build(d: Path):
            (d / name).write_bytes(maker())
            return _dataset_argv(d, d / name)
        return f"dataset: {kind}", build

    def lines(rs):
        return [json.dumps(r).encode() for r in rs]

    def insert(rs, i, bad: bytes):
        ls = lines(rs)
        ls.insert(min(i, len(ls)), bad)
        return b"\n".join(ls) + b"\n"

    bad_line = st.sampled_from([b'{"prompt": "1+1=", }', b"{prompt: 1}", b'{"prompt": "2+2="', b"not json", b"[1, 2"])
    return [
        st.just(write("empty", lambda: b"")),
        st.just(write("blank lines only", lambda: b"\n\n  \n")),
        rows.map(lambda rs: write("lacks the prompt field",
                                  lambda: b"\n".join(json.dumps({"question": r["prompt"]}).encode() for r in rs) + b"\n")),
        st.tuples(rows, st.integers(0, 12), st.sampled_from([b'{"prompt": 12}', b'{"prompt": ""}', b'{"prompt": null}',
                                                           b"[1, 2]", b'"text"'])).map(
            lambda t: write("bad row in the middle", lambda: insert(t[0], t[1], t[2]))),
        st.tuples(rows, st.integers(0, 12), bad_line).map(
            lambda t: write("malformed JSON in the middle", lambda: insert(t[0], t[1], t[2]))),
        st.tuples(rows, st.integers(0, 12), st.binary(min_size=1, max_size=4)).map(
            lambda t: write("not UTF-8", lambda: insert(t[0], t[1], b'{"prompt": "\xff' + t[2] + b'"}'))),
        st.tuples(rows, st.integers(0, 12), st.text("abcxyz?!é", min_size=1, max_size=5)).map(
            lambda t: write("characters outside the vocabulary",
                            lambda: insert(t[0], t[1], json.dumps({"prompt": "1+" + t[2]}).encode()))),
        st.just(write("unknown format", lambda: b"prompt\n1+1=\n", name="data.csv")),
        st.just(write("broken .json", lambda: b'[{"prompt": "1+1="},', name="data.json")),
        st.just(write("broken .parquet", lambda: b"PAR1 not really", name="data.parquet")),
        st.just(("dataset: missing file", lambda d: _dataset_argv(d, d / "nowhere.jsonl"))),
    ]


def model_cases():
    from tokenflow.model_store import shipped_model_path

    src = shipped_model_path("default")

    def copy(d: Path) -> Path:
        m = d / "model"
        shutil.copytree(src, m)
        return m

    def empty(d):
        (d / "model").mkdir()
        return ["--model.path", str(d / "model")]

    def no_weights(d):
        m = copy(d)
        (m / "model.safetensors").unlink()
        return ["--model.path", str(m)]

    def no_tokenizer(d):
        m = copy(d)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            (m / f).unlink()
        return ["--model.path", str(m)]

    def bad_config(d):
        m = copy(d)
        (m / "config.json").write_text("{not json")
        return ["--model.path", str(m)]

    def arch(name):
        def build(d):
            m = copy(d)
            cfg = json.loads((m / "config.json").read_text())
            cfg.update(architectures=[f"{name.capitalize()}ForCausalLM"], model_type=name)
            (m / "config.json").write_text(json.dumps(cfg))
            return ["--model.path", str(m)]
        return "model: unsupported architecture", build

    def a_file(d):
        (d / "model.bin").write_bytes(b"\0")
        return ["--model.path", str(d / "model.bin")]

    fixed = [("model: empty folder", empty), ("model: no weights", no_weights),
             ("model: no tokenizer", no_tokenizer), ("model: config.json broken", bad_config),
             ("model: missing", lambda d: ["--model.path", str(d / "absent")]), ("model: a file", a_file)]
    return [st.just(c) for c in fixed] + [
        ident.filter(lambda n: n not in ("llama", "qwen2", "qwen3", "mistral")).map(arch)]


# One branch per kind of bad input, so that each is drawn about as often as the others.
BRANCHES = [*config_cases(), *toml_cases(), *reward_cases(), *dataset_cases(), *model_cases()]
ALL_CASES = st.one_of(*BRANCHES)


def run_in_process(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse
            code = e.code
        except BaseException as e:  # noqa: BLE001 - a traceback is what we are looking for
            import traceback

            return -1, "Traceback (most recent call last):\n" + "".join(traceback.format_exception(e))
    return code, err.getvalue()


def judge(code, err: str) -> str | None:
    """None if the outcome is right, else what is wrong."""
    lines = err.strip().splitlines()
    if "Traceback" in err:
        return "a traceback"
    if code != 2:
        return f"exit status {code}"
    if len(lines) != 1:
        return f"{len(lines)} lines"
    if not lines[0].startswith("error: "):
        return "not an error line"
    if not FIX_WORDS.search(lines[0]):
        return "no fix offered"
    return None


@pytest.mark.slow
def test_every_fuzzed_bad_input_gets_one_line_exit_2_and_no_traceback(tmp_path, monkeypatch):
    def tripwire(*a, **k):
        raise AssertionError("the input checks let a malformed input through: training started")

    monkeypatch.setattr(launch, "_train", tripwire)
    results: list[tuple[str, list[str], int, str, str | None]] = []

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(case=ALL_CASES)
    def check(case):
        kind, build = case
        with tempfile.TemporaryDirectory(dir=tmp_path) as d:
            d = Path(d)
            argv = build(d)
            full = ["train", *argv, "--output-dir", str(d / "run"), "--metrics.progress", "false"] \
                if not argv or argv[0].startswith("--") else ["train", argv[0], "--output-dir", str(d / "run"), *argv[1:]]
            code, err = run_in_process(full)
            wrong = judge(code, err)
            if wrong is None and (d / "run").exists():
                wrong = "left a run folder behind"
            results.append((kind, full, code, err.strip(), wrong))

    t0 = time.monotonic()
    check()
    took = time.monotonic() - t0
    failed = [r for r in results if r[4] is not None]
    kinds = sorted({r[0] for r in results})
    messages = sorted({re.sub(re.escape(str(tmp_path)) + r"[^ '\"]*", "<tmp>", r[3]) for r in results})
    counts = {k: sum(r[0] == k for r in results) for k in kinds}
    report = [f"cases tried: {len(results)}, passed: {len(results) - len(failed)}, kinds: {len(kinds)}, "
              f"{took:.1f}s", *(f"kind: {k} ({n})" for k, n in counts.items()), "", *messages]
    (tmp_path / "fuzz_messages.txt").write_text("\n".join(report) + "\n")
    print("\n".join(report[:1]), f"\ndistinct messages: {len(messages)} (all in {tmp_path / 'fuzz_messages.txt'})")
    assert len(results) >= 300
    assert len(kinds) >= len(BRANCHES) - 1, kinds  # every kind was drawn (bad reward specs share one)
    assert not failed, "\n\n".join(f"{k}: {' '.join(a)}\n-> {w}\n{e[-2000:]}" for k, a, c, e, w in failed[:5])


@pytest.mark.slow
def test_bad_input_through_the_installed_command(tmp_path):
    """The same promise from a real process (the logging set-up, the interpreter's exit)."""
    (tmp_path / "broken.toml").write_text("[run\nsteps = 3\n")
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "reward.py").write_text("import no_such_module_for_tokenflow_fuzz\n")
    (tmp_path / "model").mkdir()
    cases = [
        [str(tmp_path / "broken.toml")],
        ["--rollout.group_size", "0"],
        ["--algorithm.clip_low", "0.5", "--algorithm.clip_high", "0.2"],
        ["--task.name", "dataset", "--task.train_path", str(tmp_path / "empty.jsonl"), "--task.reward", "json:loads"],
        ["--task.name", "dataset", "--task.train_path", str(tmp_path / "empty.jsonl"),
         "--task.reward", f"{tmp_path / 'reward.py'}:reward"],
        ["--model.path", str(tmp_path / "model")],
    ]
    for argv in cases:
        r = subprocess.run([sys.executable, "-m", "tokenflow.cli.main", "train", *argv, "--output-dir",
                            str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
        assert judge(r.returncode, r.stderr) is None, (argv, r.returncode, r.stderr)
        assert not (tmp_path / "run").exists()
