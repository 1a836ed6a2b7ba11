"""The simulator's block pool (exact block keys, deferred private blocks) decides as the engine's
pool does hashing tokens (pure Python)."""

from __future__ import annotations

import pytest

from engine.policy.block_manager import BlockManager
from engine.policy.sampling_params import SamplingParams
from engine.policy.sequence import Sequence
from tests.engine.policy.block_helpers import admit
from simulator.fleet.block_pool import ExactKeyBlockPool, KeyedSequence


def seq(tokens, rid="r"):
    return KeyedSequence(rid, list(tokens), SamplingParams(max_tokens=4), 0.0)


def _exact_keys(tokens: list[int], block_size: int, interned: dict) -> list[int]:
    """Exact keys as a caller makes them: one number per distinct token prefix ending at a block end."""
    return [interned.setdefault(tuple(tokens[:(i + 1) * block_size]), len(interned))
            for i in range(len(tokens) // block_size)]


def test_exact_keys_make_the_decisions_token_hashing_makes() -> None:
    """The same random admissions, decodes and frees against a pool that hashes tokens and one that
    takes exact keys: the same blocks handed out, the same prefix hits, the same free pool. Prompts
    repeat and decode the same tokens, so equal blocks are also filled concurrently (where a hit
    must follow the very parent block, as the hashed pool requires)."""
    import random

    rng = random.Random(3)
    block_size, interned = 4, {}
    hashed = BlockManager(num_blocks=40, block_size=block_size)
    keyed = ExactKeyBlockPool(num_blocks=40, block_size=block_size)
    prefixes = [[rng.randrange(1, 5) for _ in range(rng.randrange(3, 14))] for _ in range(4)]
    live: list[tuple[Sequence, Sequence, list[int]]] = []
    hits = 0
    for step in range(600):
        if live and (rng.random() < 0.3 or hashed.num_free_blocks < 6):
            a, b, _ = live.pop(rng.randrange(len(live)))
            hashed.free(a)
            keyed.free(b)
        elif live and rng.random() < 0.5:  # one request decodes a few tokens
            a, b, full = live[rng.randrange(len(live))]
            for _ in range(rng.randrange(1, 6)):
                if len(full) <= a.num_tokens or not hashed.allocate_slots(a, 1):
                    break
                assert keyed.allocate_slots(b, 1)
                for s in (a, b):
                    s.token_ids.append(full[s.num_tokens])
                    s.num_computed_tokens += 1
                hashed.cache_full_blocks(a)
                keyed.cache_full_blocks(b)
        else:  # a request arrives: a shared prefix (or none), its own tokens, and its whole future
            if live and rng.random() < 0.3:  # a prompt that is (part of) another request's text
                other = rng.choice(live)[2]
                prompt = other[:rng.randrange(1, len(other))]
            else:
                prompt = rng.choice(prefixes + [[]]) + [rng.randrange(1, 3) for _ in range(rng.randrange(1, 4))]
            full = prompt + [1] * 12
            a, b = seq(prompt, f"a{step}"), seq(prompt, f"b{step}")
            b.block_hashes = _exact_keys(full, block_size, interned)
            computed_a, computed_b = hashed.get_computed_blocks(a), keyed.get_computed_blocks(b)
            assert computed_a == computed_b
            hits += len(computed_a)
            new = a.num_tokens - len(computed_a) * block_size
            if not hashed.allocate_slots(a, new, computed_a):
                assert not keyed.allocate_slots(b, new, computed_b)
                continue
            assert keyed.allocate_slots(b, new, computed_b)
            for s in (a, b):
                s.num_computed_tokens = s.num_tokens
            hashed.cache_full_blocks(a)
            keyed.cache_full_blocks(b)
            live.append((a, b, full))
        assert [a.block_table for a, _, _ in live] == [b.block_table for _, b, _ in live]
        assert (hashed.num_free_blocks, hashed.num_cached_blocks) == (keyed.num_free_blocks, keyed.num_cached_blocks)
    keyed.check_invariants()
    assert hits > 50  # prefixes were found, and evictions happened along the way
    assert hashed._next_unused == hashed.num_blocks


def _free_order(bm: BlockManager) -> list[int]:
    """The free blocks in the order the pool hands them out."""
    return bm.free_order()


def test_private_blocks_make_the_decisions_registered_blocks_make() -> None:
    """Requests with a unique tail (a token only they have), finishing or preempted and readmitted,
    against a pool that hashes tokens, one with exact keys, and one that is also told where each
    request's private blocks start (their registration deferred): the same blocks handed out, the
    same hits -- a readmitted request's on its own blocks too -- and the same free pool, in order."""
    import random

    rng = random.Random(5)
    block_size, interned = 4, {}
    pools = [BlockManager(num_blocks=48, block_size=block_size),
             ExactKeyBlockPool(num_blocks=48, block_size=block_size),
             ExactKeyBlockPool(num_blocks=48, block_size=block_size)]
    prefixes = [[rng.randrange(1, 5) for _ in range(rng.randrange(3, 14))] for _ in range(3)]
    live: list[tuple[list[Sequence], list[int]]] = []  # running: its copies (one per pool), all its tokens
    preempted: list[tuple[list[Sequence], list[int]]] = []
    own_hits = deferred_freed = 0

    def admit_copies(copies: list[Sequence]) -> bool:
        nonlocal own_hits
        computed = [bm.get_computed_blocks(s) for bm, s in zip(pools, copies)]
        assert computed[0] == computed[1] == computed[2]
        if copies[0].num_preemptions:
            own_hits += len(computed[0])
        new = copies[0].num_tokens - len(computed[0]) * block_size
        admitted = [bm.allocate_slots(s, new, c) for bm, s, c in zip(pools, copies, computed)]
        assert admitted[0] == admitted[1] == admitted[2]
        if admitted[0]:
            for bm, s in zip(pools, copies):
                s.num_computed_tokens = s.num_tokens
                bm.cache_full_blocks(s)
        return admitted[0]

    for step in range(800):
        roll = rng.random()
        if live and (roll < 0.2 or pools[0].num_free_blocks < 8):  # a request finishes or is preempted
            copies, full = live.pop(rng.randrange(len(live)))
            finished = rng.random() < 0.6
            deferred_freed += finished and copies[2].num_registered_blocks > (copies[2].first_private_block or 0)
            for bm, s in zip(pools, copies):
                bm.free(s, finished=finished)
                if not finished:
                    s.num_computed_tokens = 0
                    s.num_preemptions += 1
            if not finished:
                preempted.append((copies, full))
        elif preempted and roll < 0.35:  # a preempted request comes back: it may find its own blocks
            copies, full = preempted.pop(0)
            if admit_copies(copies):
                live.append((copies, full))
            else:
                preempted.insert(0, (copies, full))
        elif live and roll < 0.7:  # one request decodes a few tokens
            copies, full = live[rng.randrange(len(live))]
            for _ in range(rng.randrange(1, 6)):
                if len(full) <= copies[0].num_tokens or not pools[0].allocate_slots(copies[0], 1):
                    break
                assert pools[1].allocate_slots(copies[1], 1) and pools[2].allocate_slots(copies[2], 1)
                for bm, s in zip(pools, copies):
                    s.token_ids.append(full[s.num_tokens])
                    s.num_computed_tokens += 1
                    bm.cache_full_blocks(s)
        else:  # a request arrives: a shared prefix (or none), a token only it has, its own tokens
            prefix = rng.choice(prefixes + [[]])
            prompt = prefix + [100 + step] + [rng.randrange(1, 3) for _ in range(rng.randrange(0, 9))]
            full = prompt + [1] * 12
            copies = [seq(prompt, f"r{step}") for _ in pools]
            keys = _exact_keys(full, block_size, interned)
            copies[1].block_hashes, copies[2].block_hashes = keys, list(keys)
            copies[2].first_private_block = len(prefix) // block_size
            if admit_copies(copies):
                live.append((copies, full))
        for i in (1, 2):
            assert [c[i].block_table for c, _ in live] == [c[0].block_table for c, _ in live]
        assert _free_order(pools[0]) == _free_order(pools[1]) == _free_order(pools[2])
    for bm in pools:
        bm.check_invariants()
    assert own_hits > 10 and deferred_freed > 20  # both paths taken, many times
    assert pools[0]._next_unused == pools[0].num_blocks  # the pool went round: evictions happened


def test_a_hashing_pool_ignores_the_private_block_promise() -> None:
    """first_private_block speaks of exact keys: a pool hashing tokens registers and evicts those
    blocks as any other, so a finished request's blocks leave no stale entries behind."""
    bm = BlockManager(num_blocks=6, block_size=4)
    a = seq(range(10, 22), "a")
    a.first_private_block = 0
    admit(bm, a)
    bm.free(a, finished=True)
    b = seq(range(50, 74), "b")  # takes all six blocks, evicting a's
    assert admit(bm, b) == 0
    bm.check_invariants()
    bm.free(b, finished=True)
    assert admit(bm, seq(range(10, 22), "c")) == 0  # a's blocks were overwritten: no hit


def test_exact_keys_missing_for_a_block_is_a_clear_error() -> None:
    bm = ExactKeyBlockPool(num_blocks=8, block_size=4)
    s = seq(range(9))
    s.block_hashes = [7]  # keys for one block, but the prompt fills two
    assert bm.allocate_slots(s, 9)
    s.num_computed_tokens = 9
    with pytest.raises(ValueError, match="fill Sequence.block_hashes for every block"):
        bm.cache_full_blocks(s)
