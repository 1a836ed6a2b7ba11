"""Context parallelism: a step's tokens and every sequence's KV split over ranks by position.

The block manager's block holds world x block_size positions (a virtual block); rank r holds
positions p with (p // block_size) % world == r, in the same block id of its own cache, at
offset p % block_size. So each rank's cache holds 1/world of every sequence, prefix caching and
preemption work on the virtual blocks unchanged, and a rank computes exactly the tokens whose
K/V it stores (no K/V is written across ranks). Rank 0 plans the step (engine/step_plan.py
StepPlan); every rank derives its part here: its tokens, their cache slots, and the attention
metadata of engine/ring_attention.py. The hidden states of the rows whose logits the step needs
are then summed over ranks (each row is one rank's) for rank 0's LM head.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from engine.ring_attention import cp_attention
from engine.step_plan import StepInputs, StepPlan

if TYPE_CHECKING:
    from engine.kv_cache import KVCache
    from engine.tp_group import TPGroup


@dataclass
class CPRank:
    rank: int
    world: int
    block_size: int  # positions per block on each rank (the block manager's block is world x this)
    group: TPGroup

    def owner(self, position: int) -> int:
        return (position // self.block_size) % self.world

    def key_positions(self, rank: int, num_blocks: int, device: torch.device) -> torch.Tensor:
        """Positions held by `rank` in a sequence's first num_blocks virtual blocks, in cache order."""
        b = self.block_size
        offsets = torch.arange(num_blocks * b, device=device)
        return offsets // b * (b * self.world) + rank * b + offsets % b


@dataclass
class GatheredQueries:
    """Decode and verification queries, gathered on every rank."""

    local: torch.Tensor  # this rank's tokens (local rows) among them ...
    index: torch.Tensor  # ... and their rows among the gathered queries
    blocks: torch.Tensor  # [gathered * width] each query's sequence's blocks, padded with block 0
    masks: dict[int | None, torch.Tensor] = field(default_factory=dict)  # window -> [gathered, 1, 1, keys]


@dataclass
class RingChunk:
    """A prefill chunk attended by ring attention."""

    local_begin: int  # this rank's queries of the chunk: local rows local_begin ... local_end - 1
    local_end: int
    key_begin: int  # the chunk's sequence's keys in the travelling buffer (the same on every rank)
    key_end: int
    masks: dict[int | None, list[torch.Tensor]] = field(default_factory=dict)  # window -> per hop [1, 1, n, keys]


@dataclass
class CPAttentionMetadata:
    group: TPGroup
    slot_mapping: torch.Tensor  # this rank's tokens' slots in its cache
    num_gathered: int = 0
    gathered: GatheredQueries | None = None
    ring: list[RingChunk] = field(default_factory=list)
    ring_blocks: torch.Tensor | None = None  # the ring chunks' sequences' blocks, chunk after chunk

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache, layer: int,
                  window: int | None, scale: float) -> torch.Tensor:
        return cp_attention(q, k, v, cache, layer, self, window, scale)


@dataclass
class LocalStep:
    inputs: StepInputs  # this rank's tokens
    rows: list[int]  # their rows in the step's packed batch, in order


def _window_mask(keys: torch.Tensor, queries: torch.Tensor, window: int | None) -> torch.Tensor:
    """keys: [..., K] positions, queries: [..., Q, 1] positions -> [..., Q, K]: causal, within the window."""
    valid = keys <= queries
    if window is not None:
        valid &= keys > queries - window
    return valid


def local_step(plan: StepPlan, cp: CPRank, windows: set[int | None], device: torch.device) -> LocalStep:
    """This rank's share of a step: its tokens (those at positions it holds) and how they attend."""
    b, virtual = cp.block_size, cp.block_size * cp.world
    rows: list[int] = []
    slots: list[int] = []
    gathered_local: list[int] = []
    gathered_index: list[int] = []
    gathered_seqs: list[tuple[int, list[int]]] = []  # (query position, block table) per gathered query
    ring_specs: list[tuple[int, int, int, list[int], list[int]]] = []  # local range, context, table, positions
    begin = 0
    for index, (start, n, table) in enumerate(plan.chunks):
        gathered = n == 1 or index in plan.verifying
        first_local = len(rows)
        mine: list[int] = []
        for i in range(n):
            position = start + i
            if gathered:
                if cp.owner(position) == cp.rank:
                    gathered_local.append(len(rows))
                    gathered_index.append(len(gathered_seqs))
                gathered_seqs.append((position, table))
            if cp.owner(position) == cp.rank:
                mine.append(position)
                rows.append(begin + i)
                slots.append(table[position // virtual] * b + position % b)
        if not gathered:
            ring_specs.append((first_local, len(rows), start + n, table, mine))
        begin += n
    meta = CPAttentionMetadata(cp.group, torch.tensor(slots, dtype=torch.long, device=device))
    if gathered_seqs:
        width = max(-(-(p + 1) // virtual) for p, _ in gathered_seqs)
        blocks = [x for _, table in gathered_seqs for x in table[:width] + [0] * (width - len(table[:width]))]
        keys = cp.key_positions(cp.rank, width, device)
        positions = torch.tensor([p for p, _ in gathered_seqs], device=device)[:, None]
        meta.num_gathered = len(gathered_seqs)
        meta.gathered = GatheredQueries(torch.tensor(gathered_local, dtype=torch.long, device=device),
                                        torch.tensor(gathered_index, dtype=torch.long, device=device),
                                        torch.tensor(blocks, dtype=torch.long, device=device),
                                        {w: _window_mask(keys, positions, w)[:, None, None, :] for w in windows})
    ring_blocks: list[int] = []
    for local_begin, local_end, context, table, mine in ring_specs:
        width = -(-context // virtual)
        chunk = RingChunk(local_begin, local_end, len(ring_blocks) * b, (len(ring_blocks) + width) * b)
        ring_blocks.extend(table[:width])
        queries = torch.tensor(mine, device=device)[:, None]
        # Hop h attends the shard of rank (rank - h) mod world: it has come that far round the ring.
        hop_keys = [cp.key_positions((cp.rank - hop) % cp.world, width, device) for hop in range(cp.world)]
        chunk.masks = {w: [_window_mask(k, queries, w)[None, None] for k in hop_keys] for w in windows}
        meta.ring.append(chunk)
    if ring_specs:
        meta.ring_blocks = torch.tensor(ring_blocks, dtype=torch.long, device=device)
    inputs = StepInputs(torch.tensor([plan.input_ids[r] for r in rows], dtype=torch.long, device=device),
                        torch.tensor([plan.positions[r] for r in rows], dtype=torch.long, device=device), meta)
    return LocalStep(inputs, rows)


def gather_rows(hidden: torch.Tensor, local: LocalStep, wanted: list[int], group: TPGroup) -> torch.Tensor:
    """Hidden states of the packed rows `wanted` on every rank (each row is computed on one rank)."""
    local_row = {row: i for i, row in enumerate(local.rows)}
    mine = [(i, local_row[row]) for i, row in enumerate(wanted) if row in local_row]  # a row may be wanted twice
    out = hidden.new_zeros(len(wanted), hidden.shape[-1])
    if mine:
        at, source = zip(*mine)
        out[list(at)] = hidden[list(source)]
    return group.all_reduce(out)
