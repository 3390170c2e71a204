"""``dtype = "native"`` (`tokenflow.precision`): bfloat16 where the device multiplies it in
hardware, float32 on a CPU that emulates it; resolved when the config is read; a warning where a
config names bfloat16 for such a CPU. The CPUs are named by their /proc/cpuinfo flags."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tokenflow import precision
from tokenflow.config.engine import EngineConfig
from tokenflow.config.loading import load_config, to_toml
from tokenflow.config.root import TrainConfig
from tokenflow.config.trainer import TrainerConfig
from tokenflow.engine.builtin.models.packed import can_pack
from tokenflow.runtime.run.preflight import check_precision

ROOT = Path(__file__).resolve().parents[2]
AVX2 = {"fpu", "sse2", "avx", "avx2", "fma", "f16c"}  # AMD Zen 2/3, Intel's client cores
SKYLAKE_SP = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq"}  # oneDNN converts, no bf16 units
SAPPHIRE_RAPIDS = SKYLAKE_SP | {"avx512_bf16", "amx_tile", "amx_bf16"}
GRAVITON3 = {"fp", "asimd", "sve", "bf16", "i8mm"}  # Arm's "Features" line


@pytest.fixture
def cpu(monkeypatch):
    """Set the CPU's flags as /proc/cpuinfo would give them."""

    def flags(given: set[str]) -> None:
        monkeypatch.setattr(precision, "_cpuinfo_flags", lambda: given)
        precision.cpu_has_native_bf16.cache_clear()
        precision.cpu_onednn_bf16.cache_clear()

    yield flags
    precision.cpu_has_native_bf16.cache_clear()  # the real CPU's answers are read again after
    precision.cpu_onednn_bf16.cache_clear()


@pytest.mark.parametrize("flags, native, onednn", [(AVX2, "float32", False), (SKYLAKE_SP, "float32", True),
                                                   (SAPPHIRE_RAPIDS, "bfloat16", True), (GRAVITON3, "bfloat16", True)])
def test_native_is_bfloat16_only_where_the_cpu_has_bfloat16_units(cpu, flags, native, onednn):
    cpu(flags)
    assert precision.native_dtype("cpu") == native
    assert precision.cpu_onednn_bf16() is onednn
    assert precision.native_dtype("cuda") == "bfloat16"


def test_the_config_resolves_native_when_it_is_read(cpu, tmp_path):
    cpu(AVX2)
    assert TrainerConfig(dtype="native", device="cpu").dtype == "float32"
    assert EngineConfig(dtype="native", device="cpu").dtype == "float32"
    cfg = load_config(TrainConfig, ROOT / "examples/laptop_math/config.toml")
    assert (cfg.trainer.dtype, cfg.engine.dtype) == ("float32", "float32")
    saved = tmp_path / "config.toml"  # what a run folder keeps, and a resume reads
    saved.write_text(to_toml(cfg))
    assert 'dtype = "native"' not in saved.read_text()
    cpu(SAPPHIRE_RAPIDS)
    assert load_config(TrainConfig, saved).trainer.dtype == "float32"  # the run's own precision kept
    again = load_config(TrainConfig, ROOT / "examples/laptop_math/config.toml", ["--engine.dtype", "native"])
    assert (again.trainer.dtype, again.engine.dtype) == ("bfloat16", "bfloat16")
    assert EngineConfig(dtype="auto", device="cpu").dtype == "auto"  # "auto" is left as it was


def test_bfloat16_named_for_a_cpu_that_emulates_it_is_warned(cpu, caplog):
    cfg = load_config(TrainConfig, None, ["--trainer.dtype", "bfloat16", "--engine.dtype", "bfloat16",
                                          "--trainer.device", "cpu", "--engine.device", "cpu"])
    cpu(AVX2)
    with caplog.at_level(logging.WARNING, logger="tokenflow.runtime.run.preflight"):
        check_precision(cfg)
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2 and all('dtype = "native"' in w and "AVX" in w for w in warned), warned
    assert [w.split(".dtype")[0] for w in warned] == ["trainer", "engine"]
    caplog.clear()
    cpu(SAPPHIRE_RAPIDS)
    check_precision(cfg)
    assert caplog.records == []


def test_the_flags_read_agree_with_onednns_own_check_on_this_machine():
    """What the memory estimate reads without torch is what the engine's weight packing asks torch."""
    onednn = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert precision.cpu_onednn_bf16() is onednn
    assert can_pack(torch.device("cpu"), torch.bfloat16) is (onednn and torch.backends.mkldnn.is_available())
    if precision.cpu_has_native_bf16():
        assert onednn  # bfloat16 units imply oneDNN's bfloat16 path


def test_the_benchmark_prints_both_rates_per_shape():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks/cpu_precision.py"), "--seconds", "0.01"],
                         capture_output=True, text=True, timeout=300, check=True)
    result = json.loads(out.stdout)
    assert result["native_dtype"] == ("bfloat16" if result["native_bf16"] else "float32")
    assert len(result["shapes"]) == 4
    for row in result["shapes"]:
        assert row["float32_gflops"] > 0 and row["bfloat16_gflops"] > 0
        # the ratio (rounded to 0.001) within what the two rates (each rounded to 0.01) allow
        b, f = row["bfloat16_gflops"], row["float32_gflops"]
        assert (b - 0.005) / (f + 0.005) - 0.0005 <= row["bfloat16_over_float32"] <= (b + 0.005) / (f - 0.005) + 0.0005


def test_a_dry_run_names_the_warning_where_this_cpu_emulates_bfloat16():
    """`tokenflow train --dry-run` on the machine at hand: the warning as a comment (the output
    stays a loadable config) exactly where this CPU has no bfloat16 units."""
    out = subprocess.run([sys.executable, "-m", "tokenflow.cli.main", "train", "--dry-run", "--trainer.dtype", "bfloat16",
                          "--trainer.device", "cpu", "--engine.device", "cpu"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    warned = [line for line in out.splitlines() if line.startswith("# warning: trainer.dtype")]
    assert len(warned) == (0 if precision.native_dtype("cpu") == "bfloat16" else 1), out[-2000:]
    assert not any(line.startswith("# warning: engine.dtype") for line in out.splitlines())  # engine left at "auto"


def test_without_proc_cpuinfo_both_questions_go_to_onednn(cpu):
    """macOS has no /proc/cpuinfo: both answers are then oneDNN's own check of the CPU."""
    cpu(None)
    onednn = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert precision.cpu_has_native_bf16() == onednn and precision.cpu_onednn_bf16() == onednn


@pytest.mark.slow
def test_bench_engine_and_the_tinker_service_take_native_and_name_what_ran(tmp_path):
    from tokenflow.tinker.service import Settings

    proc = subprocess.run([sys.executable, "-m", "tokenflow.cli.main", "bench", "engine", "--prompts", "2",
                           "--samples", "2", "--max-tokens", "4", "--threads", "1", "--dtype", "native", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["dtype"] == precision.native_dtype("cpu")
    assert Settings(root=str(tmp_path), dtype="native").dtype == precision.native_dtype("cpu")
    with pytest.raises(ValueError, match="float32, bfloat16 or native"):
        Settings(root=str(tmp_path), dtype="float16")
