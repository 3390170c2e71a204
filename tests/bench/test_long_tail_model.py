"""The generation-heavy benchmark's policy recipe (make_default_model --preset long-tail): the
filler that gives sampled completions their long tail, and the model it configures."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from tokenflow.shipped_models.make_default_model import PRESETS, build_config, filler_length


def test_filler_lengths_are_mostly_none_with_a_long_capped_tail():
    p = PRESETS["long-tail"]
    rng = np.random.default_rng(0)
    n = np.array([filler_length(rng, p["filler_share"], p["filler_median"], p["filler_cap"]) for _ in range(20_000)])
    assert abs((n == 0).mean() - 0.6) < 0.02  # greedy decoding takes the likelier branch: no filler
    some = n[n > 0]
    assert abs(np.median(some) - 40) <= 3 and some.max() == 200 and np.percentile(some, 99) > 3 * np.median(some)
    assert filler_length(rng, 0.0, 40.0, 200) == 0  # the default model's recipe adds none


@pytest.mark.slow
def test_the_preset_configures_the_bench_models_shape_with_room_for_256_new_tokens():
    p = PRESETS["long-tail"]
    cfg = build_config(20, argparse.Namespace(hidden=p["hidden"], layers=p["layers"], heads=p["heads"],
                                              max_positions=p["max_positions"]))
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (256, 4, 8)
    assert cfg.max_position_embeddings == 512
    assert build_config(20, argparse.Namespace(hidden=128, layers=4, heads=4)).max_position_embeddings == 256
