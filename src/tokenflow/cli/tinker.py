"""`tokenflow tinker`: a local service that speaks the Tinker training API (docs/tinker.md)."""

from __future__ import annotations

import logging
import os
import sys

logger = logging.getLogger(__name__)

API_KEY_ENV = "TOKENFLOW_TINKER_API_KEY"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "tinker", help="a Tinker-compatible training service (point the tinker SDK's base_url at it)",
        description="Serve the Tinker API (/api/v1/...) so that the official `tinker` SDK and tinker-cookbook "
                    "recipes train and sample on this machine: LoRA or full fine-tuning of any model "
                    "model.path accepts, sampling on tokenflow's engine. Clients set "
                    "TINKER_BASE_URL=http://HOST:PORT and TINKER_API_KEY=tml-<anything> (the key is "
                    "checked only with --api-key). See docs/tinker.md.")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (0: a free one)")
    p.add_argument("--api-key", default=None,
                   help=f"require X-API-Key to equal this (default: ${API_KEY_ENV}); needed to bind beyond loopback")
    p.add_argument("--root", default=None, help="checkpoint folder (default: ~/.cache/tokenflow/tinker)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (training and sampling)")
    p.add_argument("--max-models", type=int, default=8, help="training clients held at once")
    p.add_argument("--micro-batch-tokens", type=int, default=2048,
                   help="rows × longest datum per forward pass: bounds the activations a call may hold")
    p.add_argument("--max-data-tokens", type=int, default=1 << 20,
                   help="tokens in one forward_backward call (the SDK splits larger batches)")
    p.add_argument("--session-timeout", type=float, default=300.0,
                   help="seconds without a heartbeat or call after which a session's models are unloaded")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "native"), default="float32",
                   help="training products and sampling: float32 (sampler and trainer log-probs agree), "
                        "bfloat16 (faster where the CPU has bfloat16 units) or native (bfloat16 where it "
                        "has them, float32 elsewhere)")
    p.add_argument("--no-recompute", action="store_true",
                   help="keep every layer's activations for the backward pass (faster, several times the memory)")
    p.add_argument("--access-log", action="store_true", help="log every request")
    p.set_defaults(func=run)


def run(args) -> int:
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    if args.host not in LOOPBACK and not api_key:
        print(f"error: --host {args.host} reaches beyond this machine; set --api-key (or ${API_KEY_ENV}) "
              "so that only clients with the key can train and sample", file=sys.stderr)
        return 2
    for name in ("max_models", "micro_batch_tokens", "max_data_tokens"):
        if getattr(args, name) < 1:
            print(f"error: --{name.replace('_', '-')} must be at least 1", file=sys.stderr)
            return 2
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from tokenflow.cli.serve import serve_config
    from tokenflow.serve.server import run as run_server
    from tokenflow.tinker.app import create_app
    from tokenflow.tinker.service import Settings, TinkerService, default_root

    service = TinkerService(Settings(root=args.root or default_root(), threads=args.threads,
                                     max_models=args.max_models, micro_batch_tokens=args.micro_batch_tokens,
                                     max_data_tokens=args.max_data_tokens, recompute=not args.no_recompute,
                                     session_timeout_s=args.session_timeout,
                                     dtype=args.dtype))
    service.config = serve_config([])  # the HTTP server's deadlines and connection cap (docs/serve.md)
    app = create_app(service, api_key=api_key)
    logger.info("tinker: the Tinker API on http://%s:%d (checkpoints in %s)%s; clients: "
                "TINKER_BASE_URL=http://%s:%d TINKER_API_KEY=tml-local", args.host, args.port, service.store.root,
                ", API key required" if api_key else "", args.host, args.port)
    try:
        run_server(app, args.host, args.port, access_log=args.access_log,
                   log_level="debug" if getattr(args, "verbose", False) else "info")
    finally:
        service.close()
    return 0
