"""The simulator's KV block pool: the engine's BlockManager (engine/policy/block_manager.py), whose
decisions it makes, given block keys instead of tokens to hash. Plain Python, no torch.

Exact keys: each sequence (a KeyedSequence) brings its blocks' keys in Sequence.block_hashes, filled
in advance for every block it can fill (simulator/workload/block_keys.py makes them), and a key is an
identity, not a hash: equal keys hold exactly when the tokens from the sequence's start through the
block's end are equal (and keys of different block positions differ). The pool then hashes no tokens
and checks no contents (its entries hold none); it makes the same decisions the engine's pool makes
hashing the same tokens (a block is reused only after the very block it was filled after, as there).
Only the engine pool's key hooks are overridden: allocation, the lookup's rule, the eviction order
and the free pool stay the engine's.

Private blocks: a sequence may say that its keys from KeyedSequence.first_private_block on are its
own -- no other sequence ever brings them (the simulator's request-unique prompt tails). Only that
sequence can then hit those blocks, and only after a preemption. So their registration is deferred:
they count as registered (a finished sequence's private blocks queue for eviction as registered
blocks do, in the same order, as one run: BlockManager._release_run) but get no entries, unless the
sequence is freed without finishing, when the entries are made (with the same parents and
generations: the sequence held every parent meanwhile) and it registers everything at once from then
on. The pool's decisions are unchanged; the simulator skips an entry made and evicted per block of
every prompt.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence as Seq
from dataclasses import dataclass
from itertools import repeat

from engine.policy.block_manager import BlockManager
from engine.policy.sequence import Sequence


@dataclass(slots=True, eq=False)
class KeyedSequence(Sequence):
    """A Sequence for ExactKeyBlockPool: block_hashes holds its exact block keys, for every block
    it can fill, before it is admitted."""

    # The first block whose key no other sequence brings (None: no such promise). The pool defers
    # registering the blocks from there on; None again once the sequence is preempted.
    first_private_block: int | None = None
    # Its first full prompt blocks whose KV another replica computed and sent (tiered_pool.py).
    arrived_blocks: int = 0


class ExactKeyBlockPool(BlockManager):
    """BlockManager whose sequences are KeyedSequences bringing exact block keys (see the module's
    docstring): the engine pool's decisions, with no hashing and private blocks registered late."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        super().__init__(num_blocks, block_size, enable_prefix_caching)

    # -- the key hooks: the sequence's own keys, no contents to check --------------------------
    def _lookup_keys(self, seq: KeyedSequence, num_full: int) -> Iterator[tuple[int, None]]:
        return zip(self._exact_keys(seq, 0, num_full), repeat(None))

    def _new_keys(self, seq: KeyedSequence, first: int, end: int) -> tuple[Seq[int], Seq[None]]:
        keys = self._exact_keys(seq, first, end)
        return keys, [None] * len(keys)

    def _exact_keys(self, seq: KeyedSequence, first: int, end: int) -> list[int]:
        keys = seq.block_hashes[first:end]
        if len(keys) < end - first:
            raise ValueError(f"request {seq.request_id!r} brings keys for {len(seq.block_hashes)} blocks but "
                             f"fills {end}: with exact keys, fill Sequence.block_hashes for every block it can fill")
        return keys

    # -- deferred registration of private blocks -------------------------------------------------
    def registers_by_count(self, seq: KeyedSequence) -> bool:
        """Whether every block the sequence fills from now on is one of its private ones (those
        from its registered count on): cache_full_blocks then only counts them, so it may count
        many at once (the simulator's decode cohort, steady_decode.py, calls it when it writes the
        sequence out, not per block)."""
        private = seq.first_private_block
        return private is not None and seq.num_registered_blocks >= private

    def _register_blocks(self, seq: KeyedSequence, first: int, end: int) -> None:
        private = seq.first_private_block
        if private is None or end <= private:
            super()._register_blocks(seq, first, end)
            return
        if len(seq.block_hashes) < end:
            self._exact_keys(seq, first, end)  # raises: keys missing
        if first < private:  # the shared blocks before the private ones: registered now
            super()._register_blocks(seq, first, private)
        # The private ones: deferred (cache_full_blocks counts them registered all the same).

    def _release_blocks(self, seq: KeyedSequence, finished: bool) -> None:
        """A finished sequence's deferred private blocks need no entries; a preempted one may find
        them again, so they get them now and it registers at once from then on."""
        private, num_registered, table = seq.first_private_block, seq.num_registered_blocks, seq.block_table
        if private is not None and not finished:
            if num_registered > private:
                super()._register_blocks(seq, private, num_registered)
            seq.first_private_block = None  # it may come back
        elif private is not None and num_registered > private:
            # The table's blocks from `private` up to num_registered: registered, without entries.
            self._release(table[num_registered:])
            self._release_run(table[private:num_registered])
            self._release(table[:private])
            return
        self._release(table)
