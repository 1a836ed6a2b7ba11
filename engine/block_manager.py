"""Paged KV block pool with reference counts and prefix caching. Plain Python, no torch.

A block is *in use* while some sequence holds it (ref count > 0) and *free* otherwise. Free
blocks that still hold a registered prefix stay findable by their hash until they are evicted,
least recently freed first. Invariant after every call: num_free_blocks + num_used_blocks ==
num_blocks.

Prefix identity: a full block is identified by its token ids and by the identity of the block
before it (its block id and that block's allocation generation). The chained hash of those is
only the lookup key; a hit is accepted only when tokens and parent identity match exactly, so a
hash collision can cost a cache miss but never a wrong reuse.

Exact keys (exact_keys=True, the simulator's mode): each sequence brings its blocks' keys in
Sequence.block_hashes, filled in advance for every block it can fill, and a key is an identity,
not a hash: equal keys hold exactly when the tokens from the sequence's start through the block's
end are equal (and keys of different block positions differ). The pool then hashes no tokens and
checks no contents; it makes the same decisions it would make hashing the same tokens (a block
is reused only after the very block it was filled after, as there).

Private blocks (exact keys only): a sequence may say that its keys from Sequence.first_private_block
on are its own -- no other sequence ever brings them (the simulator's request-unique prompt tails).
Only that sequence can then hit those blocks, and only after a preemption. So their registration is
deferred: they count as registered (a finished sequence's private blocks queue for eviction as
registered blocks do, in the same order) but get no entries, unless the sequence is freed without
finishing, when the entries are made (with the same parents and generations: the sequence held
every parent meanwhile) and it registers everything at once from then on. The pool's decisions are
unchanged; the simulator skips an entry made and evicted per block of every prompt.
"""

from __future__ import annotations

from collections import OrderedDict
from itertools import islice, repeat
from collections.abc import Callable, Iterator, Sequence as Seq
from typing import NamedTuple

from engine.sequence import Sequence

NO_PARENT = -1
new_tuple = tuple.__new__  # builds a NamedTuple without its Python-level constructor


