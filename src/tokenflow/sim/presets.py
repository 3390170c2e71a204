"""Named hardware presets: raw config layers that a TOML file and overrides sit on top of.

Decode rates are vLLM-like and match the survey's figures: a 7B model emits ~6,300 output
tokens/s on one H100 with 512 sequences running, a 32B model ~1,250 (the survey says
"~1,200"; 1,250 is the rate its quoted step times imply). The step time is split into a part
that does not depend on the batch (reading the weights: 15 GB / 3.35 TB/s is ~5 ms for 7B;
the preset adds launch and sampling overhead) and a part per running sequence, solved so
that ``512 / t(512)`` is the quoted rate.

Training cost assumes ~8 N FLOPs per token (log-prob recompute 2 N, forward + backward 6 N)
at 40 % of an H100's ~990 dense bf16 TFLOP/s: 1.5e-4 s per token per GPU for 7.6B parameters,
6.6e-4 s for 32.8B. Weight sync: bf16 weights in 32 MiB buckets over a 40 GB/s broadcast;
an engine swaps them in at ~1 TB/s (a device-to-device copy).
"""

from __future__ import annotations

_BATCH = 512  # running sequences at which the quoted decode rates hold


def _decode(base_s: float, tokens_per_s: float) -> dict:
    return {"decode_step_base_s": base_s,
            "decode_step_per_seq_s": (_BATCH / tokens_per_s - base_s) / _BATCH,
            "max_running_seqs": _BATCH}


_H100_7B = {
    **_decode(0.012, 6300.0),
    "prefill_s_per_token": 3.3e-5,
    "train_s_per_token": 1.5e-4,
    "train_step_overhead_s": 2.0,
    "model_params": 7.6e9,
    "num_param_tensors": 339,
    "broadcast_bandwidth_gbps": 40.0,
}

_H100_32B = {
    **_decode(0.035, 1250.0),
    "prefill_s_per_token": 1.4e-4,
    "train_s_per_token": 6.6e-4,
    "train_step_overhead_s": 4.0,
    "model_params": 32.8e9,
    "num_param_tensors": 771,
    "broadcast_bandwidth_gbps": 40.0,
}

_BROADCAST = {"transport": "broadcast", "bucket_mb": 32.0}

PRESETS: dict[str, dict] = {
    "h100-7b-vllm": {"hardware": {"gpus": 8, "inference_gpus": 4, **_H100_7B},
                     "pipeline": _BROADCAST},
    "h100-32b-vllm": {"hardware": {"gpus": 16, "inference_gpus": 8, **_H100_32B},
                      "pipeline": _BROADCAST},
    "h100x64-7b-vllm": {"hardware": {"gpus": 64, "inference_gpus": 48, **_H100_7B},
                        "workload": {"prompts_per_step": 512, "group_size": 16},
                        "pipeline": _BROADCAST},
    "h100x64-32b-vllm": {"hardware": {"gpus": 64, "inference_gpus": 48, **_H100_32B},
                         "workload": {"prompts_per_step": 256, "group_size": 16},
                         "pipeline": _BROADCAST},
}
"""Preset name -> raw config layer (``{section: {key: value}}``)."""

PRESET_HELP = {
    "h100-7b-vllm": "7.6B model, 8 H100s (4 inference, 4 training), ~6,300 tok/s per engine",
    "h100-32b-vllm": "32.8B model, 16 H100s (8 inference, 8 training), ~1,250 tok/s per engine",
    "h100x64-7b-vllm": "7.6B model, 64 H100s (48 inference), 512 prompts x 16 per step",
    "h100x64-32b-vllm": "32.8B model, 64 H100s (48 inference), 256 prompts x 16 per step",
}
