"""The HTTP routes of the Tinker API (``/api/v1/...``), as the official ``tinker`` SDK calls them.

Calls that do work return a future (``{"request_id": ...}``) at once; ``/retrieve_future``
long-polls it and answers with the result (protobuf for ``ForwardBackwardOutput`` and
``SampleResponse`` when the SDK asks for it, JSON otherwise), ``{"type": "try_again"}`` while
it runs, or ``{"error", "category"}``. A bad call that returns a future fails that future with
a user error, which the SDK raises at once; other routes answer 400 with the same body.
"""

# No `from __future__ import annotations`: FastAPI reads the routes' `Request` annotations, which
# live in create_app's scope (fastapi is imported there, so this module stays light).
import hmac
import json
import logging

from tokenflow.tinker import wire
from tokenflow.tinker.errors import TinkerError, user_error
from tokenflow.tinker.service import TinkerService
from tokenflow.tinker.training import Lora

log = logging.getLogger(__name__)

LONG_POLL_S = 40.0  # under the SDK's 45 s read timeout; each try_again is a warning in its log
MAX_BODY_BYTES = 512 << 20
CLIENT_CONFIG = {
    # One forward_backward chunk at a time, in seq_id order (the service runs them in order).
    "parallel_fwdbwd_chunks": False,
    "proto_compress_fwdbwd": False,
    "pjwt_auth_enabled": False,
    "use_pyqwest_transport": False,
    "sample_use_retrieve_futures": False,
    "custom_loss_server_side": False,
    "sample_join_sampling_session": False,
    "sample_no_retries": False,
}


