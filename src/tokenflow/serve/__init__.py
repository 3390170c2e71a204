"""`tokenflow serve`: an OpenAI-compatible HTTP server on a tokenflow engine.

::

    HTTP clients ──► FastAPI app (`app`): API key, routes, errors in OpenAI's shape (`errors`)
                         │  request bodies (`protocol`), chat template + tool calls (`chat`)
                         ▼
                     OpenAIService (`service`): prompts ─► SamplingParams ─► submissions;
                         ▲        choices built from tokens and rollouts (`output`), whole or SSE
                         │ events per request (asyncio queues)
                     EngineDriver (`driver`): ONE thread runs add_request / step / new_tokens
                         ▼
                     RolloutEngine (builtin or vLLM, `tokenflow.engine.factory.make_engine`)

`server` runs the app under uvicorn, in the foreground or in a background thread (a header
deadline, a connection cap); `limits` holds what a request meets before it runs; `tokenizing` the
thread that renders chat templates and tokenizes prompts, each job within a time bound;
`token_routes` the token-in routes RL clients call (``/inference/v1/generate``,
``/v1/chat/completions/tokens``; docs/verifiers.md). See docs/serve.md.

May import: layers 1-3 and, of layer 4, ``tokenflow.envs`` (tool calls, the chat bridge); never
the runtime, which mounts the app for agent sessions.
"""

from tokenflow._lazy import lazy_getattr

_EXPORTS = {
    "create_app": "tokenflow.serve.app",
    "openai_router": "tokenflow.serve.app",
    "BackgroundServer": "tokenflow.serve.server",
    "CallHook": "tokenflow.serve.service",
    "ServedCall": "tokenflow.serve.service",
}
__getattr__ = lazy_getattr(__name__, globals(), _EXPORTS)
__all__ = sorted(_EXPORTS)
