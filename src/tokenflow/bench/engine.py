"""`tokenflow bench engine`: engine backends against transformers' `generate()`.

A GRPO-shaped workload: P prompts x G samples at temperature 1, each prompt's ``max_tokens``
drawn from a lognormal (median ~32, capped at --max-tokens) so a few stragglers run much longer
than the rest. Both sides get the same weights, prompts and sampling settings; EOS is ignored
on both so every request produces exactly its ``max_tokens`` and the work is well defined.

* engine (each backend in ``--backend``, default the built-in one): every prompt is one
  request with n = G, its own max_tokens; continuous batching refills freed slots at every
  step. The backends load the same weights from one saved model folder.
* transformers: one ``generate()`` call over all prompts (left-padded) with
  ``num_return_sequences=G`` and ``max_new_tokens`` = the largest max_tokens, as an HF user
  would write it; it cannot stop a request at its own length, so only the tokens each request
  asked for are counted on both sides.

For a mixture-of-experts model (``--moe``, or a MoE folder) the engine also runs with routing
recording switched off, alternating with the recorded runs (which goes first swaps every
repeat), and the recording's cost is
printed as ``routing_record_overhead_pct`` (recorded vs not, fastest run of each).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

logger = logging.getLogger(__name__)


def register(subparsers) -> None:
    p = subparsers.add_parser("engine", help="engine backends vs transformers generate() throughput")
    p.add_argument("--backend", default="builtin",
                   help="comma-separated engine backends to run: builtin, vllm (e.g. builtin,vllm)")
    p.add_argument("--model", default=None,
                   help="HF model folder; 'default' = the packaged default model; "
                        "omitted = a random ~4M-parameter Llama built here")
    p.add_argument("--prompts", type=int, default=64, help="number of prompts")
    p.add_argument("--samples", type=int, default=8, help="samples per prompt (n)")
    p.add_argument("--max-tokens", type=int, default=128, help="cap on each request's completion length")
    p.add_argument("--max-num-seqs", type=int, default=512, help="engine: sequences decoded together")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (both sides)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "native"], default="float32",
                   help="native: bfloat16 where the device multiplies it in hardware, else float32")
    p.add_argument("--device", choices=["cpu", "cuda", "auto"], default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=1,
                   help="alternate engine / transformers runs this many times and keep each "
                        "side's fastest (steadier numbers on a shared machine)")
    p.add_argument("--moe", action="store_true",
                   help="with no --model: a random ~11M-parameter Qwen3-MoE (8 experts, top-2) instead of the Llama")
    p.add_argument("--skip-hf", action="store_true", help="run only the engine")
    p.add_argument("--floors", action="store_true",
                   help="also measure this machine's memory-bandwidth and matmul floors for the model "
                        "(tokenflow.bench.floors) and each side's share of the decode floor")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def _tiny_llama(seed: int):
    """A random ~4M-parameter Llama (vocab 4096, hidden 256, 4 layers, GQA 8/4, tied)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval(), "random Llama (built here)"