def chain_hash(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    """Hash of a full block chained to the hash of the block before it."""
    return hash((parent_hash, token_ids))


class _CachedBlock(NamedTuple):
    """A registered block's identity (a NamedTuple: one is made per block filled)."""

    block_hash: int
    token_ids: tuple[int, ...]
    parent_id: int
    parent_generation: int


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 hash_fn: Callable[[int | None, tuple[int, ...]], int] = chain_hash,
                 exact_keys: bool = False) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"a block pool needs num_blocks > 0 and block_size > 0, "
                             f"got {num_blocks} and {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.hash_fn = hash_fn
        self.exact_keys = exact_keys
        self.ref_counts = [0] * num_blocks
        # Bumped each time a block is handed out anew; lets children check their parent is unchanged.
        self.generations = [0] * num_blocks
        # Free blocks in eviction order (the first is handed out first): freed blocks that hold
        # nothing (last freed first), then the blocks never handed out (by id), then freed blocks
        # still registered in the prefix cache (least recently freed first). The never-used ones
        # are a counter, not entries: a pool of 10^5 blocks costs nothing until it is used.
        self._front: OrderedDict[int, None] = OrderedDict()
        self._next_unused = 0  # blocks next_unused ... num_blocks - 1 were never handed out
        # The back holds a registered block under its id (value None), or a finished sequence's
        # deferred private blocks as one run under a negative key (value: the blocks, the last in
        # the list going first). A run is only ever taken from at its head: nothing can revive its
        # blocks, having no entries.
        self._back: OrderedDict[int, list[int] | None] = OrderedDict()
        self._num_back = 0  # blocks in the back
        self._last_run_key = 0
        # block id -> its registered identity (a _CachedBlock; with exact keys, (key, parent id, parent generation))
        self._cached: dict[int, _CachedBlock | tuple[int, int, int]] = {}
        self._by_hash: dict[int, int] = {}  # hash -> block id

    # -- accounting ---------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._front) + self.num_blocks - self._next_unused + self._num_back

    @property
    def num_used_blocks(self) -> int:
        return self._next_unused - len(self._front) - self._num_back

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- prefix cache -------------------------------------------------------------------------
    def _block_hashes(self, seq: Sequence, num_full_blocks: int) -> list[int]:
        """The sequence's chained block hashes, extended to num_full_blocks."""
        bs = self.block_size
        hashes = seq.block_hashes
        while len(hashes) < num_full_blocks:
            i = len(hashes)
            parent = hashes[-1] if hashes else None
            hashes.append(self.hash_fn(parent, tuple(seq.token_ids[i * bs:(i + 1) * bs])))
        return hashes

    def get_computed_blocks(self, seq: Sequence) -> list[int]:
        """Blocks of the prefix cache that hold this sequence's leading full blocks.

        Takes no references. The last token is never served from cache, so at least one token
        is always computed and there are logits to sample from.
        """
        # Prompt logits need every prompt position computed, so such requests read no cache.
        if not self.enable_prefix_caching or seq.sampling.return_prompt_logits:
            return []
        num_full = (seq.num_tokens - 1) // self.block_size
        if self.exact_keys:
            by_hash, cached, generations = self._by_hash, self._cached, self.generations
            found = []
            parent_id, parent_gen = NO_PARENT, 0
            for key in self._exact_keys(seq, 0, num_full):
                block_id = by_hash.get(key)
                if block_id is None:
                    break
                entry = cached[block_id]
                if entry[1] != parent_id or entry[2] != parent_gen:
                    break  # filled after another copy of this prefix: the hashed pool's rule, kept
                found.append(block_id)
                parent_id, parent_gen = block_id, generations[block_id]
            return found
        hashes = seq.block_hashes
        bs = self.block_size
        found: list[int] = []
        parent_id, parent_gen = NO_PARENT, 0
        for i in range(num_full):
            if i == len(hashes):  # hashed as far as the lookup goes: a miss ends it (registration extends it)
                hashes.append(self.hash_fn(hashes[-1] if hashes else None, tuple(seq.token_ids[i * bs:(i + 1) * bs])))
            block_id = self._by_hash.get(hashes[i])
            if block_id is None:
                break
            entry = self._cached[block_id]
            if (entry.parent_id != parent_id or entry.parent_generation != parent_gen
                    or entry.token_ids != tuple(seq.token_ids[i * bs:(i + 1) * bs])):
                break  # a hash collision: different content under the same hash
            found.append(block_id)
            parent_id, parent_gen = block_id, self.generations[block_id]
        return found

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register the sequence's blocks that are full of computed tokens."""
        if not self.enable_prefix_caching:
            return
        num_full = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        first = seq.num_registered_blocks
        if num_full <= first:
            return
        if self.exact_keys:
            private = seq.first_private_block
            if private is not None and num_full > private:
                if len(seq.block_hashes) < num_full:
                    self._exact_keys(seq, first, num_full)  # raises: keys missing
                if first < private:  # the shared blocks before the private ones: registered now
                    self._register_exact(seq, first, private)
                seq.num_registered_blocks = num_full  # the private ones: deferred (see the module's docstring)
                return
            if num_full - first == 1 and first and len(seq.block_hashes) > first:
                # A decode filled one block: the common case, in straight-line code.
                key, block_id = seq.block_hashes[first], seq.block_table[first]
                if block_id not in self._cached and key not in self._by_hash:
                    parent_id = seq.block_table[first - 1]
                    self._cached[block_id] = (key, parent_id, self.generations[parent_id])
                    self._by_hash[key] = block_id
                seq.num_registered_blocks = num_full
                return
            self._register_exact(seq, first, num_full)
            return
        hashes = seq.block_hashes
        if len(hashes) < first:
            self._block_hashes(seq, first)
        bs = self.block_size
        table, cached, by_hash = seq.block_table, self._cached, self._by_hash
        if num_full - first == 1 and len(hashes) == first and self.hash_fn is chain_hash:
            # A decode filled one block: the common case, in straight-line code.
            tokens = tuple(seq.token_ids[first * bs:num_full * bs])
            block_hash = hash((hashes[-1] if hashes else None, tokens))
            hashes.append(block_hash)
            block_id = table[first]
            if block_id not in cached and block_hash not in by_hash:
                parent_id = table[first - 1] if first else NO_PARENT
                cached[block_id] = new_tuple(_CachedBlock, (block_hash, tokens, parent_id,
                                                            self.generations[parent_id] if first else 0))
                by_hash[block_hash] = block_id
            seq.num_registered_blocks = num_full
            return
        # A prompt's blocks in one pass (zip over one iterator cuts it in block_size runs).
        block_tokens = list(zip(*[iter(seq.token_ids[first * bs:num_full * bs])] * bs))
        # Extend the hash chain over the new blocks, hashing the tuples registration stores anyway.
        parent = hashes[-1] if hashes else None
        if self.hash_fn is chain_hash:  # the default, inlined in this per-block loop
            for tokens in block_tokens[len(hashes) - first:]:
                parent = hash((parent, tokens))
                hashes.append(parent)
        else:
            for tokens in block_tokens[len(hashes) - first:]:
                parent = self.hash_fn(parent, tokens)
                hashes.append(parent)
        block_ids = table[first:num_full]
        block_hashes = hashes[first:num_full]
        parent_ids = table[first - 1:num_full - 1] if first else [NO_PARENT, *table[:num_full - 1]]
        if (cached.keys().isdisjoint(block_ids) and by_hash.keys().isdisjoint(block_hashes)
                and len(set(block_hashes)) == len(block_hashes)):
            # Fresh blocks under fresh hashes (a prompt's own content, a decode's block): all are
            # registered, built in bulk. Same entries as the loop below makes.
            parent_gens = list(map(self.generations.__getitem__, parent_ids))
            if not first:
                parent_gens[0] = 0  # the first block has no parent (NO_PARENT indexed the list's end)
            cached.update(zip(block_ids, map(new_tuple, repeat(_CachedBlock),
                                             zip(block_hashes, block_tokens, parent_ids, parent_gens))))
            by_hash.update(zip(block_hashes, block_ids))
        else:
            generations = self.generations
            for block_id, block_hash, tokens, parent_id in zip(block_ids, block_hashes, block_tokens, parent_ids):
                if block_id in cached:
                    continue  # a prefix hit: already registered
                if block_hash in by_hash:
                    continue  # same content computed twice concurrently, or a collision: keep the first
                parent_gen = generations[parent_id] if parent_id != NO_PARENT else 0
                cached[block_id] = new_tuple(_CachedBlock, (block_hash, tokens, parent_id, parent_gen))
                by_hash[block_hash] = block_id
        seq.num_registered_blocks = num_full

    def _exact_keys(self, seq: Sequence, first: int, end: int) -> list:
        keys = seq.block_hashes[first:end]
        if len(keys) < end - first:
            raise ValueError(f"request {seq.request_id!r} brings keys for {len(seq.block_hashes)} blocks but "
                             f"fills {end}: with exact_keys, fill Sequence.block_hashes for every block it can fill")
        return keys

    def _register_exact(self, seq: Sequence, first: int, num_full: int) -> None:
        """cache_full_blocks with the sequence's exact keys: the same registrations, no hashing.
        An entry is (key, parent id, parent generation), as a hashed entry without its tokens."""
        keys = self._exact_keys(seq, first, num_full)
        table = seq.block_table
        cached, by_hash = self._cached, self._by_hash
        block_ids = table[first:num_full]
        parent_ids = table[first - 1:num_full - 1] if first else [NO_PARENT, *table[:num_full - 1]]
        parent_gens = list(map(self.generations.__getitem__, parent_ids))
        if not first:
            parent_gens[0] = 0  # the first block has no parent (NO_PARENT indexed the list's end)
        if cached.keys().isdisjoint(block_ids) and by_hash.keys().isdisjoint(keys):
            cached.update(zip(block_ids, zip(keys, parent_ids, parent_gens)))  # fresh blocks, fresh keys
            by_hash.update(zip(keys, block_ids))
        else:
            for block_id, entry in zip(block_ids, zip(keys, parent_ids, parent_gens)):
                if block_id in cached or entry[0] in by_hash:
                    continue  # a prefix hit, or the same content computed twice concurrently: keep the first
                cached[block_id] = entry
                by_hash[entry[0]] = block_id
        seq.num_registered_blocks = num_full

    # -- allocation ---------------------------------------------------------------------------
    def allocate_slots(self, seq: Sequence, num_new_tokens: int, computed_blocks: Seq[int] = ()) -> bool:
        """Give the sequence blocks for num_new_tokens more tokens (after any computed_blocks).

        All or nothing: returns False and changes nothing when the pool cannot hold them.
        """
        num_reused = len(computed_blocks)
        if not num_reused and seq.num_computed_tokens + num_new_tokens <= len(seq.block_table) * self.block_size:
            return True  # fits the blocks it holds: the common decode step
        num_new_blocks, num_revived = self._allocation(seq, num_new_tokens, computed_blocks)
        if max(num_new_blocks, 0) + num_revived > self.num_free_blocks:
            return False
        for block_id in computed_blocks:
            if self.ref_counts[block_id] == 0:
                self._remove_free(block_id)
            self.ref_counts[block_id] += 1
            seq.block_table.append(block_id)
        if num_reused:
            seq.num_registered_blocks = len(seq.block_table)
        if num_new_blocks <= 0:
            return True
        generations, ref_counts = self.generations, self.ref_counts
        new_blocks = self._pop_free(num_new_blocks)
        for block_id in new_blocks:  # allocate_block's hand-out, inlined: this runs per block of every prompt
            generations[block_id] += 1
            ref_counts[block_id] = 1
        seq.block_table.extend(new_blocks)
        return True

    def _allocation(self, seq: Sequence, num_new_tokens: int, computed_blocks: Seq[int]) -> tuple[int, int]:
        """(new blocks, revived free blocks) that allocate_slots needs for these tokens."""
        num_reused = len(computed_blocks)
        total_tokens = seq.num_computed_tokens + num_reused * self.block_size + num_new_tokens
        num_new_blocks = self.blocks_needed(total_tokens) - len(seq.block_table) - num_reused
        # Reused blocks that are free leave the free pool too.
        num_revived = sum(1 for b in computed_blocks if self.ref_counts[b] == 0) if num_reused else 0
        return num_new_blocks, num_revived

    def free_blocks_needed(self, seq: Sequence, num_new_tokens: int, computed_blocks: Seq[int] = ()) -> int:
        """Free blocks allocate_slots(seq, num_new_tokens, computed_blocks) would take out of the
        pool; it succeeds exactly when the pool has that many. Changes nothing."""
        if not computed_blocks and seq.num_computed_tokens + num_new_tokens <= len(seq.block_table) * self.block_size:
            return 0
        num_new_blocks, num_revived = self._allocation(seq, num_new_tokens, computed_blocks)
        return max(num_new_blocks, 0) + num_revived

    def next_free_blocks(self, count: int) -> list[int]:
        """The first `count` free blocks in eviction order (those handed out next), left in place."""
        return list(islice(self._free_in_order(), count))

    def _free_in_order(self) -> Iterator[int]:
        """The free blocks in the order they are handed out, read lazily."""
        yield from self._front
        yield from range(self._next_unused, self.num_blocks)
        for key, run in self._back.items():
            if run is None:
                yield key
            else:
                yield from reversed(run)

    def allocate_block(self, seq: Sequence) -> None:
        """Give the sequence one new block, the next free one in eviction order; the caller knows the
        pool has one free. (_pop_free(1) in straight-line code: a decode run calls this per block it
        fills. Only blocks from the back of the pool can hold a registration to evict.)"""
        if self._front:
            block_id = self._front.popitem(last=False)[0]
        elif self._next_unused < self.num_blocks:
            block_id = self._next_unused
            self._next_unused += 1
        else:
            block_id = self._pop_back(1)[0]
        self.generations[block_id] += 1
        self.ref_counts[block_id] = 1
        seq.block_table.append(block_id)

    def _pop_free(self, count: int) -> list[int]:
        """The first `count` free blocks in eviction order, taken out of the free pool."""
        taken: list[int] = []
        front = self._front
        while front and len(taken) < count:
            taken.append(front.popitem(last=False)[0])
        unused = min(count - len(taken), self.num_blocks - self._next_unused)
        if unused > 0:
            taken.extend(range(self._next_unused, self._next_unused + unused))
            self._next_unused += unused
        if len(taken) < count:
            taken.extend(self._pop_back(count - len(taken)))
        return taken

    def _pop_back(self, count: int) -> list[int]:
        """The first `count` blocks of the back, taken out, their registrations evicted."""
        taken: list[int] = []
        back, cached, by_hash = self._back, self._cached, self._by_hash
        self._num_back -= count
        while count:
            key = next(iter(back))
            run = back[key]
            if run is None:  # a registered block
                del back[key]
                taken.append(key)
                entry = cached.pop(key, None)
                if entry is not None and by_hash.get(entry[0]) == key:  # entry[0]: its key
                    del by_hash[entry[0]]
                count -= 1
            elif len(run) <= count:  # a run of deferred private blocks: no registrations
                del back[key]
                taken.extend(reversed(run))
                count -= len(run)
            elif count == 1:  # a decode's block
                taken.append(run.pop())
                count = 0
            else:
                taken.extend(reversed(run[-count:]))
                del run[-count:]
                count = 0
        return taken

    def _remove_free(self, block_id: int) -> None:
        """Take a free block that a prefix hit revives out of the free pool (a registered block:
        it was freed, so it is not among the never-used ones)."""
        if block_id in self._back:
            del self._back[block_id]
            self._num_back -= 1
        else:
            del self._front[block_id]

    def free(self, seq: Sequence, finished: bool = False) -> None:
        """Release all of the sequence's blocks. Tail blocks are queued for eviction first,
        since a shared prefix is more likely to be reused than a request's own tail.
        finished: the sequence never comes back (it finished or was aborted), so its deferred
        private blocks need no entries; a preempted one may find them again, so they get them."""
        table, num_registered = seq.block_table, seq.num_registered_blocks
        private = seq.first_private_block if self.exact_keys else None  # a promise about exact keys only
        deferred = 0  # the table's blocks from `private` up to num_registered: registered, without entries
        if private is not None:
            if not finished:
                if num_registered > private:
                    self._register_exact(seq, private, num_registered)
                seq.first_private_block = None  # it may come back: it registers at once from now on
            elif num_registered > private:
                deferred = num_registered - private
        if deferred:
            self._release(table[num_registered:])
            self._release_deferred(table[private:num_registered])
            self._release(table[:private])
        else:
            self._release(table)
        seq.block_table = []
        seq.num_registered_blocks = 0

    def _release(self, block_ids: list[int]) -> None:
        """Drop a reference to each block, last first; blocks nobody holds become free."""
        ref_counts, front, back, cached = self.ref_counts, self._front, self._back, self._cached
        to_back = len(back)
        for block_id in reversed(block_ids):
            count = ref_counts[block_id] - 1
            ref_counts[block_id] = count
            if count == 0:
                if block_id in cached:
                    back[block_id] = None
                else:
                    # Uncached blocks hold nothing worth keeping: hand them out before cached ones.
                    front[block_id] = None
                    front.move_to_end(block_id, last=False)
            elif count < 0:
                raise AssertionError(f"block {block_id} freed more often than allocated")
        self._num_back += len(back) - to_back

    def _release_deferred(self, block_ids: list[int]) -> None:
        """Free a finished sequence's deferred private blocks, last first, queued for eviction as
        registered blocks (only it ever held them)."""
        ref_counts = self.ref_counts
        for block_id in block_ids:
            if ref_counts[block_id] != 1:
                raise AssertionError(f"private block {block_id} is held {ref_counts[block_id]} times")
            ref_counts[block_id] = 0
        self._last_run_key -= 1
        self._back[self._last_run_key] = block_ids  # the last goes first, as _release would queue them
        self._num_back += len(block_ids)

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Release the sequence's tail blocks beyond those num_tokens tokens need (blocks that
        held only rejected draft tokens). Such blocks lie past every computed token, so they were
        never registered and nobody else holds them: they are handed out first."""
        keep = self.blocks_needed(num_tokens)
        table = seq.block_table
        while len(table) > keep:
            block_id = table.pop()
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] != 0 or block_id in self._cached:
                raise AssertionError(f"trimmed block {block_id} was shared or registered")
            self._front[block_id] = None
            self._front.move_to_end(block_id, last=False)

    def free_order(self) -> list[int]:
        """The free blocks in the order they are handed out."""
        return list(self._free_in_order())

    def check_invariants(self) -> None:
        """Raise AssertionError if the pool's accounting is inconsistent (for tests)."""
        in_use = sum(1 for r in self.ref_counts if r > 0)
        assert all(r >= 0 for r in self.ref_counts), "negative reference count"
        free = self.free_order()
        assert len(set(free)) == len(free), "a block is free twice"
        assert in_use + len(free) == self.num_blocks, "free + in use != total"
        assert all(self.ref_counts[b] == 0 for b in free), "a free block is referenced"
        assert not any(b in self._cached for b in self._front), "a registered block is queued as empty"
        assert self._num_back == len(free) - len(self._front) - (self.num_blocks - self._next_unused), \
            "back count out of sync"
        assert all(self.generations[b] == 0 for b in range(self._next_unused, self.num_blocks)), \
            "a never-used block was handed out"
        for h, b in self._by_hash.items():
            assert self._cached[b][0] == h, "hash index out of sync"
