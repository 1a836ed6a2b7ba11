"""Concrete prompt token ids: shared segments get equal ids, everything else its own."""

from __future__ import annotations

import pytest

from simulator.workload.load import load_workload
from simulator.workload.prompt_ids import prompt_ids
from simulator.workload.requests import Request


def test_requests_sharing_segments_share_exactly_those_ids() -> None:
    workload = load_workload("synthetic:num=40,prefixes=3,prefix_len=32,input=uniform(5,40),output=4,rate=10")
    prompts = {r.request_id: prompt_ids(r, 256, seed=1) for r in workload}
    by_prefix: dict[int, list[int]] = {}
    for r in workload:
        ids = prompts[r.request_id]
        assert len(ids) == r.prompt_tokens and all(0 <= i < 256 for i in ids)
        by_prefix.setdefault(r.segments[0], ids[:32])
        assert ids[:32] == by_prefix[r.segments[0]]  # the same system prompt, the same ids
    assert len({tuple(p) for p in by_prefix.values()}) == 3  # different system prompts differ
    tails = [tuple(prompts[r.request_id][32:]) for r in workload]
    assert len(set(tails)) == len(tails)  # every request's own input is its own


def test_multi_stage_users_repeat_their_whole_prompt() -> None:
    """users=M: each user sends the same question (segments of its own) each time."""
    workload = load_workload("synthetic:prefixes=3,users=2,prefix_len=20,input=30,output=5,arrival=constant,"
                             "stages=4x3+8x2")
    by_segments: dict[tuple, list[int]] = {}
    for r in workload:
        ids = prompt_ids(r, 1000, seed=0)
        assert by_segments.setdefault(r.segments, ids) == ids
    assert len(by_segments) == 6 and len({tuple(v) for v in by_segments.values()}) == 6


def test_ids_are_fixed_by_the_seed_and_a_short_prompt_cuts_its_segment() -> None:
    a = Request(0, 0.0, 100, 1, segments=(7, 8), segment_tokens=64)
    short = Request(1, 0.0, 40, 1, segments=(7,), segment_tokens=64)
    assert prompt_ids(a, 50, seed=3) == prompt_ids(a, 50, seed=3) != prompt_ids(a, 50, seed=4)
    assert prompt_ids(short, 50, seed=3) == prompt_ids(a, 50, seed=3)[:40]
    plain = [prompt_ids(Request(i, 0.0, 16, 1), 50, seed=3) for i in range(3)]
    assert len({tuple(p) for p in plain}) == 3
    with pytest.raises(ValueError, match="vocab size"):
        prompt_ids(a, 0)
    with pytest.raises(ValueError, match="seed"):
        prompt_ids(a, 50, seed=-1)
