"""Block pool, reference counts and prefix caching (pure Python)."""

from __future__ import annotations

import pytest

from engine.policy.block_manager import BlockManager
from engine.policy.sampling_params import SamplingParams
from engine.policy.sequence import Sequence
from tests.engine.policy.block_helpers import admit


def seq(tokens, rid="r"):
    return Sequence(rid, list(tokens), SamplingParams(max_tokens=4), 0.0)


def test_allocation_is_all_or_nothing() -> None:
    bm = BlockManager(num_blocks=4, block_size=4, enable_prefix_caching=False)
    a = seq(range(10), "a")
    assert bm.allocate_slots(a, 10)  # 3 blocks
    b = seq(range(8), "b")
    assert not bm.allocate_slots(b, 8)  # needs 2, 1 free
    assert b.block_table == [] and bm.num_free_blocks == 1
    bm.check_invariants()
    bm.free(a)
    assert bm.num_free_blocks == 4
    bm.check_invariants()


def test_shared_prefix_is_reused_and_ref_counted() -> None:
    bm = BlockManager(num_blocks=16, block_size=4)
    a = seq(list(range(12)) + [99], "a")
    assert admit(bm, a) == 0
    b = seq(list(range(12)) + [7, 8], "b")
    assert admit(bm, b) == 12
    assert b.block_table[:3] == a.block_table[:3]
    assert all(bm.ref_counts[x] == 2 for x in a.block_table[:3])
    bm.free(a)
    assert all(bm.ref_counts[x] == 1 for x in b.block_table[:3])
    bm.free(b)
    assert bm.num_used_blocks == 0 and bm.num_cached_blocks == 3
    bm.check_invariants()


def test_last_prompt_token_is_always_recomputed() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    admit(bm, seq(range(8), "a"))  # two full blocks registered
    b = seq(range(8), "b")  # the identical prompt
    # Only the first block may be reused: the last token must be computed to get logits.
    assert admit(bm, b) == 4


def test_freed_cached_blocks_are_evicted_least_recently_used() -> None:
    bm = BlockManager(num_blocks=4, block_size=2)
    for rid, tokens in (("x", [1, 2, 0]), ("y", [5, 6, 0])):
        s = seq(tokens, rid)
        admit(bm, s)
        bm.free(s)
    assert bm.num_cached_blocks == 2 and bm.num_free_blocks == 4
    # Uncached free blocks are handed out before any cached block is evicted ...
    big = seq([8, 8, 8], "big")
    admit(bm, big)
    assert len(bm.get_computed_blocks(seq([1, 2, 9]))) == 1
    assert len(bm.get_computed_blocks(seq([5, 6, 9]))) == 1
    # ... then the least recently freed cached block ([1, 2]) goes, and [5, 6] survives.
    admit(bm, seq([7], "e"))
    bm.free(big)
    assert admit(bm, seq([5, 6, 1], "d")) == 2
    assert bm.get_computed_blocks(seq([1, 2, 1])) == []
    bm.check_invariants()


def test_hash_collisions_never_reuse_wrong_content() -> None:
    # Every block hashes the same: only exact token and parent identity checks can tell them apart.
    bm = BlockManager(num_blocks=32, block_size=2, hash_fn=lambda parent, tokens: 42)
    a = seq([1, 2, 3, 4, 5], "a")
    admit(bm, a)
    b = seq([9, 9, 3, 4, 5], "b")  # same second block, different first block
    assert admit(bm, b) == 0
    c = seq([1, 2, 7, 7, 5], "c")  # same first block, different second
    assert admit(bm, c) == 2
    assert c.block_table[0] == a.block_table[0] and c.block_table[1] != a.block_table[1]
    bm.check_invariants()


def test_reused_block_parent_must_be_the_same_block_generation() -> None:
    bm = BlockManager(num_blocks=3, block_size=2, hash_fn=lambda parent, tokens: hash(tokens))
    a = seq([1, 2, 3, 4, 0], "a")
    admit(bm, a)
    bm.free(a)
    # Hashes ignore the parent here, so [3, 4] after a different first block hashes like a's.
    b = seq([8, 8, 3, 4, 0], "b")
    assert admit(bm, b) == 0
    bm.check_invariants()


def test_pool_must_have_blocks() -> None:
    with pytest.raises(ValueError, match="num_blocks"):
        BlockManager(num_blocks=0, block_size=16)
