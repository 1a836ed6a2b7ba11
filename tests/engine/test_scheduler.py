"""Token-budget continuous batching, chunked prefill and preemption (pure Python)."""

from __future__ import annotations

import pytest

from engine.config import CacheConfig, SchedulerConfig
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence


def make(budget=16, seqs=8, blocks=64, block_size=4, chunked=True, caching=True, max_len=128, eos=(2,)):
    return Scheduler(SchedulerConfig(seqs, budget, max_len, chunked), CacheConfig(block_size, blocks, caching), eos)


def add(s: Scheduler, rid: str, n: int, max_tokens: int = 4, **kw) -> Sequence:
    seq = Sequence(rid, list(range(10, 10 + n)), SamplingParams(max_tokens=max_tokens, **kw), 0.0)
    s.add(seq)
    return seq


def run_step(s: Scheduler, token: int = 5):
    out = s.schedule()
    return out, s.update(out, {c.request_id: token for c in out.chunks if c.samples}, 0.0)


def test_running_requests_go_first_and_share_the_budget() -> None:
    s = make(budget=10, caching=False)
    add(s, "a", 6)
    out, _ = run_step(s)
    assert [(c.request_id, c.num_tokens, c.is_prefill) for c in out.chunks] == [("a", 6, True)]
    add(s, "b", 20)
    out, _ = run_step(s)
    # a decodes one token; b's prompt is chunked into the remaining 9.
    assert [(c.request_id, c.num_tokens, c.is_prefill, c.samples) for c in out.chunks] == [
        ("a", 1, False, True), ("b", 9, True, False)]
    out, _ = run_step(s)
    assert [(c.request_id, c.start, c.num_tokens) for c in out.chunks] == [("a", 7, 1), ("b", 9, 9)]


def test_without_chunking_a_prompt_waits_for_a_whole_budget() -> None:
    s = make(budget=128, chunked=False)
    add(s, "a", 100)
    add(s, "b", 60)
    out, _ = run_step(s)
    assert [c.request_id for c in out.chunks] == ["a"]  # b does not fit the 28 left
    with pytest.raises(ValueError, match="chunked prefill"):
        make(budget=16, chunked=False, max_len=128)


def test_max_num_seqs_caps_the_batch() -> None:
    s = make(seqs=2)
    for r in "abc":
        add(s, r, 2)
    out, _ = run_step(s)
    assert len(out.chunks) == 2 and len(s.waiting) == 1


def test_preemption_takes_the_most_recently_admitted_request() -> None:
    s = make(budget=64, blocks=6, block_size=4, caching=False)
    a = add(s, "a", 8, max_tokens=12)
    b = add(s, "b", 8, max_tokens=12)
    run_step(s)  # both admitted: 4 blocks used
    for _ in range(4):
        run_step(s)  # positions 8..11: each holds 3 blocks, the pool of 6 is full
    assert a.num_preemptions == b.num_preemptions == 0
    out, _ = run_step(s)  # position 12 needs a fourth block: b (admitted last) makes room
    assert out.preempted == ["b"] and [c.request_id for c in out.chunks] == ["a"]
    assert b.num_preemptions == 1 and b.num_computed_tokens == 0 and list(s.waiting) == [b]
    assert b.num_output_tokens == 5  # generated tokens are kept and recomputed, not lost
    while s.has_unfinished():
        run_step(s)
    assert a.finish_reason == "length" and b.finish_reason == "length"
    assert b.num_output_tokens == 12
    s.block_manager.check_invariants()
    assert s.block_manager.num_used_blocks == 0


def test_stop_conditions() -> None:
    s = make()
    eos = add(s, "eos", 3, max_tokens=10)
    ignore = add(s, "ignore", 3, max_tokens=3, ignore_eos=True)
    stop = add(s, "stop", 3, max_tokens=10, stop_token_ids=(7,))
    out = s.schedule()
    s.update(out, {"eos": 2, "ignore": 2, "stop": 7}, 1.0)
    assert eos.finish_reason == "stop" and stop.finish_reason == "stop" and ignore.finish_reason is None
    while s.has_unfinished():
        run_step(s, token=2)
    assert ignore.finish_reason == "length" and ignore.output_token_ids == [2, 2, 2]


def test_abort_at_any_time_frees_blocks() -> None:
    s = make(budget=4)
    add(s, "a", 10)
    add(s, "b", 3)
    run_step(s)  # a is mid-prefill
    s.abort("a", 0.0)
    s.abort("b", 0.0)  # still waiting
    assert not s.has_unfinished() and s.block_manager.num_used_blocks == 0
    with pytest.raises(ValueError, match="no unfinished request"):
        s.abort("a", 0.0)


def test_requests_that_can_never_run_are_refused() -> None:
    s = make(blocks=4, block_size=4, max_len=64)
    with pytest.raises(ValueError, match="empty prompt"):
        add(s, "e", 0)
    with pytest.raises(ValueError, match="max_model_len"):
        add(s, "long", 60, max_tokens=10)
    with pytest.raises(ValueError, match="KV blocks"):
        add(s, "big", 17, max_tokens=1)
    add(s, "ok", 3)
    with pytest.raises(ValueError, match="already in use"):
        add(s, "ok", 3)
    assert list(s.requests) == ["ok"]
