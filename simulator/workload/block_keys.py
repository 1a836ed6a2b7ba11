"""Exact prefix-cache keys for the simulator's prompts, so its block pool (ExactKeyBlockPool,
simulator/fleet/block_pool.py) can take them instead of hashing every block's tokens.

A simulated request's tokens are its prompt as simulator/workload/requests.py lays it out -- its shared
segments, each opened by the segment's token, then (when the prompt is longer than its segments) a
tail opened by a token unique to the request, every other position 0 -- followed by its generated
tokens, which are 0 too (replica_runs.py's SAMPLED_TOKEN). So the tokens from the start through block i
are fixed by:
- whether they reach the unique tail: then by the request and i alone;
- otherwise by the segments that open within them (a chain of segment ids) and i.
Keys encode exactly that; equal keys hold exactly when those tokens are equal.
"""

from __future__ import annotations

from simulator.workload.requests import Request

POSITION_BITS = 24  # block positions below 2^24 (2^28 tokens at block size 16)


class BlockKeys:
    """Keys for one simulation's requests; the segment chains they share are numbered here."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._chains: dict[tuple[int, int], int] = {}  # (parent chain, segment id) -> chain number
        self._request_ids: set[int] = set()  # of the requests whose keys were given out

    def first_private(self, request: Request) -> int | None:
        """The first block of the request's unique tail (KeyedSequence.first_private_block): no other
        request brings its keys or those after it. None when it has no unique tail, or when a
        request with its id came before (the same id opens the same tail, which it may hit)."""
        if request.request_id in self._request_ids:
            return None
        self._request_ids.add(request.request_id)
        tail = _unique_tail_start(request)
        # No tail (all segments): its later blocks, decoded zeros, match any such request's.
        return None if tail is None else tail // self.block_size  # the block the tail opens in

    def of(self, request: Request) -> list[int]:
        """Keys of every full block the request can fill (its prompt and all its output)."""
        bs = self.block_size
        num_blocks = (request.prompt_tokens + request.output_tokens) // bs
        if num_blocks >= 1 << POSITION_BITS:
            raise ValueError(f"request {request.request_id} fills {num_blocks} KV blocks; "
                             f"exact block keys number at most {1 << POSITION_BITS}: use a larger block_size")
        # Unique keys are negative, chain keys are not: the two can never meet.
        unique_base = -((request.request_id + 1) << POSITION_BITS)
        tail = _unique_tail_start(request)
        if tail == 0:
            return list(range(unique_base, unique_base - num_blocks, -1))
        segment_tokens, prompt_tokens = request.segment_tokens, request.prompt_tokens
        chains = self._chain_numbers(request.segments)
        keys = []
        for i in range(num_blocks):
            end = (i + 1) * bs  # tokens through block i
            if tail is not None and end > tail:
                keys.extend(range(unique_base - i, unique_base - num_blocks, -1))  # the unique tail from here on
                break
            opened = -(-min(prompt_tokens, end) // segment_tokens)  # segments that open within them
            keys.append((chains[opened - 1] << POSITION_BITS) | i)
        return keys

    def _chain_numbers(self, segments: tuple[int, ...]) -> list[int]:
        """The number of each leading run of segments (segments[:1], segments[:2], ...)."""
        numbers, parent, chains = [], -1, self._chains
        for segment in segments:
            parent = chains.setdefault((parent, segment), len(chains))
            numbers.append(parent)
        return numbers


def _unique_tail_start(request: Request) -> int | None:
    """Where the request's unique tail starts (a token position), or None when its prompt is all
    shared segments."""
    if not request.segments or request.segment_tokens <= 0:
        return 0
    shared_tokens = len(request.segments) * request.segment_tokens
    return shared_tokens if request.prompt_tokens > shared_tokens else None