def create_app(service: TinkerService, *, api_key: str | None = None, model_names: list[str] | None = None):
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response

    app = FastAPI(title="tokenflow tinker", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.service = service

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if api_key is not None and request.url.path != "/api/v1/healthz":
            given = request.headers.get("x-api-key", "")
            if not hmac.compare_digest(given.encode(), api_key.encode()):
                return JSONResponse({"error": "missing or wrong X-API-Key (set TINKER_API_KEY to the service's "
                                              "--api-key)", "category": "user"}, status_code=401)
        size = request.headers.get("content-length")
        if size is not None and (not size.isdigit() or int(size) > MAX_BODY_BYTES):
            return JSONResponse({"error": f"body over {MAX_BODY_BYTES} bytes", "category": "user"}, status_code=413)
        try:
            return await call_next(request)
        except TinkerError as e:
            return JSONResponse(e.body(), status_code=e.status)
        except Exception as e:  # a bug of ours: the SDK's server category, and the service goes on
            log.exception("tinker: %s %s failed", request.method, request.url.path)
            return JSONResponse({"error": f"{type(e).__name__}: {e}", "category": "server"}, status_code=500)

    async def body(request: Request) -> dict:
        raw = await request.body()
        try:
            obj = json.loads(raw or b"{}")
        except ValueError:
            raise user_error("the body is not JSON") from None
        if not isinstance(obj, dict):
            raise user_error("the body must be a JSON object")
        return obj

    def future(fn) -> dict:
        """Run ``fn`` (which returns a request id); a user error becomes a failed future."""
        try:
            rid = fn()
        except TinkerError as e:
            rid = service.futures.failed(e)
        return {"request_id": rid}

    # -- service -----------------------------------------------------------------------------------

    @app.get("/api/v1/healthz")
    async def healthz():
        return {"status": "ok"}

    @app.post("/api/v1/client/config")
    async def client_config():
        return CLIENT_CONFIG

    @app.post("/api/v1/client/dynamic_config")
    async def dynamic_config():
        return {"refresh_interval_sec": 300, "sample_cancel_enabled": False}

    @app.get("/api/v1/get_server_capabilities")
    async def capabilities():
        from tokenflow.model_store.paths import MODEL_NAMES

        names = model_names or list(MODEL_NAMES)
        return {"supported_models": [{"model_name": n, "trainable": True, "sampleable": True} for n in names]}

    @app.post("/api/v1/telemetry")
    async def telemetry():
        return {"status": "accepted"}

    @app.post("/api/v1/create_session")
    async def create_session(request: Request):
        b = await body(request)
        return {"type": "create_session", "session_id": service.create_session(b.get("user_metadata"))}

    @app.post("/api/v1/sessions/{session_id}/finish")
    async def finish_session(session_id: str):
        service.finish_session(session_id)  # frees its models' memory; checkpoints stay
        return Response(status_code=204)

    @app.post("/api/v1/session_heartbeat")
    async def heartbeat(request: Request):
        if not service.heartbeat(str((await body(request)).get("session_id", ""))):
            return JSONResponse({"error": "the session has finished (or expired)", "category": "user"}, status_code=410)
        return {"type": "session_heartbeat"}

    # -- models ------------------------------------------------------------------------------------

    @app.post("/api/v1/create_model")
    async def create_model(request: Request):
        b = await body(request)
        sid = str(b.get("session_id", ""))
        return future(lambda: service.create_model(sid, b.get("base_model"), _lora(b.get("lora_config")),
                                                   b.get("model_seq_id")))

    @app.post("/api/v1/get_info")
    async def get_info(request: Request):
        return service.info(str((await body(request)).get("model_id", "")))

    @app.post("/api/v1/unload_model")
    async def unload_model(request: Request):
        b = await body(request)
        m = service.model(str(b.get("model_id", "")))
        return future(lambda: service.unload(m.model_id))

    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request):
        return await _fwd(request, None)

    @app.post("/api/v1/forward")
    async def forward(request: Request):
        return await _fwd(request, True)

    async def _fwd(request: Request, forward_only):
        raw = await request.body()
        call = wire.decode_forward_backward(raw, request.headers.get("content-type", ""),
                                            request.headers.get("content-encoding", ""), forward_only=forward_only)
        service.model(call.model_id)  # an unknown model is refused here, as the other routes do
        return future(lambda: service.forward_backward(call))

    @app.post("/api/v1/optim_step")
    async def optim_step(request: Request):
        b = await body(request)
        m = service.model(str(b.get("model_id", "")))
        params = b.get("adam_params") or b.get("optimizer_params") or b.get("optim_params") or {}
        if not isinstance(params, dict):
            raise user_error("adam_params must be an object")
        return future(lambda: service.optim_step(m.model_id, b.get("seq_id"), params))

    # -- weights -----------------------------------------------------------------------------------

    @app.post("/api/v1/save_weights")
    async def save_weights(request: Request):
        b = await body(request)
        m = service.model(str(b.get("model_id", "")))
        return future(lambda: service.save_state(m.model_id, b.get("seq_id"), b.get("path")))

    @app.post("/api/v1/load_weights")
    async def load_weights(request: Request):
        b = await body(request)
        sid = str(b.get("session_id") or "")
        if b.get("model_id"):
            m = service.model(str(b["model_id"]))
            return future(lambda: service.load_state(m.model_id, b.get("seq_id"), b.get("path"),
                                                     bool(b.get("optimizer"))))
        return future(lambda: service.create_from_state(sid, b.get("path"), bool(b.get("optimizer")),
                                                        b.get("model_seq_id")))

    @app.post("/api/v1/save_weights_for_sampler")
    async def save_for_sampler(request: Request):
        b = await body(request)
        m = service.model(str(b.get("model_id", "")))
        return future(lambda: service.save_for_sampler(
            m.model_id, b.get("seq_id"), b.get("path"), b.get("sampling_session_seq_id")))

    @app.post("/api/v1/weights_info")
    async def weights_info(request: Request):
        return service.weights_info((await body(request)).get("tinker_path"))

    @app.get("/api/v1/training_runs/{model_id}/checkpoints")
    async def checkpoints(model_id: str):
        return {"checkpoints": service.checkpoints(model_id), "cursor": None}

    @app.get("/api/v1/training_runs/{model_id}")
    async def training_run(model_id: str):
        return service.training_run(model_id)

    @app.delete("/api/v1/training_runs/{model_id}/checkpoints/{checkpoint_id:path}")
    async def delete_checkpoint(model_id: str, checkpoint_id: str):
        service.delete_checkpoint(model_id, checkpoint_id)
        return Response(status_code=204)

    # -- sampling ----------------------------------------------------------------------------------

    @app.post("/api/v1/create_sampling_session")
    async def create_sampling_session(request: Request):
        b = await body(request)
        sid = service.create_sampling_session(str(b.get("session_id", "")), b.get("base_model"), b.get("model_path"))
        return {"type": "create_sampling_session", "sampling_session_id": sid}

    @app.get("/api/v1/samplers/{sampler_id}")
    async def sampler(sampler_id: str):
        return service.sampler_info(sampler_id)

    @app.post("/api/v1/asample")
    async def asample(request: Request):
        b = await body(request)
        answer = future(lambda: service.sample(b))
        n = b.get("num_samples", 1)
        n = n if isinstance(n, int) and 0 < n <= 1024 else 1
        answer["sample_sequence_ids"] = [f"{answer['request_id']}-{i}" for i in range(n)]
        return answer

    # -- futures -----------------------------------------------------------------------------------

    @app.post("/api/v1/retrieve_future")
    async def retrieve_future(request: Request):
        b = await body(request)
        rid = str(b.get("request_id", ""))
        try:
            f = await service.futures.wait(rid, LONG_POLL_S)
        except TinkerError as e:
            return JSONResponse(e.body(), status_code=e.status)
        if f is None:
            return {"type": "try_again", "request_id": rid, "queue_state": "active"}
        if f.cancelled():
            return {"error": "the call was cancelled (the service is shutting down)", "category": "server"}
        err = f.exception()
        if err is not None:
            e = err if isinstance(err, TinkerError) else TinkerError(f"{type(err).__name__}: {err}", category="server")
            return e.body()
        result = f.result()
        proto = wire.PROTO in request.headers.get("accept", "")
        if isinstance(result, wire.Sampled):
            if proto:
                return Response(wire.sample_response_proto(result), media_type=wire.PROTO)
            return wire.sample_response_json(result)
        if isinstance(result, dict) and "_outputs" in result:
            if proto:
                return Response(wire.forward_backward_output_proto(result["_outputs"], result["_metrics"]),
                                media_type=wire.PROTO)
            return wire.forward_backward_output_json(result["_outputs"], result["_metrics"])
        return result

    return app


def _lora(cfg) -> Lora | None:
    if cfg is None:
        return None  # full fine-tuning
    if not isinstance(cfg, dict) or not isinstance(cfg.get("rank"), int):
        raise user_error("lora_config.rank must be an integer")
    return Lora(rank=cfg["rank"], seed=cfg.get("seed"), train_unembed=bool(cfg.get("train_unembed", True)),
                train_mlp=bool(cfg.get("train_mlp", True)), train_attn=bool(cfg.get("train_attn", True)))
