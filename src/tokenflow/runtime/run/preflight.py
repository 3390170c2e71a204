"""Checks made before a run creates its folder or starts a process, so that bad input ends in one
line naming the problem and the fix (``tokenflow train`` exits 2), never in a traceback from a
worker minutes later.

    model folder  config.json, weights and tokenizer files present; an architecture the engine serves
    task          the data file reads, every prompt has its field (``tokenflow.tasks.dataset``)
    reward        importable, a function, callable as fn(prompt, completion, example) on a real
                  example, returning a number
    prompts       every character of every prompt is something the tokenizer can encode
    precision     a warning where bfloat16 is asked of a CPU that emulates it (``tokenflow.precision``)
    memory        the workers' estimated peak memory fits in what the machine has, and the trainer's
                  in ``trainer.memory_budget_gb`` (``tokenflow.runtime.run.memory_budget``;
                  ``runtime.check_memory``)
"""

from __future__ import annotations

import inspect
import json
import logging
from pathlib import Path
from types import SimpleNamespace

from tokenflow.errors import InputError

log = logging.getLogger(__name__)

_WEIGHTS = ("*.safetensors", "pytorch_model*.bin", "model.safetensors.index.json")
_TOKENIZER = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def check_model_folder(path: str) -> None:
    p = Path(path)
    what = f"model.path {str(p)!r}"
    hint = "point model.path at a Hugging Face model folder (config.json, *.safetensors, tokenizer files)"
    if not p.is_dir():
        raise InputError(f"{what} is not a folder; {hint}")
    cfg_file = p / "config.json"
    if not cfg_file.is_file():
        raise InputError(f"{what} holds no config.json; {hint}")
    try:
        config = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(f"{cfg_file} is not valid JSON ({e}); {hint}") from None
    if not isinstance(config, dict):
        raise InputError(f"{cfg_file} holds no JSON object; {hint}")
    if not any(next(p.glob(pattern), None) for pattern in _WEIGHTS):
        raise InputError(f"{what} holds no weights (model.safetensors or pytorch_model.bin); {hint}")
    if not any((p / name).is_file() for name in _TOKENIZER):
        raise InputError(f"{what} holds no tokenizer files (tokenizer.json or tokenizer.model); {hint}")
    from tokenflow.engine.builtin.models.registry import check_supported

    try:
        check_supported(SimpleNamespace(architectures=config.get("architectures"), model_type=config.get("model_type")))
    except ValueError as e:
        raise InputError(f"{what}: {e}; use a model of a supported architecture") from None


def load_tokenizer(path: str, ctx=None):
    """The folder's tokenizer as ``AutoTokenizer.from_pretrained(path)`` builds it
    (`tokenflow.engine.loading.tokenizer_files.read_tokenizer`), or an ``InputError`` naming the folder.

    With ``ctx``, a fork-server context (``runtime.worker_start``), the tokenizer is loaded in a
    child forked from the server, which has transformers imported already, and comes back
    pickled: this process then imports only the tokenizer's class, not the model machinery and
    torch that ``AutoTokenizer`` pulls in (seconds of CPU that the server's own imports, running
    at the same time, would otherwise share two cores with). The object is the one
    ``AutoTokenizer`` built, whole."""
    if ctx is not None:
        tokenizer = _load_in_child(path, ctx)
        if tokenizer is not None:
            return tokenizer
    from tokenflow.engine.loading.tokenizer_files import read_tokenizer

    try:
        return read_tokenizer(path)
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds for a broken folder
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"cannot load the tokenizer from {path!r} ({first}); "
                         "the folder needs tokenizer.json (or tokenizer.model) and tokenizer_config.json") from None


def _tokenizer_child(conn, path: str, env: dict) -> None:
    from tokenflow.runtime.workers.os_environ import apply_environment

    apply_environment(env)
    from tokenflow.metrics import phases

    try:
        tokenizer = load_tokenizer(path)
        phases.mark("tokenizer/loaded")
        conn.send(("ok", tokenizer, phases.worker_marks("tokenizer")))
    except InputError as e:
        conn.send(("input", str(e), {}))
    except Exception as e:  # noqa: BLE001 - the parent loads it itself and reports
        conn.send(("failed", f"{type(e).__name__}: {e}", {}))
    conn.close()


