"""Smoke test of `tokenflow bench sync` on a small model."""

from __future__ import annotations

import pytest
import json
import subprocess
import sys

pytestmark = pytest.mark.slow  # a real run (or several processes) per test


def test_bench_sync_prints_every_transport_as_json():
    out = subprocess.run([sys.executable, "-m", "tokenflow.cli.main", "bench", "sync", "--size-mb", "4",
                          "--repeats", "2", "--bucket-mb", "1", "--streams", "2", "--json"],
                         capture_output=True, text=True, timeout=180, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("per_param_ms", "packed_ms", "packed_copy_ms", "shared_memory_ms", "flat_ms", "receiver_load_ms"):
        assert result[key] > 0, key
    assert result["packed_speedup"] == result["per_param_ms"] / result["packed_ms"]
    assert result["size_mb"] >= 4 and result["tensors"] > 10 and result["packed_buckets"] >= 4
    assert result["streams"] == 2 and result["repeats"] == 2
