"""Laws the simulated pipeline must obey."""

from __future__ import annotations

import itertools

import pytest

from tokenflow.sim import simulate


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.8, 1.0, 1.5, 3.0])
@pytest.mark.parametrize("p90", [200, 600])
@pytest.mark.slow
def test_trainer_idle_tends_to_one_minus_t_over_g(ideal, ratio, p90):
    """Free sync, unbounded staleness: trainer idle -> max(0, 1 - T/G)."""
    probe = ideal(workload__completion_p90=p90, hardware__train_step_s=1.0)
    # The engine emits 1 / b tokens/s whatever the batch, so G = tokens per step * b.
    mean_tokens = probe.workload.rollouts_per_step * _mean_completion(probe)
    G = mean_tokens * probe.hardware.decode_step_per_seq_s
    r = simulate(ideal(workload__completion_p90=p90, hardware__train_step_s=ratio * G,
                       sim__steps=60, sim__warmup_steps=10))
    assert r.trainer_idle_frac == pytest.approx(max(0.0, 1.0 - ratio), abs=0.04)


def _mean_completion(cfg) -> float:
    from tokenflow.sim.workload import LengthSampler

    return LengthSampler(cfg.workload, 0).mean_completion()


@pytest.mark.parametrize("transport", ["broadcast", "shared_memory"])
@pytest.mark.parametrize("mode", ["inflight", "abort", "drain", "blocking"])
def test_synchronous_step_is_generation_plus_training_plus_sync(ideal, mode, transport):
    """K = 0: step time = G + T + S, each computed by hand; S = the trainer's send S_t plus the
    engine's swap S_e (both transports: nothing runs concurrently, so nothing waits)."""
    cfg = ideal(pipeline__max_staleness=0, pipeline__update_mode=mode, pipeline__transport=transport,
                pipeline__bucket_mb=0.0, hardware__swap_bandwidth_gbps=100.0, hardware__swap_overhead_s=0.02,
                hardware__decode_step_base_s=0.01, hardware__prefill_s_per_token=1e-4,
                hardware__prefill_overhead_s=0.05, hardware__train_step_overhead_s=0.7,
                hardware__train_s_per_token=2e-4, hardware__model_bytes=2e9,
                hardware__broadcast_bandwidth_gbps=4.0, hardware__shared_memory_bandwidth_gbps=4.0,
                hardware__sync_latency_s=0.01,
                hardware__num_param_tensors=50, sim__steps=5, sim__warmup_steps=1)
    w, hw = cfg.workload, cfg.hardware
    n, L, P = w.rollouts_per_step, w.completion_median, w.prompt_length
    G = 0.05 + 1e-4 * w.prompts_per_step * P + L * (0.01 + hw.decode_step_per_seq_s * n)
    T = 0.7 + 2e-4 * n * (L + P) / hw.training_pool
    S_t = 2e9 / 4e9 + (50 if transport == "broadcast" else 1) * 0.01
    S_e = 2e9 / 100e9 + 0.02
    r = simulate(cfg)
    assert r.step_time_s == pytest.approx(G + T + S_t + S_e, rel=1e-6)
    assert r.step_breakdown_s["sync"] == pytest.approx(S_t, rel=1e-6)
    assert r.step_breakdown_s["wait_data"] == pytest.approx(S_e + G, rel=1e-6)
    assert r.staleness["max"] == 0


@pytest.mark.parametrize("mode", ["inflight", "abort", "drain", "blocking"])
@pytest.mark.slow
def test_deeper_buffer_never_lowers_throughput(small, mode):
    """Throughput (mean of three seeds) is non-decreasing in max_staleness, within 2 % of
    finite-run noise: drain flattens out once every update waits for the slowest running
    sequence, and there the seeds scatter by a few percent."""
    def rate(k: int) -> float:
        return sum(simulate(small(pipeline__max_staleness=k, pipeline__update_mode=mode, sim__seed=s,
                                  sim__steps=30, sim__warmup_steps=3)).tokens_per_s for s in range(3)) / 3

    rates = [rate(k) for k in range(5)]
    for lo, hi in itertools.pairwise(rates):
        assert hi >= 0.98 * lo, rates
    assert rates[-1] > 1.5 * rates[0], rates


@pytest.mark.parametrize("mode", ["inflight", "abort", "blocking"])
def test_long_tails_hurt_sync_more_than_async(small, mode):
    """Same median, longer p90: the synchronous pipeline loses a larger share of its throughput.
    (Not drain: it waits for the slowest running sequence at every update, as sync does.)"""
    def loss(k: int) -> float:
        short = simulate(small(pipeline__max_staleness=k, pipeline__update_mode=mode,
                               workload__completion_p90=1536)).tokens_per_s
        long = simulate(small(pipeline__max_staleness=k, pipeline__update_mode=mode,
                              workload__completion_p90=6144)).tokens_per_s
        return long / short

    sync, async_ = loss(0), loss(2)
    assert sync < async_ - 0.2, (sync, async_)


@pytest.mark.parametrize("mode", ["inflight", "abort"])
def test_admission_order_keeps_every_token_within_k(small, mode):
    """rollout.batch_order: taking the oldest admitted groups (and waiting for them) bounds the
    age by K; taking the oldest complete ones lets a long-tailed straggler be overtaken."""
    def run(order: str):
        return simulate(small(pipeline__max_staleness=1, pipeline__update_mode=mode, pipeline__batch_order=order,
                              workload__completion_p90=6144, sim__steps=20))

    ready, admission = run("ready"), run("admission")
    assert ready.staleness["max"] > 1
    assert admission.staleness["max"] <= 1
    assert admission.tokens_per_s > 0.5 * ready.tokens_per_s  # waiting costs some throughput, not the run