def _load_in_child(path: str, ctx):
    """The tokenizer from a forked child; None if that did not work (the caller loads it itself)."""
    from tokenflow.runtime.workers.os_environ import environment

    try:  # the generic class's module, imported while the fork server finishes its own imports
        import transformers.tokenization_utils_tokenizers  # noqa: F401
    except Exception:  # noqa: BLE001, S110 - unpickling imports what it needs
        pass
    try:
        reader, writer = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_tokenizer_child, args=(writer, path, environment()),
                            name="tokenflow-tokenizer", daemon=True)
        child.start()
        writer.close()
        try:
            kind, payload, marks = reader.recv()
        finally:
            reader.close()
            child.join(10)
    except Exception as e:  # noqa: BLE001 - EOF (the child died), no fork server: load it here
        log.debug("loading the tokenizer in a forked child failed (%s); loading it here", e)
        return None
    from tokenflow.metrics import phases

    for name, t in marks.items():  # when the fork server was ready (the child's start), for the breakdown
        phases.mark(name, t)
    if kind == "input":
        raise InputError(payload)
    if kind != "ok":
        log.debug("loading the tokenizer in a forked child failed (%s); loading it here", payload)
        return None
    return payload


def check_reward(task) -> None:
    """The reward function takes (prompt, completion, example) and returns a number on one real
    example; a wrong signature or a string return is an error now, not a failed sample later."""
    from tokenflow.scoring.pool import normalise_reward

    fn, spec = task.reward_fn, task.reward_spec
    prompt = (task.eval_prompts() or [task.train_prompt(0)])[0]
    try:
        inspect.signature(fn).bind(prompt.text, "", prompt.example)
    except TypeError as e:
        raise InputError(f"reward function {spec!r} cannot be called as fn(prompt, completion, example): {e}; "
                         "give it exactly those three parameters") from None
    except ValueError:
        pass  # no signature to inspect (a builtin): the call below tells
    try:
        out = fn(prompt.text, "", prompt.example)
    except ImportError as e:  # a library it needs is missing (an extra not installed): every sample would fail
        raise InputError(f"reward function {spec!r} cannot run: {e}") from None
    except Exception as e:  # noqa: BLE001 - an empty completion may legitimately be unscorable
        log.warning("reward function %s raised on an empty completion for a real prompt (%s: %s); "
                    "samples it raises on are marked failed", spec, type(e).__name__, e)
        return
    try:
        normalise_reward(out)
    except (TypeError, ValueError) as e:
        raise InputError(f"reward function {spec!r}: {e}") from None


def check_environment(task, tokenizer) -> None:
    """An environment task, tried once before any process starts: the model's chat template
    renders the environment's first held-out episode, and whether the template preserves
    prefixes is said now (if not, every model turn becomes its own training row)."""
    from tokenflow.envs import BridgeError, ChatBridge

    prompt = (task.eval_prompts() or [task.train_prompt(0)])[0]
    env = task.make_env()
    try:
        try:
            messages, tools = env.reset(prompt.example)
        except Exception as e:  # noqa: BLE001 - a user environment may raise anything
            raise InputError(f"{task.env_spec}.reset raised {type(e).__name__}: {e} on the first held-out "
                             f"example {prompt.example!r}; fix the environment") from None
        try:
            bridge = ChatBridge(tokenizer, tools=list(tools or []) or None)
            bridge.prompt_ids(messages)
        except BridgeError as e:
            raise InputError(f"task.env {task.env_spec}: {e}") from None
        if tools:  # a template that drops them trains the episodes without them: said once, here
            from tokenflow.envs.template_tools import warn_dropped_tools

            warn_dropped_tools(tokenizer, f"environment {task.env_spec}")
        check = bridge.prefix_check()
        if check.ok:
            log.info("chat template: %s", check.reason)
        else:
            log.warning("the chat template does not preserve prefixes: %s. Every model turn becomes its "
                        "own training row (episode/new_rows counts them)", check.reason)
    finally:
        env.close()


