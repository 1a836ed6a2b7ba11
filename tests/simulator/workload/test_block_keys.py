"""Exact block keys: equal keys exactly where the simulated tokens are equal, and a simulation with
them equals one that hashes every block's tokens."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from simulator.workload.block_keys import BlockKeys
from simulator.fleet.replica_runs import SAMPLED_TOKEN
from simulator.fleet.run import simulate
from simulator.fleet.sim_config import SimConfig
from simulator.workload.load import load_workload
from simulator.workload.requests import Request, make_workload
from tests.simulator.helpers import assert_same_simulation


def tokens_of(request: Request) -> list[int]:
    return request.prompt_token_ids() + [SAMPLED_TOKEN] * request.output_tokens


requests = st.builds(
    lambda rid, prompt, output, segments: (rid, prompt, output, segments),
    st.integers(0, 3), st.integers(1, 90), st.integers(0, 40),
    st.lists(st.integers(0, 2), max_size=5).map(tuple))


@settings(max_examples=200, deadline=None)
@given(st.lists(requests, min_size=2, max_size=6), st.sampled_from([4, 16]), st.sampled_from([5, 8, 16, 24]))
def test_keys_are_equal_exactly_where_tokens_are(rows, block_size, segment_tokens) -> None:
    keys = BlockKeys(block_size)
    made = [Request(rid, 0.0, prompt, output, segments, segment_tokens if segments else 0)
            for rid, prompt, output, segments in rows]
    tokens = [tokens_of(r) for r in made]
    block_keys = [keys.of(r) for r in made]
    for r, t, k in zip(made, tokens, block_keys):
        assert len(k) == len(t) // block_size
        assert len(set(k)) == len(k)  # positions never share a key
    for a in range(len(made)):
        for b in range(len(made)):
            for i in range(min(len(block_keys[a]), len(block_keys[b]))):
                same_tokens = tokens[a][:(i + 1) * block_size] == tokens[b][:(i + 1) * block_size]
                # A request id names one request: two rows with one id and different prompts are not a workload.
                if made[a].request_id == made[b].request_id and a != b and made[a] != made[b]:
                    continue
                assert (block_keys[a][i] == block_keys[b][i]) == same_tokens, (made[a], made[b], i)


@settings(max_examples=200, deadline=None)
@given(st.lists(requests, min_size=2, max_size=6), st.sampled_from([4, 16]), st.sampled_from([5, 8, 16, 24]))
def test_private_blocks_are_no_other_requests(rows, block_size, segment_tokens) -> None:
    """From first_private on, no other request's tokens through a block equal this one's: the
    promise the block pool's deferred registration relies on."""
    keys = BlockKeys(block_size)
    made = [Request(i, 0.0, prompt, output, segments, segment_tokens if segments else 0)
            for i, (_, prompt, output, segments) in enumerate(rows)]  # a workload: ids unique
    tokens = [tokens_of(r) for r in made]
    for a, r in enumerate(made):
        first = keys.first_private(r)
        if not r.segments:
            assert first == 0  # the unique token opens the prompt
        if first is None:
            assert r.prompt_tokens <= len(r.segments) * segment_tokens
            continue
        for b in range(len(made)):
            for i in range(first, min(len(tokens[a]), len(tokens[b])) // block_size):
                if b != a:
                    assert tokens[a][:(i + 1) * block_size] != tokens[b][:(i + 1) * block_size]
    assert keys.first_private(made[0]) is None  # its id again: the same tail, which it may hit


CASES = [
    # Small blocks and a full pool: where requests 0 and 1 once shared a token hash (-1 hashes as -2).
    ("synthetic:num=80,input=uniform(20,300),output=uniform(1,400),rate=20",
     dict(block_size=4, max_num_seqs=64, max_num_batched_tokens=256, num_gpu_blocks=2000)),
    ("synthetic:prefixes=3,prefix_len=200,users=40,input=uniform(5,50),output=uniform(5,200),rate=25",
     dict(replicas=2, router="prefix_affinity")),
    ("synthetic:num=200,input=uniform(20,900),output=uniform(1,300),rate=inf", dict(num_gpu_blocks=400,
                                                                                    max_model_len=2048)),
    ("synthetic:prefixes=4,prefix_len=60,users=30,input=uniform(1,40),output=uniform(20,120),rate=inf",
     dict(block_size=16, num_gpu_blocks=120, max_model_len=512)),
    ("synthetic:prefixes=2,prefix_len=100,users=20,input=uniform(5,40),output=uniform(5,60),rate=40",
     dict(speculative="ngram", num_speculative_tokens=3, acceptance=0.6)),
]


@pytest.mark.parametrize("spec, knobs", CASES)
def test_exact_keys_simulate_what_token_hashing_simulates(spec, knobs) -> None:
    config = SimConfig(model="llama-3.1-8b", hardware="a100-80gb", **knobs)
    keyed = simulate(config, load_workload(spec, seed=4))
    hashed = simulate(config, load_workload(spec, seed=4), exact_block_keys=False)
    assert_same_simulation(keyed, hashed, ("preemptions", "prefix_cache_hit_rate", "ttft_s", "e2e_s"))
    # Each case reuses cached blocks: shared prefixes hit them, and a preempted request's
    # readmission finds its own (which its cached-prompt-token count leaves out, as vLLM's does).
    assert keyed.summary.prefix_cache_hit_rate > 0 or keyed.summary.preemptions > 0


def test_exact_keys_on_identical_prompts_that_decode_identical_blocks() -> None:
    """Prompts made only of shared segments (cut at a segment's middle) fill equal decode blocks
    concurrently under preemption: the case where keys of two requests meet past their prompts."""
    rows = [(0.002 * k, 40 if k % 2 else 56, 60 + 7 * (k % 5), (1, 2, 3, 4, 5, 6)) for k in range(60)]
    config = SimConfig(model="llama-3.1-8b", hardware="a100-80gb", block_size=4, num_gpu_blocks=300,
                       max_model_len=512)
    keyed = simulate(config, make_workload("same", rows, segment_tokens=24))
    hashed = simulate(config, make_workload("same", rows, segment_tokens=24), exact_block_keys=False)
    pd.testing.assert_frame_equal(keyed.requests, hashed.requests, check_exact=False, rtol=1e-12)
    assert keyed.summary.preemptions == hashed.summary.preemptions > 0
