"""Property tests of the block manager and scheduler, driven by a fake model that reads the KV cache.

The fake model stores each computed token at its KV slot and derives the next token from what it
reads back through the block table, so a wrong block table, a stale or wrongly shared cached block,
or a lost token changes the outputs.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.policy.config import CacheConfig, SchedulerConfig
from engine.policy.sampling_params import SamplingParams
from engine.policy.scheduler import Scheduler
from engine.policy.sequence import Sequence

VOCAB = 7


@dataclass
class Scenario:
    block_size: int
    num_blocks: int
    budget: int
    max_num_seqs: int
    chunked: bool
    requests: list[tuple[list[int], int, int]]  # prompt, max_tokens, arrival step
    aborts: list[tuple[int, int]]  # (step, request index)


@st.composite
def scenarios(draw) -> Scenario:
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    prefixes = [draw(st.lists(st.integers(0, VOCAB - 1), min_size=0, max_size=20)) for _ in range(2)]
    requests = []
    for _ in range(draw(st.integers(1, 8))):
        prefix = prefixes[draw(st.integers(0, 1))]
        tail = draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12))
        requests.append((prefix + tail, draw(st.integers(1, 12)), draw(st.integers(0, 10))))
    longest = max(len(p) + m for p, m, _ in requests)
    min_blocks = -(-longest // block_size)
    chunked = draw(st.booleans())
    budget = draw(st.integers(1, 48)) if chunked else 64
    aborts = draw(st.lists(st.tuples(st.integers(0, 40), st.integers(0, len(requests) - 1)), max_size=3))
    return Scenario(block_size, draw(st.integers(min_blocks, min_blocks * 2)), budget,
                    draw(st.integers(1, 6)), chunked, requests, aborts)


def run(sc: Scenario, prefix_caching: bool) -> dict[str, tuple[list[int], str]]:
    sched = Scheduler(SchedulerConfig(sc.max_num_seqs, sc.budget, 64, sc.chunked),
                      CacheConfig(sc.block_size, sc.num_blocks, prefix_caching), eos_token_ids=())
    bm = sched.block_manager
    kv: dict[int, int] = {}  # slot -> token stored there
    results: dict[str, tuple[list[int], str]] = {}
    seqs: dict[str, Sequence] = {}
    step = 0
    while step < 2000:
        for i, (prompt, max_tokens, arrival) in enumerate(sc.requests):
            if arrival == step:
                seq = Sequence(str(i), prompt, SamplingParams(max_tokens=max_tokens), float(step))
                sched.add(seq)
                seqs[seq.request_id] = seq
        for abort_step, i in sc.aborts:
            if abort_step == step and str(i) in sched.requests:
                sched.abort(str(i), float(step))
        if step > max(a for *_, a in sc.requests) and not sched.has_unfinished():
            break
        out = sched.schedule(float(step))
        assert out.num_batched_tokens <= sc.budget
        assert len(sched.running) <= sc.max_num_seqs
        assert len({c.request_id for c in out.chunks}) == len(out.chunks)
        sampled = {}
        for c in out.chunks:
            seq = seqs[c.request_id]
            bs, table = sc.block_size, seq.block_table
            assert len(table) * bs >= c.start + c.num_tokens, "block table does not cover the chunk"
            for p in range(c.start, c.start + c.num_tokens):
                kv[table[p // bs] * bs + p % bs] = seq.token_ids[p]
            if c.samples:
                context = [kv.get(table[p // bs] * bs + p % bs) for p in range(c.start + c.num_tokens)]
                assert context == seq.token_ids, "the KV cache does not hold the sequence's tokens"
                sampled[c.request_id] = hash(tuple(context)) % VOCAB
        sched.update(out, sampled, float(step))
        bm.check_invariants()
        assert all(r >= 0 for r in bm.ref_counts)
        step += 1
    assert not sched.has_unfinished(), "a request never finished"
    assert bm.num_used_blocks == 0, "blocks leaked"
    for rid, seq in seqs.items():
        assert seq.finished
        results[rid] = (seq.output_token_ids, seq.finish_reason)
    return results


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_every_request_finishes_without_leaks_and_prefix_hits_never_change_outputs(sc: Scenario) -> None:
    with_cache = run(sc, prefix_caching=True)
    without = run(sc, prefix_caching=False)
    # Aborts land on the same steps in both runs, but a cached run may finish a request sooner.
    for rid, (tokens, reason) in with_cache.items():
        other_tokens, other_reason = without[rid]
        if reason != "abort" and other_reason != "abort":
            assert tokens == other_tokens
            assert reason == other_reason == "length"
        n = min(len(tokens), len(other_tokens))
        assert tokens[:n] == other_tokens[:n]
