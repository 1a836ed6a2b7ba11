"""Paged KV block pool with reference counts and prefix caching. Plain Python, no torch.

A block is *in use* while some sequence holds it (ref count > 0) and *free* otherwise. Free
blocks that still hold a registered prefix stay findable by their hash until they are evicted,
least recently freed first. Invariant after every call: num_free_blocks + num_used_blocks ==
num_blocks.

Prefix identity: a full block is identified by its token ids and by the identity of the block
before it (its block id and that block's allocation generation). The chained hash of those is
only the lookup key; a hit is accepted only when tokens and parent identity match exactly, so a
hash collision can cost a cache miss but never a wrong reuse.

Hooks: where a block's key comes from (_lookup_keys, _new_keys), how a sequence's blocks are
registered and released (_register_blocks, _release_blocks) and what becomes of an evicted entry
(_evicted) are small methods; allocation, the lookup's rule, the eviction order and the free pool
are decided here alone. The simulator's pools (simulator/fleet/block_pool.py, tiered_pool.py)
override only the hooks, so they make this pool's decisions.
"""

from __future__ import annotations

from collections import OrderedDict
from itertools import islice, repeat
from collections.abc import Callable, Iterator, Sequence as Seq
from typing import NamedTuple

from engine.policy.sequence import Sequence

NO_PARENT = -1
new_tuple = tuple.__new__  # builds a NamedTuple without its Python-level constructor


