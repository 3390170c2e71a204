"""A real `tokenflow serve` app on a free loopback port, and a reference engine to compare with.

Each test module starts one server (`served`): the shipped model in the built-in engine, served
from a background thread; startup is bounded and the server stops (and its engine thread ends)
when the module is done. The reference engine is a second engine on the same model in this
process: a request sent to the server and the same request run on it must give the same ids.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np

from tokenflow.engine import EngineConfig, SamplingParams
from tokenflow.engine.factory import make_engine
from tokenflow.model_store import resolve_model_path
from tokenflow.serve.app import create_app
from tokenflow.serve.server import BackgroundServer

CLIENT_TIMEOUT_S = 60.0

FLOAT32_EPS = float(np.finfo(np.float32).eps)
LOGPROB_TOL = 64 * FLOAT32_EPS
"""How far a log-prob computed by the server's engine may be from the reference engine's for
the same request. Both run the same float32 kernels on the same model; only the batch around a
row differs (other clients' requests), which can change a matmul's summation order. A log-prob
of magnitude L = z_a - zmax - log Σexp(z - zmax) sums a handful of terms of the logits' size; a
reordered float32 dot product of the hidden size (128 here) moves each logit by a few ulps of its
magnitude. 64 ulps of (1 + |L|) bounds that with headroom; a real difference (a temperature not
applied, another seed) is orders of magnitude larger. Measured here: 0 against the reference
(bit-identical, 5 seeds x 2 samples x 24 tokens); 3e-6 at a log-prob of -0.68 between two runs of
one request whose prompts were admitted in different steps (a quarter of the bound there)."""


def logprob_tol(values) -> np.ndarray:
    return LOGPROB_TOL * (1 + np.abs(np.asarray(values, dtype=np.float64)))


@dataclass
class Served:
    url: str
    model_name: str
    app: object
    engine: object
    reference: object
    """A second engine on the same model, for comparisons."""

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def reference_generate(self, prompt_ids: list[int], params: SamplingParams):
        return self.reference.generate([prompt_ids], params)[0]


@contextlib.contextmanager
def served(model: str, *, api_key: str | None = None, model_name: str | None = None, on_call=None,
           config=None, reference: bool = True):
    """``config``: the server's `ServeConfig` (its limits); ``reference``: build the second engine."""
    path = resolve_model_path(model)
    engine_config = EngineConfig(device="cpu", dtype="float32", threads=1, max_num_seqs=64, seed=0)
    engine = make_engine(path, engine_config)
    ref = make_engine(path, engine_config) if reference else None
    app = create_app(engine, model_name or model, api_key=api_key, on_call=on_call, config=config)
    try:
        with BackgroundServer(app, startup_timeout_s=60) as server:
            yield Served(server.url, model_name or model, app, engine, ref)
        assert not app.state.driver.running, "the engine thread outlived the server"
    finally:
        engine.close()
        if ref is not None:
            ref.close()


def slow_steps(engine, seconds: float):
    """Make each ``engine.step()`` take ``seconds`` more, so that requests stay in flight long
    enough to disconnect from, be refused beside or stop the server under (the engine itself is
    real). Returns the function that puts the engine back."""
    import time

    step = engine.step

    def slow():
        time.sleep(seconds)
        return step()

    engine.step = slow
    return lambda: engine.__dict__.pop("step", None)


def sync_client(s: Served, api_key: str = "unused"):
    import openai

    return openai.OpenAI(base_url=s.base_url, api_key=api_key, timeout=CLIENT_TIMEOUT_S, max_retries=0)


def async_client(s: Served, api_key: str = "unused"):
    import openai

    return openai.AsyncOpenAI(base_url=s.base_url, api_key=api_key, timeout=CLIENT_TIMEOUT_S, max_retries=0)


def extra(choice_or_response, name: str):
    """An extension field the client does not model (``token_ids``, ``prompt_token_ids``)."""
    return (choice_or_response.model_extra or {}).get(name)
