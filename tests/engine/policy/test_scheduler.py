"""Token-budget continuous batching, chunked prefill and preemption (pure Python)."""

from __future__ import annotations

import pytest

from engine.policy.config import CacheConfig, SchedulerConfig
from engine.policy.sampling_params import SamplingParams
from engine.policy.scheduler import NextStep, Scheduler
from engine.policy.sequence import Sequence


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


def test_a_readmitted_request_counts_its_cached_prompt_tokens_once() -> None:
    # b's blocks stay registered in the prefix cache when it is preempted, so its readmission hits
    # its own prompt and outputs: counted again, b's cached tokens would pass its prompt's length.
    s = make(budget=64, blocks=6, block_size=4, caching=True)
    a = add(s, "a", 8, max_tokens=12)
    b = add(s, "b", 8, max_tokens=12)
    for _ in range(6):
        run_step(s)
    assert b.num_preemptions == 1 and b.num_cached_prompt_tokens == 0
    while s.has_unfinished():
        run_step(s)
    assert b.num_preemptions >= 1 and a.num_cached_prompt_tokens == b.num_cached_prompt_tokens == 0


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


@pytest.mark.parametrize("chunked, seed", [(True, 0), (True, 1), (False, 2)])
def test_next_step_predicts_the_next_step(chunked, seed) -> None:
    """next_step() (which the simulator trusts to take decode steps in bulk) says exactly whether
    the next schedule() only decodes -- every running request one token, no preemption, no
    admission -- or decodes the same way and admits beside them, through tight pools, shared cached
    prefixes, capped prompt chunks and preemptions; only_decodes_next() is the first of these."""
    import random

    rng = random.Random(seed)
    if chunked:
        s = make(budget=24, seqs=6, blocks=40, block_size=4, max_len=96, eos=())
        prefix_len, suffix_len, output_len, arrivals = (8, 30), (1, 12), (1, 30), [0, 0, 0, 1, 2]
    else:  # a whole prompt must fit a step: the running requests' decodes leave long ones waiting
        s = make(budget=48, seqs=6, blocks=30, block_size=4, chunked=False, caching=False, max_len=48, eos=())
        prefix_len, suffix_len, output_len, arrivals = (18, 28), (1, 11), (2, 12), [0, 0, 0, 1, 2]
    prefixes = [[rng.randrange(3, 9) for _ in range(rng.randrange(*prefix_len))] for _ in range(3)]
    outcomes = {True: 0, False: 0}
    waiting_refused = admitting = 0
    for step in range(3000):
        for _ in range(rng.choice(arrivals)):
            prompt = rng.choice(prefixes) + [rng.randrange(3, 9) for _ in range(rng.randrange(*suffix_len))]
            s.add(Sequence(f"r{step}-{rng.random()}", prompt,
                           SamplingParams(max_tokens=rng.randrange(*output_len), ignore_eos=True), 0.0))
        running = [seq.request_id for seq in s.running]
        kind = s.next_step()
        predicted = s.only_decodes_next()
        assert predicted == (kind is NextStep.ONLY_DECODES)
        out = s.schedule()
        decodes = out.chunks[:len(running)]
        all_decode = (not out.preempted and [c.request_id for c in decodes] == running
                      and all(c.num_tokens == 1 and not c.is_prefill for c in decodes))
        only_decodes = all_decode and len(out.chunks) == len(running)
        assert predicted == only_decodes, step
        assert (kind is NextStep.DECODES_AND_ADMISSIONS) == (all_decode and len(out.chunks) > len(running)), step
        outcomes[predicted] += 1
        admitting += kind is NextStep.DECODES_AND_ADMISSIONS
        waiting_refused += predicted and bool(s.waiting)
        s.update(out, {c.request_id: 1 for c in out.chunks if c.samples}, float(step))
    assert min(outcomes.values()) > 200 and waiting_refused > 100 and admitting > 100, \
        (outcomes, waiting_refused, admitting)
    assert s.num_preemptions > 0


def test_without_chunking_a_prompt_longer_than_the_budget_left_only_decodes_next() -> None:
    """Four running requests take four tokens of a 16-token budget: a 14-token prompt waits, however
    many blocks are free."""
    s = make(budget=16, seqs=8, blocks=64, block_size=4, chunked=False, max_len=16, eos=())
    for i in range(4):
        add(s, f"r{i}", 3, max_tokens=8, ignore_eos=True)
    run_step(s)
    add(s, "long", 14, max_tokens=2, ignore_eos=True)
    assert s.only_decodes_next()
    out, _ = run_step(s)
    assert [(c.request_id, c.num_tokens) for c in out.chunks] == [(f"r{i}", 1) for i in range(4)]
    assert s.waiting[0].request_id == "long"