def _tiny_moe(seed: int):
    """A random Qwen3-MoE: vocab 4096, hidden 256, 4 layers of 8 experts (top-2), GQA 8/4, tied."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    cfg = Qwen3MoeConfig(vocab_size=4096, hidden_size=256, intermediate_size=768, moe_intermediate_size=384,
                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, head_dim=32,
                         num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=512,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # routers spread over the experts, not all ties (transformers' init)
        for m in model.modules():
            if hasattr(m, "experts") and hasattr(m, "gate"):
                m.gate.weight.normal_(0.0, cfg.hidden_size**-0.5)
    return model, "random Qwen3-MoE (built here)"


def _load_model(args):
    from transformers import AutoModelForCausalLM

    if args.model is None:
        return _tiny_moe(args.seed) if args.moe else _tiny_llama(args.seed)
    path = args.model
    from tokenflow.errors import InputError
    from tokenflow.model_store import MODEL_NAMES, resolve_model_path

    if path in MODEL_NAMES:  # "default", "default-moe", "default-tool", "smollm2-135m-instruct"
        try:
            path = resolve_model_path(path)
        except (FileNotFoundError, InputError) as e:
            raise SystemExit(f"--model {args.model}: {e}") from None
    return AutoModelForCausalLM.from_pretrained(path).eval(), path


def _workload(args, vocab: int):
    import numpy as np

    rng = np.random.default_rng(args.seed)
    lengths = rng.integers(16, 65, size=args.prompts)
    prompts = [rng.integers(3, vocab, size=n).tolist() for n in lengths]
    max_tokens = np.clip(np.round(rng.lognormal(np.log(32), 0.75, size=args.prompts)), 1, args.max_tokens)
    return prompts, [int(m) for m in max_tokens]


def _make_engine(args, backend: str, folder: str, record_routing: bool = True):
    from tokenflow.engine import EngineConfig
    from tokenflow.engine.factory import make_engine

    config = EngineConfig(backend=backend, device=args.device, dtype=args.dtype, threads=args.threads,
                          max_num_seqs=args.max_num_seqs, seed=args.seed, record_routing=record_routing)
    return make_engine(folder, config)


def _run_engine(args, engine, prompts, max_tokens) -> dict:
    import time

    from tokenflow.engine import SamplingParams
    from tokenflow.engine.stats import EngineStats

    params = [SamplingParams(temperature=1.0, n=args.samples, max_tokens=m, ignore_eos=True)
              for m in max_tokens]
    engine.generate(prompts[:2], SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
    engine.stats = EngineStats()
    start = time.perf_counter()
    results = engine.generate(prompts, params)
    seconds = time.perf_counter() - start
    tokens = sum(r.num_tokens for group in results for r in group)
    st = engine.stats
    recorded = sum(r.routed_experts is not None for group in results for r in group)
    return {"seconds": seconds, "tokens": tokens, "decode_steps": st.decode_steps, "recorded": recorded,
            "prefill_steps": st.prefill_steps,
            "mean_decode_step_ms": 1e3 * st.mean_decode_step_seconds,
            "prefill_seconds": st.prefill_seconds}


def _run_hf(args, hf_model, prompts, max_tokens) -> dict:
    import time

    import torch

    longest = max(len(p) for p in prompts)
    pad = 0
    device = next(hf_model.parameters()).device
    ids = torch.tensor([[pad] * (longest - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts], device=device)
    hf_model.generation_config.eos_token_id = None
    kwargs = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
              "max_new_tokens": max(max_tokens), "num_return_sequences": args.samples,
              "pad_token_id": pad, "eos_token_id": None}
    with torch.inference_mode():
        hf_model.generate(ids[:2], attention_mask=mask[:2], **{**kwargs, "max_new_tokens": 4})
        start = time.perf_counter()
        out = hf_model.generate(ids, attention_mask=mask, **kwargs)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    generated = out.shape[1] - longest
    if generated != max(max_tokens):
        logger.warning("transformers generated %d tokens per sequence, expected %d", generated, max(max_tokens))
    # Count what each request asked for, as for the engine (the rest is straggler padding).
    tokens = sum(min(m, generated) * args.samples for m in max_tokens)
    return {"seconds": seconds, "tokens": tokens, "generated_including_waste": out.shape[0] * generated}


def run(args: argparse.Namespace) -> int:
    import json
    import tempfile

    import torch

    backends = [b.strip() for b in args.backend.split(",") if b.strip()]
    from tokenflow.engine.backends import ENGINES

    unknown = [b for b in backends if b not in ENGINES]
    if unknown or not backends:
        print(f"error: --backend takes a comma-separated list of {ENGINES.names()}, got {args.backend!r}",
              file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.dtype == "native":
        from tokenflow.precision import native_dtype

        args.dtype = native_dtype(args.device)  # the JSON and both sides name what ran
    hf_model, source = _load_model(args)
    if args.dtype == "bfloat16":
        hf_model = hf_model.to(torch.bfloat16)
    if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()):
        hf_model = hf_model.to("cuda")  # both sides on the same device
    vocab = hf_model.config.vocab_size
    prompts, max_tokens = _workload(args, vocab)
    params_m = sum(p.numel() for p in hf_model.parameters()) / 1e6
    logger.info("bench engine: %s, %.1fM params, %d prompts x %d samples, %d requested tokens",
                source, params_m, len(prompts), args.samples, args.samples * sum(max_tokens))
    with tempfile.TemporaryDirectory(prefix="tokenflow-bench-") as folder:
        hf_model.save_pretrained(folder)  # every backend loads the same weights from one folder
        engines = {b: _make_engine(args, b, folder) for b in backends}
        runs: dict[str, list[dict]] = {b: [] for b in backends}
        hf_runs, unrecorded = [], []
        no_record = None  # the built-in engine without the routing record (MoE models only)

        def run_unrecorded(rep: int) -> None:
            nonlocal no_record
            if no_record is None:
                no_record = _make_engine(args, "builtin", folder, record_routing=False)
            logger.info("run %d/%d: the built-in engine, routing not recorded ...", rep + 1, args.repeat)
            unrecorded.append(_run_engine(args, no_record, prompts, max_tokens))

        for rep in range(args.repeat):
            # A MoE model also runs without the routing record; the two swap order every repeat
            # so neither always gets the first (or the second) slot on a machine whose load drifts.
            if rep % 2 and unrecorded:
                run_unrecorded(rep)
            for b in backends:
                logger.info("run %d/%d: engine backend %s ...", rep + 1, args.repeat, b)
                runs[b].append(_run_engine(args, engines[b], prompts, max_tokens))
            if "builtin" in backends and runs["builtin"][-1]["recorded"] and not (rep % 2 and unrecorded):
                run_unrecorded(rep)
            if not args.skip_hf:
                logger.info("run %d/%d: transformers generate() ...", rep + 1, args.repeat)
                hf_runs.append(_run_hf(args, hf_model, prompts, max_tokens))
        for engine in [*engines.values(), *([no_record] if no_record is not None else [])]:
            engine.close()
    best = {b: min(r, key=lambda x: x["seconds"]) for b, r in runs.items()}
    rate = {b: best[b]["tokens"] / best[b]["seconds"] for b in backends}
    result = {
        "model": source,
        "params_millions": round(params_m, 2),
        "prompts": len(prompts),
        "samples": args.samples,
        "requested_tokens": args.samples * sum(max_tokens),
        "max_tokens_mean": sum(max_tokens) / len(max_tokens),
        "max_tokens_max": max(max_tokens),
        "threads": torch.get_num_threads(),
        "dtype": args.dtype,
        "device": str(next(hf_model.parameters()).device),
        "load_average": os.getloadavg()[0],
        "repeat": args.repeat,
        "backends": backends,
    }
    # The built-in engine keeps the historical "engine_*" keys; other backends are prefixed.
    for b in backends:
        key = "engine" if b == "builtin" else b
        r = best[b]
        result.update({
            f"{key}_seconds": round(r["seconds"], 3),
            f"{key}_seconds_all": [round(x["seconds"], 3) for x in runs[b]],
            f"{key}_tokens_per_s": round(rate[b], 1),
            f"{key}_mean_decode_step_ms": round(r["mean_decode_step_ms"], 3),
            f"{key}_decode_steps": r["decode_steps"],
        })
    if "builtin" in backends:
        result["engine_prefill_steps"] = best["builtin"]["prefill_steps"]
        result["engine_how"] = (f"continuous batching, max_num_seqs={args.max_num_seqs}, one request per "
                                f"prompt with n={args.samples} (shared prefill), per-request max_tokens")
    if "vllm" in backends:
        result["vllm_how"] = ("vLLM in this process, one request per sample (n=1 each, seeds per "
                              "sample), prefix caching off, processed log-probs returned")
    if "builtin" in backends and "vllm" in backends:
        result["vllm_vs_builtin"] = round(rate["vllm"] / rate["builtin"], 3)
    if unrecorded:
        off = min(unrecorded, key=lambda r: r["seconds"])
        on_tps, off_tps = rate["builtin"], off["tokens"] / off["seconds"]
        result.update({
            "engine_routing_recorded": True,
            "engine_seconds_no_routing_all": [round(r["seconds"], 3) for r in unrecorded],
            "engine_tokens_per_s_no_routing": round(off_tps, 1),
            "routing_record_overhead_pct": round(100 * (off_tps / on_tps - 1), 2),
        })
    if hf_runs:
        hf = min(hf_runs, key=lambda r: r["seconds"])
        hf_rate = hf["tokens"] / hf["seconds"]
        for b in backends:
            result["speedup" if b == "builtin" else f"{b}_speedup"] = round(rate[b] / hf_rate, 3)
        result.update({
            "hf_generate_seconds": round(hf["seconds"], 3),
            "hf_generate_seconds_all": [round(r["seconds"], 3) for r in hf_runs],
            "hf_generate_tokens_per_s": round(hf["tokens"] / hf["seconds"], 1),
            "hf_generate_how": (f"one generate() call, {len(prompts)} left-padded prompts, "
                                f"num_return_sequences={args.samples}, max_new_tokens="
                                f"{max(max_tokens)}, do_sample, top_k=0, top_p=1; counted "
                                "tokens = each request's max_tokens"),
        })
    if args.floors and next(hf_model.parameters()).device.type != "cpu":
        result["floors"] = "measured on a CPU only"
    elif args.floors:
        from tokenflow.bench.floors import floors

        peak = min(args.max_num_seqs, args.prompts * args.samples)  # the widest decode step
        f = floors(hf_model, args.dtype, peak, args.threads)
        result["floors"] = f
        for b in backends:
            key = "engine" if b == "builtin" else b
            result[f"{key}_of_decode_floor"] = round(rate[b] / f["decode_floor_tokens_per_s"], 3)
        if hf_runs:
            result["hf_generate_of_decode_floor"] = round(result["hf_generate_tokens_per_s"]
                                                          / f["decode_floor_tokens_per_s"], 3)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>28}: {value}")
    return 0
