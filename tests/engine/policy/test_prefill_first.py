"""Prefill-first scheduling (SGLang's): prompts and decodes never share a step (pure Python)."""

from __future__ import annotations

import random

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
