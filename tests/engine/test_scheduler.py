"""Scheduler and KV-cache bookkeeping: plain Python, no model."""

from __future__ import annotations

import pytest

from tokenflow.engine.builtin.cache.kv_cache import SlotAllocator, grown
from tokenflow.engine.sampling_params import SamplingParams
from tokenflow.engine.builtin.scheduler import Scheduler
from tokenflow.engine.builtin.sequence import Sequence, SequenceGroup, SequenceStatus


def group(rid: str, prompt_len: int = 4, n: int = 1, max_tokens: int = 8, stop=()) -> SequenceGroup:
    params = SamplingParams(n=n, max_tokens=max_tokens, stop_token_ids=stop)
    prompt = list(range(3, 3 + prompt_len))
    seqs = [Sequence(rid, i, params, seed=1, prompt_ids=prompt, token_ids=list(prompt),
                     stop_ids=frozenset(stop)) for i in range(n)]
    return SequenceGroup(rid, seqs)


def step(sched: Scheduler, batch, token: int = 50):
    k = len(batch.seqs)
    return sched.postprocess(batch.seqs, [token] * k, [-1.0] * k, [0.0] * k, None, version=3)


def test_allocator_keeps_slots_packed():
    alloc = SlotAllocator(4)
    assert alloc.allocate(3) == [0, 1, 2]
    assert alloc.free(0) == (2, 0)  # last used slot moves into the hole
    assert alloc.free(1) is None  # freeing the last used slot moves nothing
    assert alloc.num_used == 1 and alloc.allocate(3) == [1, 2, 3]
    with pytest.raises(RuntimeError):
        alloc.allocate(1)
    with pytest.raises(RuntimeError):
        SlotAllocator(2).free(0)


def test_growth_doubles_rounds_and_caps():
    assert grown(10, 0, 512, 64) == 64
    assert grown(65, 64, 512, 64) == 128
    assert grown(129, 128, 300, 64) == 256
    assert grown(290, 256, 300, 64) == 300
    assert grown(20, 64, 512, 64) == 64
    with pytest.raises(RuntimeError):
        grown(301, 256, 300, 64)


def test_prefill_first_then_decode_and_fifo_admission():
    sched = Scheduler(max_num_seqs=4, max_num_batched_tokens=100, max_model_len=64)
    for g in (group("a", n=2), group("b", n=3), group("c", n=1)):
        sched.add(g)
    batch = sched.schedule()
    # b (n=3) does not fit next to a (2 of 4 slots left); c must not overtake it.
    assert batch.kind == "prefill" and [g.request_id for g in batch.groups] == ["a"]
    assert [s.slot for s in batch.seqs] == [0, 1]
    step(sched, batch)
    batch = sched.schedule()
    assert batch.kind == "decode" and len(batch.seqs) == 2
    assert sched.num_waiting == 4 and sched.num_running == 2


def test_token_budget_limits_one_prefill():
    sched = Scheduler(max_num_seqs=8, max_num_batched_tokens=20, max_model_len=64)
    for rid in "abc":
        sched.add(group(rid, prompt_len=8))
    batch = sched.schedule()  # 2 prompts x 8 tokens fit 20, a third would be 24
    assert [g.request_id for g in batch.groups] == ["a", "b"]
    big = Scheduler(max_num_seqs=8, max_num_batched_tokens=4, max_model_len=64)
    big.add(group("x", prompt_len=10))
    assert big.schedule().groups[0].request_id == "x"  # an oversized prompt still runs alone


def test_requests_join_and_leave_at_every_step_with_moves():
    sched = Scheduler(max_num_seqs=3, max_num_batched_tokens=100, max_model_len=64)
    sched.add(group("short", max_tokens=2))
    sched.add(group("long", n=2, max_tokens=5))
    sched.add(group("late", max_tokens=3))
    batch = sched.schedule()
    assert [g.request_id for g in batch.groups] == ["short", "long"]
    step(sched, batch)  # first token of each sample
    batch = sched.schedule()
    assert batch.kind == "decode"
    finished = step(sched, batch)
    assert [s.request_id for s in finished] == ["short"]
    assert finished[0].finish_reason == "length" and finished[0].versions == [3, 3]
    # "short" sat in slot 0: the sample in the last slot moved there, and the move is recorded.
    assert sched.take_moves() == [(2, 0, 5)]  # 5 cached positions (4 prompt + 1)
    assert [s.slot for s in sched.running] == [0, 1]
    assert all(s.slot == i for i, s in enumerate(sched.running))
    batch = sched.schedule()  # the freed slot is refilled at once
    assert batch.kind == "prefill" and batch.groups[0].request_id == "late"
    assert batch.seqs[0].slot == 2