def check_agent(spec: str, tokenizer) -> None:
    """An agent task, before any process starts: the agent function loads and takes
    (base_url, example), and the model has a chat template (said whether it preserves
    prefixes: if not, every session call becomes its own training row)."""
    from tokenflow.envs import BridgeError, ChatBridge
    from tokenflow.runtime.drivers.agents import load_agent

    try:
        load_agent(spec)
    except ValueError as e:
        raise InputError(str(e)) from None
    try:
        check = ChatBridge(tokenizer).prefix_check()
    except BridgeError as e:
        raise InputError(f"task.agent {spec}: the model's chat template cannot serve chat calls ({e})") from None
    if check.ok:
        log.info("chat template: %s", check.reason)
    else:
        log.warning("the chat template does not preserve prefixes: %s. Every session call becomes its own "
                    "training row", check.reason)


def check_chat_prompt(task, tokenizer, task_config) -> None:
    """``task.chat_template``: the model's tokenizer has a chat template and it renders the first
    training prompt (with ``task.system_prompt``) exactly as training will encode it."""
    from tokenflow.tasks.prompts import prompt_encoder

    if not getattr(tokenizer, "chat_template", None):
        raise InputError("task.chat_template = true, but the model's tokenizer has no chat template; set "
                         "task.chat_template = false or use a chat model (e.g. model.path = \"smollm2-135m-instruct\")")
    prompt = task.train_prompt(0)
    try:
        ids = prompt_encoder(tokenizer, task_config)(prompt.text)
    except Exception as e:  # noqa: BLE001 - Jinja and tokenizers raise many types
        raise InputError(f"the model's chat template cannot render the prompt {prompt.text[:40]!r} as a user "
                         f"message ({type(e).__name__}: {e}); set task.chat_template = false") from None
    if not ids:
        raise InputError("the model's chat template renders the prompts as no tokens; set task.chat_template = false")


def check_prompts_encode(task, encode) -> None:
    """Every character of the prompts must be encodable; name the ones that are not, and a row."""
    rows = getattr(task, "rows", None)
    if rows is not None:  # a dataset: every row, numbered as in the file
        texts = [(number, text) for number, text in rows]
    else:  # a generated task: the held-out prompts and the first training ones
        texts = [(None, p.text) for p in task.eval_prompts()]
        texts += [(None, task.train_prompt(i).text) for i in range(256)]
    chars = sorted({c for _, t in texts for c in t})
    bad = []
    for c in chars:
        try:
            encode(c)
        except Exception:  # noqa: BLE001 - tokenizers raise plain Exception subclasses here
            bad.append(c)
    if not bad:
        return
    first = next((n, t) for n, t in texts if any(c in t for c in bad))
    where = first[0] if first[0] is not None else f"prompt {first[1][:40]!r}"
    raise InputError(f"the tokenizer cannot encode {len(bad)} character(s) of the prompts: "
                     f"{', '.join(repr(c) for c in bad[:10])}{' ...' if len(bad) > 10 else ''} "
                     f"(first in {where}); remove them from the data or use a model whose tokenizer covers them")


def precision_warnings(cfg) -> list[str]:
    """Where the config names bfloat16 for a CPU that emulates it (`tokenflow.precision`): the
    run would work, its products many times slower than in float32."""
    from tokenflow.precision import slow_bf16_warning

    sides = [("trainer", cfg.trainer)] + ([("engine", cfg.engine)] if cfg.engine.backend == "builtin" else [])
    return [w for section, part in sides if (w := slow_bf16_warning(section, part.device, part.dtype))]


def check_precision(cfg) -> None:
    """`precision_warnings`, logged before the run starts."""
    for warning in precision_warnings(cfg):
        log.warning(warning)


def check_memory(cfg, model: str, task, tokenizer) -> None:
    """The run's estimated peak memory fits in what is available, or an ``InputError`` naming the
    numbers and the setting to lower; prompts' lengths from the task's first prompts."""
    from tokenflow.runtime.run.memory_budget import check_memory as check
    from tokenflow.runtime.run.memory_estimate import PROMPT_TOKENS

    try:
        prompts = [*task.eval_prompts()[:16], *(task.train_prompt(i) for i in range(16))]
        longest = max(len(tokenizer.encode(p.text, add_special_tokens=False)) for p in prompts)
    except Exception:  # noqa: BLE001 - an environment's prompts come from reset: a typical length then
        longest = PROMPT_TOKENS
    try:
        check(cfg, model, prompt_tokens=longest + 32, log=log)  # + a chat template's turn markers
    except InputError:
        raise
    except (OSError, ValueError, KeyError) as e:
        log.warning("no memory estimate for %s (%s: %s)", model, type(e).__name__, e)
