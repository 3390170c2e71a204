"""A CPU engine keeps the memory a decode step frees for the next one (engine.keep_host_memory_mb):
the logits and sampler buffers of a shrinking batch come back without page faults, where glibc
alone trims them off the heap's top and faults every 4 KB page in again. Measured in a fresh
process (the setting is process-wide), by its fault count; and the bound holds against a trainer
in the same process that keeps everything."""

from __future__ import annotations

import sys
import textwrap

import pytest

from tests.probe_testlib import run_probe

# Build a tiny engine with the setting, then play four rounds of a decode's buffers as the batch
# shrinks from 64 rows to 4 (three [rows, 49,152] float32 blocks each step: the logits, the
# sampler's exponentials and cumulative sums). glibc's own thresholds follow the blocks it frees,
# and a step that frees more than twice the largest block at the heap's top has it trimmed, so
# every round faults again (6,144-17,881 faults a round, four rounds of one run here); kept, the rounds after
# the heap has grown take none. The last two rounds are counted.
_PROBE = textwrap.dedent("""
    import json, resource, sys
    import torch
    from tests.engine.engine_testlib import hf_model
    from tokenflow import host_memory
    from tokenflow.engine import Engine, EngineConfig
    if sys.argv[2] == "trainer-first":
        host_memory.keep_freed_memory()  # a CPU trainer in this process keeps everything
    hf = hf_model("llama")
    Engine.from_config(hf.config, hf.state_dict(), EngineConfig(device="cpu", keep_host_memory_mb=int(sys.argv[1])))
    rounds = []
    for _ in range(4):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for rows in range(64, 0, -4):
            blocks = [torch.ones(rows, 49152) for _ in range(3)]
            del blocks
        rounds.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(json.dumps({"faults": sum(rounds[2:]), "rounds": rounds, "kept": host_memory._kept}))
""")


def _probe(mb: int, order: str = "engine") -> dict:
    return run_probe(_PROBE, str(mb), order)


@pytest.mark.slow  # three fresh processes that import torch
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings")
def test_a_cpu_engine_reuses_a_decode_steps_freed_buffers():
    pages = 3 * 64 * 49152 * 4 // 4096  # one step's three blocks at 64 rows: 9,216 pages
    kept, plain = _probe(128), _probe(0)
    assert kept["kept"] == 128 << 20
    # glibc's defaults: at least one step's blocks faulted in again in each of the two rounds.
    assert plain["faults"] >= 2 * pages // 2, plain
    assert kept["faults"] < pages // 100, kept
    # A trainer that keeps everything, set first, is not narrowed by the engine's bound.
    both = _probe(128, "trainer-first")
    assert both["kept"] == float("inf") and both["faults"] < pages // 100, both