def chain_hash(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    """Hash of a full block chained to the hash of the block before it."""
    return hash((parent_hash, token_ids))


class _CachedBlock(NamedTuple):
    """A registered block's identity (a NamedTuple: one is made per block filled)."""

    block_hash: int  # its key in the hash index
    token_ids: tuple[int, ...] | None  # checked on a hit; None where the key alone is the identity
    parent_id: int
    parent_generation: int


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 hash_fn: Callable[[int | None, tuple[int, ...]], int] = chain_hash) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"a block pool needs num_blocks > 0 and block_size > 0, "
                             f"got {num_blocks} and {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.hash_fn = hash_fn
        self.ref_counts = [0] * num_blocks
        # Bumped each time a block is handed out anew; lets children check their parent is unchanged.
        self.generations = [0] * num_blocks
        # Free blocks in eviction order (the first is handed out first): freed blocks that hold
        # nothing (last freed first), then the blocks never handed out (by id), then freed blocks
        # still registered in the prefix cache (least recently freed first). The never-used ones
        # are a counter, not entries: a pool of 10^5 blocks costs nothing until it is used.
        self._front: OrderedDict[int, None] = OrderedDict()
        self._next_unused = 0  # blocks next_unused ... num_blocks - 1 were never handed out
        # The back holds a registered block under its id (value None), or a run of blocks that hold
        # no entries, queued together among them (_release_run: under a negative key, value: the
        # blocks, the last in the list going first). This pool queues no runs itself.
        self._back: OrderedDict[int, list[int] | None] = OrderedDict()
        self._num_back = 0  # blocks in the back
        self._last_run_key = 0
        self._cached: dict[int, _CachedBlock] = {}  # block id -> its registered identity
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
    def get_computed_blocks(self, seq: Sequence) -> list[int]:
        """Blocks of the prefix cache that hold this sequence's leading full blocks. Takes no
        references. The last token is never served from cache: there are always logits to sample."""
        # Prompt logits need every prompt position computed, so such requests read no cache.
        if not self.enable_prefix_caching or seq.sampling.return_prompt_logits:
            return []
        num_full = (seq.num_tokens - 1) // self.block_size
        by_hash, cached, generations = self._by_hash, self._cached, self.generations
        found: list[int] = []
        parent_id, parent_gen = NO_PARENT, 0
        for key, tokens in self._lookup_keys(seq, num_full):
            block_id = by_hash.get(key)
            if block_id is None:
                break
            entry = cached[block_id]
            # A hit must have been filled after the very block found before it (the same generation
            # of it), with the same tokens: else a hash collision, or another copy of this prefix.
            if entry.parent_id != parent_id or entry.parent_generation != parent_gen or entry.token_ids != tokens:
                break
            found.append(block_id)
            parent_id, parent_gen = block_id, generations[block_id]
        return found

    def _lookup_keys(self, seq: Sequence, num_full: int) -> Iterator[tuple[int, tuple[int, ...] | None]]:
        """(key, tokens) of the sequence's first num_full blocks, for the lookup: their chained
        hashes and token ids, made as the lookup asks for them (it ends at its first miss, so it
        hashes no further; registration extends seq.block_hashes). A hook."""
        hashes, token_ids, bs = seq.block_hashes, seq.token_ids, self.block_size
        for i in range(num_full):
            tokens = tuple(token_ids[i * bs:(i + 1) * bs])
            if i == len(hashes):
                hashes.append(self.hash_fn(hashes[-1] if hashes else None, tokens))
            yield hashes[i], tokens

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register the sequence's blocks that are full of computed tokens."""
        if not self.enable_prefix_caching:
            return
        num_full = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        first = seq.num_registered_blocks
        if num_full > first:
            self._register_blocks(seq, first, num_full)
            seq.num_registered_blocks = num_full

    def _register_blocks(self, seq: Sequence, first: int, end: int) -> None:
        """Register the sequence's blocks first ... end - 1, full of computed tokens. A block gets an
        entry unless it has one (a prefix hit) or its key has one (the same content computed twice
        concurrently, or a hash collision): the first registered keeps it. A hook."""
        keys, contents = self._new_keys(seq, first, end)
        table, cached, by_hash, generations = seq.block_table, self._cached, self._by_hash, self.generations
        if end - first == 1:  # a decode filled one block: the common case, in straight-line code
            key, block_id = keys[0], table[first]
            if block_id not in cached and key not in by_hash:
                parent_id = table[first - 1] if first else NO_PARENT
                cached[block_id] = new_tuple(_CachedBlock, (key, contents[0], parent_id,
                                                            generations[parent_id] if first else 0))
                by_hash[key] = block_id
            return
        block_ids = table[first:end]
        parent_ids = table[first - 1:end - 1] if first else [NO_PARENT, *table[:end - 1]]
        parent_gens = list(map(generations.__getitem__, parent_ids))
        if not first:
            parent_gens[0] = 0  # the first block has no parent (NO_PARENT indexed the list's end)
        entries = map(new_tuple, repeat(_CachedBlock), zip(keys, contents, parent_ids, parent_gens))
        if cached.keys().isdisjoint(block_ids) and by_hash.keys().isdisjoint(keys) and len(set(keys)) == len(keys):
            # Fresh blocks under fresh keys (a prompt's own content): all registered, as the loop would, in bulk.
            cached.update(zip(block_ids, entries))
            by_hash.update(zip(keys, block_ids))
        else:
            for block_id, entry in zip(block_ids, entries):
                if block_id in cached or entry.block_hash in by_hash:
                    continue
                cached[block_id] = entry
                by_hash[entry.block_hash] = block_id

    def _new_keys(self, seq: Sequence, first: int, end: int) -> tuple[Seq[int], Seq[tuple[int, ...] | None]]:
        """(keys, contents) of the sequence's blocks first ... end - 1, for registration: their
        chained hashes (extending seq.block_hashes over them) and token ids. A hook."""
        hashes, bs = seq.block_hashes, self.block_size
        if end - first == 1 and len(hashes) == first and self.hash_fn is chain_hash:
            # A decode filled one block: the common case, in straight-line code.
            tokens = tuple(seq.token_ids[first * bs:end * bs])
            hashes.append(hash((hashes[-1] if hashes else None, tokens)))
            return hashes[first:end], [tokens]
        start = min(first, len(hashes))  # a chain is hashed in order: from its first block not hashed yet
        # The blocks' tokens in one pass (zip over one iterator cuts it in block_size runs).
        block_tokens = list(zip(*[iter(seq.token_ids[start * bs:end * bs])] * bs))
        # Extend the hash chain over the blocks not hashed yet, hashing the tuples registration stores anyway.
        parent = hashes[-1] if hashes else None
        if self.hash_fn is chain_hash:  # the default, inlined in this per-block loop
            for tokens in block_tokens[len(hashes) - start:]:
                parent = hash((parent, tokens))
                hashes.append(parent)
        else:
            for tokens in block_tokens[len(hashes) - start:]:
                parent = self.hash_fn(parent, tokens)
                hashes.append(parent)
        return hashes[first:end], block_tokens[first - start:]

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
                    self._evicted(entry)
                count -= 1
            elif len(run) <= count:  # a run (_release_run): no registrations to evict
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

    def _evicted(self, entry: _CachedBlock) -> None:
        """An entry left the pool (its block handed out anew). A hook: a host tier keeps it."""

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
        finished: the sequence never comes back (it finished or was aborted). This pool frees
        both alike; the hook _release_blocks is told, for a pool that does not."""
        self._release_blocks(seq, finished)
        seq.block_table = []
        seq.num_registered_blocks = 0

    def _release_blocks(self, seq: Sequence, finished: bool) -> None:
        """Drop the sequence's references to every block of its table (free's). A hook."""
        self._release(seq.block_table)

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

    def _release_run(self, block_ids: list[int]) -> None:
        """Free blocks held once each (by the sequence being freed) that hold no entries, queued for
        eviction as if registered, last first, as one entry of the back; taken only from its head
        (nothing revives blocks without entries). For a pool's hooks that defer registrations."""
        ref_counts = self.ref_counts
        for block_id in block_ids:
            if ref_counts[block_id] != 1:
                raise AssertionError(f"block {block_id} freed in a run is held {ref_counts[block_id]} times")
            ref_counts[block_id] = 0
        self._last_run_key -= 1
        self._back[self._last_run_key] = block_ids  # the last goes first, as _release would queue them
        self._num_back += len(block_ids)

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Release the tail blocks beyond those num_tokens need (rejected drafts'): past every computed
        token, never registered, held by nobody else, so they are handed out first."""
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
