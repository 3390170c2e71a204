"""A CPU trainer keeps the memory a step frees (trainer.keep_host_memory): a block freed and
asked for again comes back without page faults, where glibc alone would unmap it and fault every
4 KB page in again. Measured in a fresh process (the setting is process-wide), by its fault count."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.probe_testlib import ROOT, run_probe

# Build a Trainer, then take and free a 64 MB tensor eight times. Off: glibc maps blocks over its
# mmap threshold (at most 32 MB) and unmaps them on free, so every take costs 16,384 faults. On:
# the heap grows once or twice (torch asks for an aligned block a little larger than the freed
# one, and a small allocation placed after a block can keep it from merging back), then every
# take reuses it; 16 runs here never grew after the third take. The last five takes are counted.
_PROBE = textwrap.dedent("""
    import json, resource, sys
    import torch
    from tests.trainer.trainer_testlib import tiny_model
    from tokenflow.algorithms import AlgorithmConfig
    from tokenflow.trainer import Trainer, TrainerConfig
    Trainer(tiny_model(seed=0), TrainerConfig(device="cpu", keep_host_memory=sys.argv[1] == "on"), AlgorithmConfig())
    pages = (64 << 20) // 4096
    faults = []
    for _ in range(8):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        torch.ones(pages * 1024)  # 64 MB, touched, then freed
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(json.dumps({"faults": sum(faults[3:]), "pages": pages, "each": faults}))
""")


def _faults(keep: str) -> tuple[int, int]:
    out = run_probe(_PROBE, keep)
    return out["faults"], out["pages"]


@pytest.mark.slow  # two fresh processes that import torch
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings")
def test_a_cpu_trainer_reuses_freed_memory_without_page_faults():
    on, pages = _faults("on")
    off, _ = _faults("off")
    # Off: every page of each re-taken block faults in again (a few more for the allocator's own
    # bookkeeping). On: the blocks come from the kept heap; a handful of faults at most.
    assert off >= 5 * pages, (off, pages)
    assert on < pages // 100, (on, pages)


# Fragment the heap the way a step does: many blocks under glibc's mmap threshold (they come from
# the heap), every other one freed, so no free run reaches the top of the heap and glibc's own
# trimming gives nothing back. Then one real train_step of the tiny model, and the resident
# memory before and after it.
_HOLES = textwrap.dedent("""
    import json, sys
    import torch
    from tests.trainer.trainer_testlib import make_rollouts, tiny_model
    from tokenflow.algorithms import AlgorithmConfig
    from tokenflow.trainer import Trainer, TrainerConfig
    def rss():
        return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmRSS"))
    bound = float(sys.argv[2]) if len(sys.argv) > 2 else None
    trainer = Trainer(tiny_model(seed=0), TrainerConfig(device="cpu", keep_host_memory=sys.argv[1] == "on",
                                                        keep_host_memory_gb=bound), AlgorithmConfig())
    blocks = [bytearray(64 << 10) for _ in range(16384)]  # 1 GB in 64 KB blocks, touched
    del blocks[::2]  # 512 MB of holes
    before = rss()
    metrics = trainer.train_step(make_rollouts())
    print(json.dumps({"before": before, "after": rss(), "released": metrics.get("perf/host_memory_released")}))
""")


def _step_rss(keep: str, *bound: str) -> dict:
    return run_probe(_HOLES, keep, *bound)


@pytest.mark.slow  # two fresh processes that import torch
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_without_keep_host_memory_a_step_hands_the_heaps_holes_back():
    off, on = _step_rss("off"), _step_rss("on")
    # Off: the step ends with malloc_trim, which returns the 512 MB of holes, less what the step
    # itself still holds at its end (its gradients, AdamW's state and torch's own caches land in
    # the holes): 30 MB here, about 30 MB on CI when the holes were 128 MB and only 98 MB came
    # back. Holes four times that step's size keep it a small part. On: they stay.
    assert off["after"] < off["before"] - 400e6, off
    assert on["after"] > on["before"] - 20e6, on


@pytest.mark.slow  # two fresh processes that import torch
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_a_kept_heap_goes_back_once_it_holds_more_than_its_bound():
    """trainer.keep_host_memory_gb: the same 512 MB of holes go back after a step that ends above
    the bound (the process holds over 1 GB; the bound is 0.1 GB), and stay under a bound the
    process is far below."""
    over, under = _step_rss("on", "0.1"), _step_rss("on", "100")
    assert over["released"] == 1.0 and over["after"] < over["before"] - 400e6, over
    assert under["released"] == 0.0 and under["after"] > under["before"] - 20e6, under


# A CPU trainer (trainer.onednn_cache_capacity) and a CPU engine (engine.onednn_cache_capacity)
# bound oneDNN's kernel cache in their own process, seen through oneDNN's own log: a bfloat16
# product run twice builds its kernel once when the cache keeps it (the second build is a
# "cache_hit") and twice when the capacity is 0.
_BUILD = {
    "trainer": """
from tests.trainer.trainer_testlib import tiny_model
from tokenflow.algorithms import AlgorithmConfig
from tokenflow.trainer import Trainer, TrainerConfig
Trainer(tiny_model(seed=0), TrainerConfig(device="cpu", onednn_cache_capacity=int(sys.argv[1])), AlgorithmConfig())
""",
    "engine": """
from tests.engine.engine_testlib import hf_model, make_engine
make_engine(hf_model("llama"), onednn_cache_capacity=int(sys.argv[1]))
""",
}
_KERNELS = """
a = torch.ones(256, 256, dtype=torch.bfloat16)
for _ in range(2):
    a @ a
"""


def _kernel_builds(worker: str, capacity: int, **env) -> list[str]:
    import os

    # A trainer or engine built earlier in this test process set the variable in its
    # environment; the probe starts without it unless the case sets it.
    base = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    probe = "import sys\nimport torch\n" + _BUILD[worker] + _KERNELS
    done = subprocess.run([sys.executable, "-c", probe, str(capacity)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env={**base, "ONEDNN_VERBOSE": "all", **env})
    assert done.returncode == 0, done.stderr[-3000:]
    return [line.split(",")[3] for line in done.stdout.splitlines()
            if line.startswith("onednn_verbose") and ",create:cache_" in line and "256x256:256x256" in line]


@pytest.mark.slow  # three fresh processes that import torch
@pytest.mark.parametrize("worker", ["trainer", "engine"])
def test_a_cpu_worker_bounds_onednn_kernel_cache(worker):
    kept = _kernel_builds(worker, 128)
    if not kept:
        pytest.skip("this CPU's bfloat16 products do not run through oneDNN")
    assert kept == ["create:cache_miss", "create:cache_hit"]
    assert _kernel_builds(worker, 0) == ["create:cache_miss", "create:cache_miss"]
    # the user's own setting wins over the worker's
    rebuilt = ["create:cache_miss", "create:cache_miss"]
    assert _kernel_builds(worker, 128, ONEDNN_PRIMITIVE_CACHE_CAPACITY="0") == rebuilt