def test_stop_token_and_context_limit():
    sched = Scheduler(max_num_seqs=2, max_num_batched_tokens=100, max_model_len=6)
    sched.add(group("stop", stop=(7,)))
    sched.add(group("ctx", max_tokens=50))
    batch = sched.schedule()
    k = len(batch.seqs)
    finished = sched.postprocess(batch.seqs, [7, 9], [0.0] * k, [0.0] * k, None, 0)
    assert [(s.request_id, s.finish_reason) for s in finished] == [("stop", "stop")]
    batch = sched.schedule()
    finished = step(sched, batch)
    assert finished[0].finish_reason == "length" and finished[0].num_tokens == 6
    assert not sched.has_unfinished()


def test_abort_and_drain():
    sched = Scheduler(max_num_seqs=4, max_num_batched_tokens=100, max_model_len=64)
    sched.add(group("a", n=2))
    sched.add(group("b"))
    step(sched, sched.schedule())
    sched.add(group("w"))
    aborted = sched.abort_request("a")
    assert {s.sample_index for s in aborted} == {0, 1}
    assert all(s.finish_reason == "abort" and s.status is SequenceStatus.FINISHED for s in aborted)
    assert [s.request_id for s in sched.running] == ["b"] and sched.running[0].slot == 0
    assert sched.abort_request("w")[0].slot == -1 and sched.num_waiting == 0
    sched.add(group("x"))
    sched.admitting = False  # draining: nothing new starts
    assert sched.schedule().kind == "decode"
    assert [s.request_id for s in sched.abort_running()] == ["b"]
    assert sched.schedule() is None and sched.num_waiting == 1
    sched.admitting = True
    assert sched.schedule().kind == "prefill"


def test_kv_cache_grows_in_place_and_stops_at_what_sequences_can_reach():
    import torch

    from tokenflow.engine.builtin.cache.kv_cache import KVCache

    cache = KVCache(num_layers=2, num_kv_heads=1, head_dim=2, max_slots=16, max_len=300,
                    dtype=torch.float32, device=torch.device("cpu"), growth=64)
    assert (cache.slots, cache.capacity) == (8, 64)  # slots round up to 8
    cache.k[1][0, 0, 5] = torch.tensor([1.0, 2.0])
    cache.ensure(3, 65)
    assert (cache.slots, cache.capacity) == (8, 128) and cache.k[1][0, 0, 5].tolist() == [1.0, 2.0]
    assert cache.k[1].abs().sum() == 3 and cache.v[0].abs().sum() == 0  # new space is zeroed
    cache.ensure(3, 129, longest=150)  # doubling would give 256
    assert cache.capacity == 150
    cache.k[0][2, 0, 7] = 4.0
    cache.move(2, 0, 8)
    assert cache.k[0][0, 0, 7].tolist() == [4.0, 4.0]


def test_kv_cache_grows_one_tensor_at_a_time(monkeypatch):
    """While the cache grows, each old key or value tensor is dropped once copied, so the
    memory it takes is one cache and one tensor, not two whole caches."""
    import weakref

    import torch

    from tokenflow.engine.builtin.cache.kv_cache import KVCache

    cache = KVCache(num_layers=4, num_kv_heads=1, head_dim=2, max_slots=16, max_len=300,
                    dtype=torch.float32, device=torch.device("cpu"), growth=64)
    cache.k[3][1, 0, 9] = torch.tensor([5.0, 6.0])
    old = [weakref.ref(t) for t in cache.k + cache.v]
    alive_at_each_allocation = []
    empty = torch.empty

    def counting_empty(*args, **kwargs):
        alive_at_each_allocation.append(sum(r() is not None for r in old))
        return empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", counting_empty)
    cache.ensure(9, 100)
    monkeypatch.setattr(torch, "empty", empty)
    assert len(alive_at_each_allocation) == 8  # a key and a value tensor per layer
    # the j-th new tensor is made once j old ones are gone: one cache and one tensor at most,
    # where growing them all first would hold both caches whole ([8, 8, ..., 8])
    assert alive_at_each_allocation == [8 - j for j in range(8)], alive_at_each_allocation
    assert all(r() is None for r in old)
    assert (cache.slots, cache.capacity) == (16, 128) and cache.k[3][1, 0, 9].tolist() == [5.0, 6.0]
