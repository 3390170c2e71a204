"""`tokenflow serve MODEL_OR_RUN`: an OpenAI-compatible HTTP server (docs/serve.md)."""

from __future__ import annotations

import logging
import os
import sys

logger = logging.getLogger(__name__)

API_KEY_ENV = "TOKENFLOW_API_KEY"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "serve", help="an OpenAI-compatible HTTP server for a model, checkpoint or run",
        description="Serve /v1/chat/completions, /v1/completions and /v1/models from a tokenflow engine. "
                    "MODEL_OR_RUN is resolved as `tokenflow eval` does. Engine settings come from the run's "
                    "config (a run or checkpoint folder) or the defaults, then --engine.KEY VALUE overrides "
                    "(e.g. --engine.backend vllm). The server's limits are --serve.KEY VALUE (e.g. "
                    "--serve.max_requests 64; see docs/serve.md, \"Limits\").")
    p.add_argument("model", metavar="MODEL_OR_RUN",
                   help='model / checkpoint / run folder, or a model name: "default", "default-tool", "default-moe", '
                        '"smollm2-135m-instruct"')
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (0: a free one)")
    p.add_argument("--api-key", default=None,
                   help=f"require 'Authorization: Bearer KEY' on /v1 (default: ${API_KEY_ENV}, else none)")
    p.add_argument("--model-name", default=None, help="the name clients pass as `model` (default: MODEL_OR_RUN)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for the engine")
    p.add_argument("--access-log", action="store_true", help="log every request")
    p.set_defaults(func=run, _allow_overrides=True)


def _overrides(overrides: list[str], section: str) -> dict:
    """The ``--SECTION.KEY VALUE`` overrides, by key; anything but --engine and --serve is an error."""
    from tokenflow.config.loading import ConfigError, parse_overrides

    parsed = parse_overrides(overrides)
    other = sorted(k for k in parsed if not k.startswith(("engine.", "serve.")))
    if other:
        raise ConfigError("serve takes only --engine.KEY and --serve.KEY overrides, got "
                          + ", ".join("--" + k for k in other))
    return {k.split(".", 1)[1]: v for k, v in parsed.items() if k.startswith(section + ".")}


def engine_config(run_dir, overrides: list[str]):
    """The run's engine settings (or the defaults), with ``--engine.KEY VALUE`` overrides."""
    from tokenflow.config.engine import EngineConfig
    from tokenflow.config.loading import load_config, validate
    from tokenflow.config.root import TrainConfig

    parsed = _overrides(overrides, "engine")
    base = load_config(TrainConfig, run_dir / "config.toml").engine if run_dir is not None else EngineConfig()
    return validate(EngineConfig, {**base.model_dump(), **parsed})


def serve_config(overrides: list[str]):
    """The server's limits (`ServeConfig`): the defaults with ``--serve.KEY VALUE`` overrides."""
    from tokenflow.config.loading import validate
    from tokenflow.config.serve import ServeConfig

    return validate(ServeConfig, _overrides(overrides, "serve"))


def run(args, overrides: list[str] | None = None) -> int:
    from tokenflow.cli.eval import locate
    from tokenflow.config.loading import ConfigError
    from tokenflow.errors import InputError

    try:
        model, run_dir = locate(args.model)
        cfg = engine_config(run_dir, overrides or [])
        limits = serve_config(overrides or [])
    except (ConfigError, InputError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.threads:
        cfg = cfg.model_copy(update={"threads": args.threads})
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    from tokenflow.engine.factory import make_engine
    from tokenflow.serve.app import create_app
    from tokenflow.serve.server import run as run_server

    engine = make_engine(model, cfg)
    try:
        app = create_app(engine, args.model_name or args.model, api_key=api_key, config=limits)
        logger.info("serve: %s (%s backend) as %r on http://%s:%d/v1%s", model, cfg.backend,
                    args.model_name or args.model, args.host, args.port, ", API key required" if api_key else "")
        _freeze_startup_objects()
        _share_the_gil()
        if args.host not in ("127.0.0.1", "localhost", "::1") and not api_key:
            logger.warning("serve: listening on %s without an API key: anyone who can reach it can use it", args.host)
        run_server(app, args.host, args.port, access_log=args.access_log,
                   log_level="debug" if getattr(args, "verbose", False) else "info",
                   graceful_s=limits.shutdown_timeout_s)
    finally:
        engine.close()
    return 0


def _share_the_gil() -> None:
    """The event loop thread gives up the GIL at every socket call, and gets it back only once
    the engine thread lets go of it: at the latest after the switch interval, 5 ms by default.
    1 ms keeps /health (and every answer) from waiting on the engine's Python code, at the cost
    of more switches for the engine thread."""
    sys.setswitchinterval(0.001)


def _freeze_startup_objects() -> None:
    """Move what start-up built (torch, transformers, the model: millions of objects) out of the
    cyclic garbage collector's reach. Its full collections then walk only what requests
    create, instead of pausing the event loop for a scan of every module's objects."""
    import gc

    gc.collect()
    gc.freeze()
