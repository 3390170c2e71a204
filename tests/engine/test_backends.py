"""The table of engine backends (`tokenflow.engine.backends`): a third party registers a backend
without editing tokenflow, `make_engine` builds it, and the config checks settings against the
capabilities it declares, all without importing torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tokenflow.config.engine import EngineConfig
from tokenflow.config.root import TrainConfig
from tokenflow.engine.backends import ENGINES, EngineCapabilities, capabilities_of, register_backend
from tokenflow.engine.factory import make_engine


class FakeEngine:
    capabilities = EngineCapabilities(sampling_masks=False, recompute_kv=False, multi_turn=False,
                                      update_modes=("inflight", "blocking"))

    def __init__(self, model, config, *, tokenizer=None) -> None:
        self.model, self.config, self.tokenizer = model, config, tokenizer


@pytest.fixture
def fake():
    register_backend("fake", FakeEngine)  # the class's own record
    yield
    ENGINES._entries.pop("fake", None)


def test_a_registered_backend_is_built_and_its_capabilities_are_read(fake, tmp_path):
    assert capabilities_of("fake") is FakeEngine.capabilities
    eng = make_engine(tmp_path, EngineConfig(backend="fake"))
    assert isinstance(eng, FakeEngine) and eng.model == tmp_path


@pytest.mark.parametrize("settings, message", [
    ({"engine": {"recompute_kv_after_update": True}}, "recompute_kv_after_update"),
    ({"engine": {"update_mode": "abort"}}, "update_mode"),
    ({"sampling": {"top_k": 5}}, "sampling mask"),
])
def test_the_config_refuses_what_the_backend_lacks(fake, settings, message):
    data = {**settings, "engine": {"backend": "fake", **settings.get("engine", {})}}
    with pytest.raises(ValueError, match=message):
        TrainConfig.model_validate(data)
    TrainConfig.model_validate({"engine": {"backend": "builtin", **settings.get("engine", {})},
                                **{k: v for k, v in settings.items() if k != "engine"}})


def test_an_unknown_backend_is_refused_with_the_known_ones_listed():
    with pytest.raises(ValueError, match="known: builtin, vllm"):
        EngineConfig(backend="vlm")


def test_checking_a_backend_imports_no_backend():
    code = ("import sys; from tokenflow.config.root import TrainConfig; "
            "TrainConfig.model_validate({'engine': {'backend': 'vllm'}}); "
            "print(sorted(m for m in ('torch', 'numpy', 'vllm', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
