"""Prefill-first scheduling (SGLang's): prompts and decodes never share a step (pure Python)."""

from __future__ import annotations

import random

from pytest import approx

from engine.policy.config import CacheConfig, SchedulerConfig
from engine.policy.policies import SCHEDULER_POLICIES, scheduler_class
from engine.policy.prefill_first import PrefillFirstScheduler
from engine.policy.sampling_params import SamplingParams
from engine.policy.scheduler import NextStep, Scheduler
from engine.policy.sequence import Sequence


def make(policy="prefill-first", budget=10, seqs=8, blocks=64, block_size=4, chunked=True):
    return scheduler_class(policy)(SchedulerConfig(seqs, budget, 128, chunked), CacheConfig(block_size, blocks, False), (2,))


def add(s: Scheduler, rid: str, n: int, max_tokens: int = 4) -> Sequence:
    seq = Sequence(rid, list(range(10, 10 + n)), SamplingParams(max_tokens=max_tokens, ignore_eos=True), 0.0)
    s.add(seq)
    return seq


def step(s: Scheduler):
    out = s.schedule()
    s.update(out, {c.request_id: 5 for c in out.chunks if c.samples}, 0.0)
    return [(c.request_id, c.num_tokens, c.is_prefill) for c in out.chunks]


def test_a_prompt_that_can_run_displaces_the_decodes() -> None:
    s = make()
    add(s, "a", 6)
    assert step(s) == [("a", 6, True)]
    add(s, "b", 14)
    # vLLM's policy would decode a beside b's first chunk; prefill-first runs b's prompt alone,
    # over the whole budget, then its rest, and only then decodes both.
    assert step(s) == [("b", 10, True)]
    assert step(s) == [("b", 4, True)]
    assert step(s) == [("a", 1, False), ("b", 1, False)]
    vllm = make("vllm")
    add(vllm, "a", 6)
    step(vllm)
    add(vllm, "b", 14)
    assert step(vllm) == [("a", 1, False), ("b", 9, True)]


def test_an_unfinished_prompt_goes_before_newcomers_and_a_refused_head_lets_decodes_run() -> None:
    s = make(budget=8, seqs=2)
    add(s, "a", 12)
    add(s, "b", 3)
    assert step(s) == [("a", 8, True)]
    assert step(s) == [("a", 4, True), ("b", 3, True)]
    add(s, "c", 3)  # max_num_seqs=2: c cannot be admitted, so the running requests decode
    assert s.next_step() is NextStep.ONLY_DECODES
    assert step(s) == [("a", 1, False), ("b", 1, False)]


def test_steps_never_mix_prompts_and_decodes_and_every_request_finishes() -> None:
    rng = random.Random(3)
    s = make(budget=16, seqs=6, blocks=40)
    finished = added = 0
    for i in range(60):
        if rng.random() < 0.4:
            added += 1
            add(s, f"r{i}", rng.randint(1, 30), max_tokens=rng.randint(1, 12))
        out = s.schedule()
        kinds = {c.is_prefill for c in out.chunks}
        assert len(kinds) <= 1, out.chunks
        assert out.num_batched_tokens <= 16
        finished += len(s.update(out, {c.request_id: 5 for c in out.chunks if c.samples}, 0.0))
    while s.has_unfinished():
        out = s.schedule()
        assert len({c.is_prefill for c in out.chunks}) <= 1
        finished += len(s.update(out, {c.request_id: 5 for c in out.chunks if c.samples}, 0.0))
    assert added > 10 and finished == added and not s.waiting and not s.running


def test_the_registry_names_each_policy() -> None:
    assert SCHEDULER_POLICIES["prefill-first"] is PrefillFirstScheduler
    try:
        scheduler_class("fifo")
    except ValueError as exc:
        assert "prefill-first" in str(exc)
    else:
        raise AssertionError("an unknown policy must be refused")


def running_with_long_outputs(policy: str) -> Scheduler:
    """Two requests decoding, with 40 output tokens each still to come, in a 96-token pool."""
    s = make(policy, budget=16, seqs=8, blocks=24, block_size=4)
    for rid in ("a", "b"):
        add(s, rid, 8, max_tokens=41)
    while any(seq.num_output_tokens == 0 for seq in s.running) or s.waiting:
        step(s)
    return s


def test_sglang_admits_only_beside_a_reserve_for_the_running_outputs() -> None:
    # 96 tokens, 24 held by a and b (two blocks each and one for their next token): 72 free. vLLM
    # admits a 16-token prompt (its blocks fit); SGLang counts 0.7 x 2 x 40 = 56 reserved for a
    # and b's outputs, and 16 + 8 more of c's own: 80 >= 72, so c waits.
    vllm, sglang = running_with_long_outputs("vllm"), running_with_long_outputs("prefill-first")
    for s in (vllm, sglang):
        add(s, "c", 16, max_tokens=8)
    assert step(vllm) == [("a", 1, False), ("b", 1, False), ("c", 14, True)]
    assert step(sglang) == [("a", 1, False), ("b", 1, False)] and [q.request_id for q in sglang.waiting] == ["c"]
    # As they decode the ratio falls and their outputs shrink: c goes in before they finish.
    while sglang.waiting:
        step(sglang)
    assert all(seq.num_output_tokens < 41 for seq in sglang.running if seq.request_id in ("a", "b"))


def test_the_ratio_decays_per_decode_step_resets_when_idle_and_is_reestimated_after_a_retraction() -> None:
    from engine.policy.prefill_first import DECAY_STEPS, INIT_NEW_TOKEN_RATIO, MIN_FACTOR
    s = running_with_long_outputs("prefill-first")
    start = s.new_token_ratio
    step(s)
    per_step = INIT_NEW_TOKEN_RATIO * (1 - MIN_FACTOR) / DECAY_STEPS
    assert s.new_token_ratio == approx(start - per_step)
    s.decoded_in_bulk(10_000)  # the simulator's bulk steps move it as many
    assert s.new_token_ratio == approx(INIT_NEW_TOKEN_RATIO * MIN_FACTOR)
    while s.has_unfinished():
        step(s)
    step(s)
    assert s.new_token_ratio == INIT_NEW_TOKEN_RATIO  # idle: conservative again
    tight = make(budget=16, seqs=8, blocks=9, block_size=4)  # 36 tokens: three requests cannot all finish
    add(tight, "x", 4, max_tokens=12)
    add(tight, "y", 4, max_tokens=12)
    step(tight)
    add(tight, "z", 4, max_tokens=12)
    tight.new_token_ratio = 0.0  # no reserve: z goes in too, and the decodes run out of blocks
    preempted = []
    while tight.has_unfinished() and not preempted:
        out = tight.schedule()
        preempted = out.preempted
        tight.update(out, {c.request_id: 5 for c in out.chunks if c.samples}, 0.0)
    running = tight.running
    expected = (sum(r.num_output_tokens for r in running) + 20 * len(running)) / (12 * len(running) + 1)
    assert preempted and tight.new_token_ratio == approx(min(1.0, expected))
